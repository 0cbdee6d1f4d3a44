"""A 2-socket AMD EPYC host with 8 PCIe GPUs behind two PCIe switches, 4 GPUs per switch, for the
IOMMU group tests (issue 27.2), built as tests/hgx_host.py builds the HGX host: the lab host's
recorded facts (its chipset, GRUB, initramfs) with the recorded H100's function (BARs, link, reset)
at each GPU address.

With ACS off on the switches' downstream ports the kernel puts each switch's downstream ports and
GPUs in one IOMMU group (4 GPUs per group); with ACS on, each GPU and each port has a group of its own.
With `nic`, node 1's switch has a fifth downstream port with a NIC behind it (the lab host's recorded
virtio-net function at 0000:a4:00.0), in that switch's shared group with ACS off, alone with ACS on.
"""

from __future__ import annotations

import dataclasses

from gpuhost.facts.model import HostFacts, HugePagePool, NumaNode
from gpuhost.facts.pci import CLASS_PCI_BRIDGE, PcieLinkStatus, PciFunction
from tests.helpers import snapshot_facts

GIB_KIB = 1024 * 1024
NODE_CPUS = ("0-63,128-191", "64-127,192-255")  # two 64-core EPYC sockets, SMT siblings n and n+128
GPUS_PER_SWITCH = 4
NIC_ADDRESS = "0000:a4:00.0"  # with nic=True: behind node 1's switch, beside its GPUs


def _bridge(template: PciFunction, address: str, group: int, node: int, parents: tuple[str, ...]) -> PciFunction:
    return dataclasses.replace(
        template,
        address=address,
        vendor=0x1000,  # Broadcom PEX890xx switch ports
        device=0xC030,
        class_code=CLASS_PCI_BRIDGE << 8,
        driver="pcieport",
        iommu_group=group,
        numa_node=node,
        local_cpulist=NODE_CPUS[node],
        link=PcieLinkStatus(32.0, 16, 32.0, 16),
        bars=(),
        resizable_bar_sizes={},
        parents=parents,
        boot_vga=None,
    )


def epyc_switch_host(acs: bool, gpu_driver: str | None = "nvidia", nic: bool = False) -> HostFacts:
    """8 H100 PCIe behind 2 switches (one per socket); `acs` False puts each switch's 4 GPUs in one group.
    `nic`: a NIC behind node 1's switch too, on `gpu_driver` like the GPUs."""
    base = snapshot_facts("lab-gpu-pair-fresh")
    (nic_template,) = (f for f in base.pci if f.vendor_device == "1af4:1000")  # the lab host's virtio-net
    h100_machine = snapshot_facts("h100-guest")
    (h100,) = (f for f in h100_machine.pci if f.vendor_device == "10de:2330")
    port_template = next(f for f in base.pci if f.is_bridge and f.base_class == CLASS_PCI_BRIDGE)
    groups = {g: members for g, members in base.iommu.groups.items() if g != 6}  # the lab's stand-in GPU
    functions: list[PciFunction] = []
    next_group = 100
    for node in (0, 1):
        root_bus = 0x80 * node
        root = f"0000:{root_bus:02x}:01.1"
        upstream = f"0000:{root_bus + 0x10:02x}:00.0"
        functions.append(_bridge(port_template, root, next_group, node, ()))
        functions.append(_bridge(port_template, upstream, next_group + 1, node, (root,)))
        groups[next_group], groups[next_group + 1] = (root,), (upstream,)
        next_group += 2
        shared_group = next_group
        if not acs:
            groups[shared_group] = ()
            next_group += 1
        for slot in range(GPUS_PER_SWITCH):
            downstream = f"0000:{root_bus + 0x11:02x}:{slot:02x}.0"
            gpu_address = f"0000:{root_bus + 0x20 + slot:02x}:00.0"
            port_group = shared_group if not acs else next_group
            gpu_group = shared_group if not acs else next_group + 1
            if acs:
                groups[port_group], groups[gpu_group] = (downstream,), (gpu_address,)
                next_group += 2
            else:
                groups[shared_group] = (*groups[shared_group], downstream, gpu_address)
            functions.append(_bridge(port_template, downstream, port_group, node, (upstream, root)))
            functions.append(
                dataclasses.replace(
                    h100,
                    address=gpu_address,
                    driver=gpu_driver,
                    iommu_group=gpu_group,
                    numa_node=node,
                    local_cpulist=NODE_CPUS[node],
                    boot_vga=False,
                    parents=(downstream, upstream, root),
                )
            )
        if nic and node == 1:
            downstream = f"0000:{root_bus + 0x11:02x}:{GPUS_PER_SWITCH:02x}.0"
            port_group = shared_group if not acs else next_group
            nic_group = shared_group if not acs else next_group + 1
            if acs:
                groups[port_group], groups[nic_group] = (downstream,), (NIC_ADDRESS,)
                next_group += 2
            else:
                groups[shared_group] = (*groups[shared_group], downstream, NIC_ADDRESS)
            functions.append(_bridge(port_template, downstream, port_group, node, (upstream, root)))
            functions.append(
                dataclasses.replace(
                    nic_template,
                    address=NIC_ADDRESS,
                    driver=gpu_driver,
                    iommu_group=nic_group,
                    numa_node=node,
                    local_cpulist=NODE_CPUS[node],
                    parents=(downstream, upstream, root),
                )
            )
    others = tuple(f for f in base.pci if not f.address.startswith("0000:01:") and f.address != port_template.address)
    groups = {g: members for g, members in groups.items() if port_template.address not in members}
    pages = HugePagePool(GIB_KIB, 0, 0)
    numa = tuple(NumaNode(n, 512 * GIB_KIB, NODE_CPUS[n], (HugePagePool(2048, 0, 0), pages)) for n in (0, 1))
    assert base.cpu is not None and base.memory is not None
    return dataclasses.replace(
        base,
        hostname="epyc-8gpu",
        cpu=dataclasses.replace(
            base.cpu,
            vendor="AuthenticAMD",
            model_name="AMD EPYC 9554 64-Core Processor",
            logical_cpus=256,
            flags=(base.cpu.flags - {"vmx"}) | {"svm"},
            physical_address_bits=52,
        ),
        memory=dataclasses.replace(base.memory, total_kib=1024 * GIB_KIB, available_kib=900 * GIB_KIB),
        numa_nodes=numa,
        thread_siblings={cpu: (core, core + 128) for core in range(128) for cpu in (core, core + 128)},
        pci=(*others, *functions),
        iommu=dataclasses.replace(base.iommu, groups=dict(sorted(groups.items()))),
    )
