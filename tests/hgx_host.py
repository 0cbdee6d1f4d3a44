"""An HGX H100 8-GPU host for the NVSwitch tests: the published lspci of a real one
(tests/fixtures/hgx/README.md) on top of recorded facts."""

from __future__ import annotations

import dataclasses

from gpuhost.facts.model import HostFacts, HugePagePool, NumaNode
from gpuhost.facts.parsers import parse_lspci_nn
from gpuhost.facts.pci import CLASS_BRIDGE_OTHER, VENDOR_NVIDIA, PciFunction
from tests.helpers import FIXTURES, function_from_lspci, snapshot_facts

HGX_LSPCI = FIXTURES / "hgx" / "h100-8gpu-lspci-Dnn.txt"
GIB_KIB = 1024 * 1024
NODE_CPUS = ("0-55,112-167", "56-111,168-223")  # two 56-core sockets, SMT siblings n and n+112
FIRST_GROUP = 100


def _node(address: str) -> int:
    """The socket a function hangs off: buses below 0x80 on the first (as on DGX H100)."""
    return 0 if int(address.split(":")[1], 16) < 0x80 else 1


def hgx_h100_host(gpu_driver: str | None = "vfio-pci", nvswitch_driver: str | None = "vfio-pci") -> HostFacts:
    """The published HGX H100: 8 GPUs (the recorded H100's BARs and link), 4 NVSwitches, each NVIDIA
    function in its own IOMMU group, two NUMA nodes of 1 TiB with 900 free 1 GiB pages each; the CPU's
    address width is the recorded H100 machine's Xeon's (46 bits), not the lab's TCG 40."""
    base = snapshot_facts("lab-gpu-pair-fresh")
    h100_machine = snapshot_facts("h100-guest")
    (h100,) = (f for f in h100_machine.pci if f.vendor_device == "10de:2330")
    assert h100_machine.cpu is not None
    functions: list[PciFunction] = []
    groups = {g: members for g, members in base.iommu.groups.items() if g != 6}  # the lab's stand-in GPU
    nvidia = [entry for entry in parse_lspci_nn(HGX_LSPCI.read_text()) if entry.vendor == VENDOR_NVIDIA]
    for index, entry in enumerate(nvidia):
        node = _node(entry.address)
        group = FIRST_GROUP + index
        groups[group] = (entry.address,)
        if entry.class_code == CLASS_BRIDGE_OTHER:
            functions.append(
                function_from_lspci(
                    entry,
                    group,
                    revision=0xA1,
                    driver=nvswitch_driver,
                    numa_node=node,
                    local_cpulist=NODE_CPUS[node],
                    reset_methods=("flr",),
                )
            )
        else:
            functions.append(
                dataclasses.replace(
                    h100,
                    address=entry.address,
                    driver=gpu_driver,
                    iommu_group=group,
                    numa_node=node,
                    local_cpulist=NODE_CPUS[node],
                    boot_vga=False,
                )
            )
    others = tuple(f for f in base.pci if not f.address.startswith("0000:01:"))
    pages = HugePagePool(GIB_KIB, 900, 900)
    numa = tuple(NumaNode(n, 1024 * GIB_KIB, NODE_CPUS[n], (HugePagePool(2048, 0, 0), pages)) for n in (0, 1))
    assert base.cpu is not None and base.memory is not None
    return dataclasses.replace(
        base,
        hostname="hgx-h100",
        cpu=dataclasses.replace(
            base.cpu, logical_cpus=224, physical_address_bits=h100_machine.cpu.physical_address_bits
        ),
        memory=dataclasses.replace(base.memory, total_kib=2048 * GIB_KIB, available_kib=200 * GIB_KIB),
        numa_nodes=numa,
        hugepage_pools=(HugePagePool(2048, 0, 0), HugePagePool(GIB_KIB, 1800, 1800)),
        pci=(*others, *functions),
        iommu=dataclasses.replace(base.iommu, groups=groups),
    )
