"""The guest's PCI layout: root ports, expander buses per NUMA cell, and the functions behind them.

Devices that sit behind a PCIe switch on the host sit behind one in the guest: per host switch a
root port (on the node's expander bus, like the others), a switch upstream port behind it and one
downstream port per device, so devices sharing a host switch share a guest switch and devices on
different switches do not (NCCL reads that from the guest's tree, and from the topology file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuhost.facts.model import TextEnum
from gpuhost.facts.pci import PciFunction
from gpuhost.inventory.spec import VmSpec
from gpuhost.render.devices import Group

PXB_BUS_STEP = 0x20  # guest bus numbers reserved per pcie-expander-bus

MAX_CELLS = 7

FIRST_PORT_SLOT = 0x02  # pcie.0 slot of the first root port (0x00 host bridge, 0x1f ICH9)

LAST_PORT_SLOT = 0x1E


class PortKind(TextEnum):
    """What sits behind a port."""

    GPU = "GPU"  # a passed-through GPU (with its group's other functions)
    SWITCH = "switch"  # a guest PCIe switch mirroring a host's (its upstream port, or the root port above it)
    NVSWITCH = "NVSwitch"  # a passed-through NVSwitch
    DISK = "disk"
    NETWORK = "network"
    VIRTIO_SERIAL = "virtio-serial"
    RNG = "rng"


@dataclass(frozen=True)
class GuestFunction:
    host: PciFunction
    guest_function: int
    multifunction: bool  # function 0 of a device with several functions


class PortModel(TextEnum):
    """libvirt's controller model of a port (the value), each with QEMU's device (`qemu_device`)."""

    ROOT = "pcie-root-port"
    SWITCH_UPSTREAM = "pcie-switch-upstream-port"
    SWITCH_DOWNSTREAM = "pcie-switch-downstream-port"

    @property
    def qemu_device(self) -> str:
        """The <model name=...> libvirt gives each (the QEMU device it starts)."""
        return {
            PortModel.ROOT: "pcie-root-port",
            PortModel.SWITCH_UPSTREAM: "x3130-upstream",
            PortModel.SWITCH_DOWNSTREAM: "xio3130-downstream",
        }[self]


@dataclass(frozen=True)
class RootPort:
    """A PCIe port controller and what sits behind it (one device, maybe multifunction): a root
    port, or (`model`) the upstream or a downstream port of a guest switch."""

    index: int  # controller index = the guest bus its device is addressed on
    chassis: int  # a switch's upstream port has none (0)
    port: int
    bus: int  # controller index of its parent (0: pcie.0, a pcie-expander-bus, a root port or an upstream port)
    slot: int
    kind: PortKind
    label: str  # for the XML's comment: 'GPU 0000:41:00.0', 'disk', 'network', 'rng'
    functions: tuple[GuestFunction, ...] = ()
    model: PortModel = PortModel.ROOT
    host_switch: str | None = None  # a guest switch's ports: the host switch's upstream port they mirror


@dataclass(frozen=True)
class ExpanderBus:
    index: int
    bus_nr: int
    cell: int
    slot: int


@dataclass(frozen=True)
class Cell:
    """A guest NUMA cell bound to one host node."""

    cell_id: int
    host_node: int
    first_vcpu: int
    last_vcpu: int
    memory_kib: int


def pci_layout(
    spec: VmSpec,
    groups: Sequence[Group],
    node_of: Mapping[str, int | None],
    nodes: Sequence[int],
    nvswitches: Sequence[PciFunction] = (),
    switch_of: Mapping[str, str] | None = None,
) -> tuple[tuple[ExpanderBus, ...], tuple[RootPort, ...]]:
    """Controller indices, pcie.0 slots and guest buses, all explicit so the XML is stable.

    `switch_of` maps a device's first function (host address) to the upstream port of the host
    switch it sits behind; such devices go behind that switch's guest mirror. Every port's parent
    has a lower controller index than the port (libvirt's rule)."""
    switch_of = switch_of or {}
    slots = iter(range(FIRST_PORT_SLOT, LAST_PORT_SLOT + 1))
    index = 1
    expanders: list[ExpanderBus] = []
    parent_of: dict[int | None, int] = {}
    if len(nodes) > 1:
        for cell, node in enumerate(nodes):
            expanders.append(ExpanderBus(index=index, bus_nr=PXB_BUS_STEP * (cell + 1), cell=cell, slot=next(slots)))
            parent_of[node] = index
            index += 1
    ports: list[RootPort] = []
    chassis = 1
    upstream_of: dict[str, int] = {}  # host switch -> its guest upstream port's controller index
    for group in groups:
        parent = parent_of.get(node_of[group.card.gpu.address], 0)
        for device in group.devices:
            multifunction = len(device) > 1
            functions = tuple(
                GuestFunction(host=f, guest_function=i, multifunction=multifunction and i == 0)
                for i, f in enumerate(device)
            )
            label = f"{PortKind.GPU.value} {device[0].address}"
            host_switch = switch_of.get(device[0].address)
            if host_switch is None:
                # A pxb's own root ports sit on its bus, slot 0 upwards; pcie.0's take the next free slot.
                slot = sum(1 for p in ports if p.bus == parent) if parent else next(slots)
                ports.append(RootPort(index, chassis, 0x10 + chassis - 1, parent, slot, PortKind.GPU, label, functions))
                index += 1
                chassis += 1
                continue
            if host_switch not in upstream_of:
                slot = sum(1 for p in ports if p.bus == parent) if parent else next(slots)
                switch_label = f"{PortKind.SWITCH.value} {host_switch}"
                ports.append(
                    RootPort(
                        index,
                        chassis,
                        0x10 + chassis - 1,
                        parent,
                        slot,
                        PortKind.SWITCH,
                        switch_label,
                        host_switch=host_switch,
                    )
                )
                ports.append(
                    RootPort(
                        index + 1,
                        0,
                        0,
                        index,
                        0,
                        PortKind.SWITCH,
                        switch_label,
                        model=PortModel.SWITCH_UPSTREAM,
                        host_switch=host_switch,
                    )
                )
                upstream_of[host_switch] = index + 1
                index += 2
                chassis += 1
            upstream = upstream_of[host_switch]
            ports.append(
                RootPort(
                    index,
                    chassis,
                    sum(1 for p in ports if p.bus == upstream),
                    upstream,
                    sum(1 for p in ports if p.bus == upstream),
                    PortKind.GPU,
                    label,
                    functions,
                    model=PortModel.SWITCH_DOWNSTREAM,
                    host_switch=host_switch,
                )
            )
            index += 1
            chassis += 1
    # NVSwitches on pcie.0, each behind its own root port: the guest's Fabric Manager only needs to
    # find them; NVLink traffic never crosses the guest's PCI topology.
    for nvswitch in nvswitches:
        function = GuestFunction(host=nvswitch, guest_function=0, multifunction=False)
        ports.append(
            RootPort(
                index,
                chassis,
                0x10 + chassis - 1,
                0,
                next(slots),
                PortKind.NVSWITCH,
                f"{PortKind.NVSWITCH.value} {nvswitch.address}",
                (function,),
            )
        )
        index += 1
        chassis += 1
    extras = (
        (PortKind.DISK, spec.has_disk),
        (PortKind.NETWORK, spec.network is not None),
        (PortKind.VIRTIO_SERIAL, True),
        (PortKind.RNG, True),
    )
    for kind, wanted in extras:
        if wanted:
            ports.append(RootPort(index, chassis, 0x10 + chassis - 1, 0, next(slots), kind, kind.value))
            index += 1
            chassis += 1
    return tuple(expanders), tuple(ports)


def guest_bus_numbers(expanders: Sequence[ExpanderBus], ports: Sequence[RootPort]) -> dict[int, int]:
    """Port controller index -> the guest bus number of what sits behind it.

    The guest's firmware (SeaBIOS, OVMF) numbers buses depth first in slot order: pcie.0's root
    ports get buses 1, 2, ... and a pcie-expander-bus with bus_nr N gives its root ports N+1, N+2, ...
    A root port with a device behind it takes one bus; one with a guest switch behind it takes one
    for the switch's upstream port, whose downstream ports then take one each, in slot order,
    before the next root port.
    """
    numbers: dict[int, int] = {}
    below: dict[int, list[RootPort]] = {}
    for port in ports:
        below.setdefault(port.bus, []).append(port)

    def number(parent: int, first: int) -> int:
        """Numbers the ports below `parent` from `first`; returns the next free bus number."""
        for port in sorted(below.get(parent, ()), key=lambda port: port.slot):
            numbers[port.index] = first
            first = number(port.index, first + 1)
        return first

    number(0, 1)
    for expander in expanders:
        number(expander.index, expander.bus_nr + 1)
    return numbers
