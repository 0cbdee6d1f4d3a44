"""`gpuhost lab`: an emulated GPU-host fleet on real kernels.

Debian 12 hosts booted through GRUB under QEMU (TCG) whose kernels see an emulated Intel IOMMU
and GPU-like PCI functions, reachable over SSH on 127.0.0.1 only, with an Ansible inventory.

Pure parts (recipes, QEMU argv per topology, inventory, state) are separate from the parts that
run programs (image build, starting and stopping VMs), so the former are tested as data.
"""

from __future__ import annotations
