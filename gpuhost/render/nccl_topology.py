"""An NCCL topology file (`NCCL_TOPO_FILE`) for a guest: which NUMA node each GPU hangs off, with the
GPU's real PCIe link, in the XML format NCCL itself dumps (`NCCL_TOPO_DUMP_FILE`).

Why: a passthrough guest's PCI tree is QEMU's, not the host's. NCCL reads the guest's sysfs and sees
emulated root ports; it cannot see the host link or (on a flat bus) which node a GPU belongs to.
A topology file fills that in. What NCCL does with it (src/graph/xml.cc, topo.cc, NCCL 2.28):

- It looks each of its GPUs up by `busid` (lower case, 0000:bb:dd.f) among the file's <pci> nodes;
  a GPU the file does not list is detected from sysfs as usual, so a wrong bus ID is silently ignored.
  The bus IDs must be the guest's own.
- A <pci> node listed under a <cpu> keeps that parent: the GPU is placed on that NUMA node.
- A PCIe switch is a <pci> node (class 0x060400) whose busid is the switch's upstream port, with the
  GPUs below it as its children: NCCL's own dump takes a device's parent two levels up in sysfs,
  skipping the downstream port. A guest whose switch mirrors the host's (render.layout) gets that
  node at the guest upstream port's bus ID, with the host switch's identity and link; a NIC that
  NCCL finds below the same guest upstream port joins that node (NCCL looks its parent up by busid),
  so NICs need no entry of their own.
- Attributes the file gives are kept; missing ones of a <pci> node (vendor, device, ...) and the
  whole <gpu> element (dev, sm, NVLinks through NVML) are filled in from the guest. So this file has
  no <gpu> element: NCCL's NVML detection of the NVLinks stays in force, and NCCL adds `rank` itself.
- A <cpu> node from a file is not completed from the guest: it needs `arch`, and on x86 `vendor`,
  and on Intel `familyid` and `modelid` (NCCL picks its PCIe and QPI bandwidth model from them).
  `affinity` is the guest's CPUs of that node, in the kernel's cpumap format.

Pure: facts (and a rendered plan) in, a frozen `NcclTopology` out; `topology_xml` serializes it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuhost.facts.model import CpuInfo, HostFacts
from gpuhost.facts.parsers import parse_cpulist
from gpuhost.facts.pci import PciFunction
from gpuhost.render.devices import host_switch_of
from gpuhost.render.domain import DomainPlan
from gpuhost.render.layout import PortModel

TOPOLOGY_XML_VERSION = 1  # NCCL_TOPO_XML_VERSION: NCCL refuses a file of another version
TOPOLOGY_SUFFIX = ".nccl-topo.xml"  # beside the domain XML: train-1.xml -> train-1.nccl-topo.xml


@dataclass(frozen=True)
class TopologyGpu:
    """One GPU function as NCCL's <pci> node: the guest's bus ID, the card's identity and its link."""

    busid: str
    class_code: int | None
    vendor: int | None
    device: int | None
    subsystem_vendor: int | None
    subsystem_device: int | None
    link_speed_gts: float | None  # the link's capability (NCCL reads max_link_speed)
    link_width: int | None
    host_address: str | None  # where it sits on the host; None when built in the guest itself


@dataclass(frozen=True)
class TopologySwitch:
    """A PCIe switch as NCCL's <pci> node: the guest bus ID of its upstream port, the host switch's
    identity and link, and the GPUs below it."""

    busid: str
    class_code: int | None
    vendor: int | None
    device: int | None
    link_speed_gts: float | None
    link_width: int | None
    host_address: str | None  # the host switch's upstream port; None when built in the guest itself
    gpus: tuple[TopologyGpu, ...]


@dataclass(frozen=True)
class TopologyCpu:
    """One NUMA node of the guest, as NCCL's <cpu> node, and the GPUs attached to it: directly (behind
    a root port) or through a PCIe switch."""

    numa_id: int
    affinity: str | None  # the node's guest CPUs as a cpumap ('00000000,0000ffff'); None: unknown
    arch: str
    vendor: str | None
    family: int | None
    model: int | None
    gpus: tuple[TopologyGpu, ...]
    switches: tuple[TopologySwitch, ...] = ()


@dataclass(frozen=True)
class NcclTopology:
    cpus: tuple[TopologyCpu, ...]

    @property
    def gpus(self) -> tuple[TopologyGpu, ...]:
        """Every GPU of the file, those below switches included."""
        return tuple(
            gpu for cpu in self.cpus for gpu in (*cpu.gpus, *(g for switch in cpu.switches for g in switch.gpus))
        )


def cpumap(cpus: Iterable[int]) -> str:
    """CPUs 0-15 -> '0000ffff': the kernel's cpumap form (32-bit hex words, most significant first,
    comma-separated), which NCCL's affinity attribute is parsed as."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    words = max(1, (mask.bit_length() + 31) // 32)
    return ",".join(f"{(mask >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


def topology_for_plan(facts: HostFacts, plan: DomainPlan) -> NcclTopology:
    """The topology of a rendered VM: each GPU function at its guest address, on its guest NUMA cell
    (the cell bound to the GPU's host node), below its guest switch where it has one, with the
    host's link and the host CPU's identity (the domain passes the CPU through: `host-passthrough`)."""
    cell_of_expander = {expander.index: expander.cell for expander in plan.expanders}
    by_index = {port.index: port for port in plan.ports}
    by_cell: dict[int, list[TopologyGpu]] = {}
    switch_gpus: dict[int, list[TopologyGpu]] = {}  # guest upstream port -> its GPUs
    for port in plan.gpu_ports:
        upstream = by_index[port.bus] if port.model is PortModel.SWITCH_DOWNSTREAM else None
        attached = by_index[upstream.bus].bus if upstream is not None else port.bus
        cell = cell_of_expander.get(attached, 0)
        for function in port.functions:
            if not function.host.is_gpu:
                continue  # the card's audio function, or what shares its group
            busid = plan.guest_address(port, function)
            gpu = _gpu(function.host, busid, host_address=function.host.address)
            if upstream is None:
                by_cell.setdefault(cell, []).append(gpu)
            else:
                by_cell.setdefault(cell, [])
                switch_gpus.setdefault(upstream.index, []).append(gpu)
    switches_of: dict[int, list[TopologySwitch]] = {}
    for index, gpus in switch_gpus.items():
        upstream = by_index[index]
        cell = cell_of_expander.get(by_index[upstream.bus].bus, 0)
        # The upstream port sits on its root port's bus, at slot 0.
        busid = f"0000:{plan.guest_buses[upstream.bus]:02x}:00.0"
        host_switch = upstream.host_switch
        assert host_switch is not None  # a guest upstream port always mirrors a host switch
        switches_of.setdefault(cell, []).append(_switch(facts.function(host_switch), busid, host_switch, gpus))
    vcpus_of = _cell_vcpus(plan)
    cpus = tuple(
        _cpu(
            facts.cpu,
            cell,
            cpumap(vcpus_of[cell]) if cell in vcpus_of else None,
            gpus,
            sorted(switches_of.get(cell, ()), key=lambda switch: switch.busid),
        )
        for cell, gpus in sorted(by_cell.items())
    )
    return NcclTopology(cpus)


def topology_for_guest(facts: HostFacts) -> NcclTopology:
    """The topology of the machine the facts were read in, from its own view (a guest's snapshot:
    its PCI addresses, NUMA nodes and PCIe switches are its own). GPUs of unknown node go on node 0
    when the guest has only one node; otherwise they are left out, for NCCL to place from sysfs."""
    cpus_of = {node.node_id: node.cpulist for node in facts.numa_nodes}
    by_node: dict[int, list[TopologyGpu]] = {}
    switch_gpus: dict[tuple[int, str], list[TopologyGpu]] = {}  # (node, upstream port) -> its GPUs
    for function in sorted(facts.pci, key=lambda f: f.address):
        if not function.is_gpu:
            continue
        node = function.numa_node if function.numa_node is not None and function.numa_node >= 0 else None
        if node is None and len(cpus_of) <= 1:
            node = next(iter(cpus_of), 0)
        if node is None:
            continue
        gpu = _gpu(function, function.address.lower(), host_address=None)
        switch = host_switch_of(facts, function)
        if switch is None:
            by_node.setdefault(node, []).append(gpu)
        else:
            by_node.setdefault(node, [])
            switch_gpus.setdefault((node, switch), []).append(gpu)
    switches_of: dict[int, list[TopologySwitch]] = {}
    for (node, switch), gpus in sorted(switch_gpus.items()):
        switches_of.setdefault(node, []).append(_switch(facts.function(switch), switch.lower(), None, gpus))
    cpus = tuple(
        _cpu(facts.cpu, node, _affinity(cpus_of.get(node)), gpus, switches_of.get(node, ()))
        for node, gpus in sorted(by_node.items())
    )
    return NcclTopology(cpus)


def topology_xml(topology: NcclTopology) -> str:
    """The file NCCL_TOPO_FILE names. Every value goes through ElementTree, which escapes it."""
    system = ET.Element("system", version=str(TOPOLOGY_XML_VERSION))
    for cpu in topology.cpus:
        attributes = {"numaid": str(cpu.numa_id)}
        if cpu.affinity is not None:
            attributes["affinity"] = cpu.affinity
        attributes["arch"] = cpu.arch
        if cpu.vendor is not None:
            attributes["vendor"] = cpu.vendor
        if cpu.family is not None:
            attributes["familyid"] = str(cpu.family)
        if cpu.model is not None:
            attributes["modelid"] = str(cpu.model)
        cpu_element = ET.SubElement(system, "cpu", attributes)
        for gpu in cpu.gpus:
            ET.SubElement(cpu_element, "pci", _pci_attributes(gpu))
        for switch in cpu.switches:
            switch_element = ET.SubElement(cpu_element, "pci", _pci_attributes(switch))
            for gpu in switch.gpus:
                ET.SubElement(switch_element, "pci", _pci_attributes(gpu))
    ET.indent(system, space="  ")
    return ET.tostring(system, encoding="unicode") + "\n"


def _pci_attributes(node: TopologyGpu | TopologySwitch) -> dict[str, str]:
    pci = {"busid": node.busid}
    fields: tuple[tuple[str, int | None, int], ...] = (
        ("class", node.class_code, 6),
        ("vendor", node.vendor, 4),
        ("device", node.device, 4),
    )
    if isinstance(node, TopologyGpu):
        fields += (("subsystem_vendor", node.subsystem_vendor, 4), ("subsystem_device", node.subsystem_device, 4))
    for name, value, width in fields:
        if value is not None:
            pci[name] = f"0x{value:0{width}x}"
    if node.link_speed_gts is not None:
        pci["link_speed"] = f"{node.link_speed_gts:.1f} GT/s PCIe"
    if node.link_width is not None:
        pci["link_width"] = str(node.link_width)
    return pci


def topology_path_for(domain_xml_path: str) -> str:
    """train-1.xml -> train-1.nccl-topo.xml, in the same directory."""
    stem = domain_xml_path[:-4] if domain_xml_path.endswith(".xml") else domain_xml_path
    return stem + TOPOLOGY_SUFFIX


def _gpu(function: PciFunction, busid: str, *, host_address: str | None) -> TopologyGpu:
    link = function.link
    return TopologyGpu(
        busid=busid,
        class_code=function.class_code,
        vendor=function.vendor,
        device=function.device,
        subsystem_vendor=function.subsystem_vendor,
        subsystem_device=function.subsystem_device,
        link_speed_gts=link.max_speed_gts if link.max_speed_gts is not None else link.current_speed_gts,
        link_width=link.max_width if link.max_width is not None else link.current_width,
        host_address=host_address,
    )


def _switch(
    upstream: PciFunction | None, busid: str, host_address: str | None, gpus: Sequence[TopologyGpu]
) -> TopologySwitch:
    """A switch node: its upstream port's identity and link (the host's, for a guest's mirror)."""
    link = upstream.link if upstream is not None else None
    return TopologySwitch(
        busid=busid,
        class_code=upstream.class_code if upstream is not None else None,
        vendor=upstream.vendor if upstream is not None else None,
        device=upstream.device if upstream is not None else None,
        link_speed_gts=None if link is None else link.max_speed_gts or link.current_speed_gts,
        link_width=None if link is None else link.max_width or link.current_width,
        host_address=host_address,
        gpus=tuple(gpus),
    )


def _cpu(
    info: CpuInfo | None,
    numa_id: int,
    affinity: str | None,
    gpus: Sequence[TopologyGpu],
    switches: Sequence[TopologySwitch] = (),
) -> TopologyCpu:
    return TopologyCpu(
        numa_id=numa_id,
        affinity=affinity,
        arch="x86_64",  # gpuhost renders q35 (x86-64) domains and gathers x86-64 hosts
        vendor=info.vendor if info is not None else None,
        family=info.family if info is not None else None,
        model=info.model if info is not None else None,
        gpus=tuple(gpus),
        switches=tuple(switches),
    )


def _affinity(cpulist: str | None) -> str | None:
    if not cpulist:
        return None
    return cpumap(parse_cpulist(cpulist))


def _cell_vcpus(plan: DomainPlan) -> Mapping[int, range]:
    if plan.cells:
        return {cell.cell_id: range(cell.first_vcpu, cell.last_vcpu + 1) for cell in plan.cells}
    return {0: range(plan.vcpus)}
