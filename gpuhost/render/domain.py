"""Host facts + a VM spec + the host's policy -> a libvirt domain (pure: no I/O beyond the template).

`plan_domain` decides everything and refuses, naming each conflict, what cannot work on that
host; `render_plan` only fills templates/domain.xml.j2 in. The layout, and why:

- q35 with every passed-through card behind its own pcie-root-port, the card's functions kept
  together as one multifunction device (function 0 carries multifunction='on'): on the root bus a
  GPU would be an integrated endpoint, whose link speed and width the guest driver cannot read.
- The vCPUs are pinned one to one to CPUs local to the GPUs' NUMA node and the guest memory is
  bound to that node. The host's CPUs are shared out among all its VMs at once, in inventory
  order (`allocate_cpus`), so no two VMs get the same CPUs. A VM whose GPUs sit on several
  nodes gets one guest NUMA cell per host node, each cell's vCPUs and memory on its node, and
  its GPUs behind a pcie-expander-bus (pxb-pcie) that carries the cell's number, so the guest
  driver sees each GPU's node.
- 1 GiB huge pages (locked) when the host reserved them; the pages must be free on the nodes the
  memory is bound to. `<locked/>` always comes with a memtune `<hard_limit>` (libvirt's advice:
  without one it must lift the process's memory lock limit altogether): `lock_limit_kib`.
- The 64-bit PCI hole is sized from the cards' 64-bit prefetchable BARs (each root port's window
  aligned to its largest BAR), never below QEMU's 32 GiB default; that only widens QEMU's ACPI
  window, within which the guest kernel keeps BARs. What places them is the guest's firmware, inside
  the guest's physical address width: OVMF (edk2-stable202211 on) takes the top eighth of it as its
  64-bit window (an older OVMF is given the size through fw_cfg opt/ovmf/X-PciMmio64Mb), SeaBIOS
  places them above the guest's memory without looking at the width. A KVM
  guest sees the host's width (maxphysaddr passthrough, libvirt 8.7 on); a TCG guest has QEMU's
  40 bits unless told more (maxphysaddr emulate), and is told the fewest bits whose eighth holds
  the window. A host CPU too narrow for the window is refused.
- No balloon (VFIO pins all guest memory anyway), no emulated display (serial console only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuhost.datafiles import require_data_dir
from gpuhost.errors import InputError
from gpuhost.facts.model import GIB_KIB, VENDOR_NVIDIA, HostFacts, PciFunction
from gpuhost.facts.parsers import parse_cpulist as parse_cpulist  # re-exported: render's CLI and tests read it here
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.numa import declared_vm_pages, pages_by_node, vm_pages
from gpuhost.passthrough import GpuCard, GroupListing, analyse_groups
from gpuhost.problems import Problem, Severity, Stage, listed, register
from gpuhost.selection import (
    VmGpuMiss,
    card_numa_node,
    nvswitch_functions_to_bind,
    nvswitch_group_intruders,
    select_gpus,
    vm_gpus,
)

KIB_PER_MIB = 1024
HOLE64_MIN_BYTES = 32 << 30  # QEMU's q35 default pci-hole64-size
# What libvirt itself allows beyond guest memory for a VFIO domain's locked memory when no limit is
# given (the devices' I/O space and QEMU's own locked allocations).
VFIO_LOCK_ALLOWANCE_KIB = GIB_KIB
MAXPHYSADDR_LIBVIRT = (8, 7)  # the first libvirt with <maxphysaddr>
# The guest's physical address width where nothing sets it: TCG's (and any CPU model but host's).
QEMU_DEFAULT_PHYS_BITS = 40
TCG_MAX_PHYS_BITS = 52  # x86-64's architectural limit, QEMU's TARGET_PHYS_ADDR_SPACE_BITS
# OVMF (edk2-stable202211 on, PlatformDynamicMmioWindow) puts its 64-bit PCI window in the top
# eighth of the guest's address space: a width of B bits holds a window of 2^(B-3). SeaBIOS places
# BARs above the guest's memory whatever the width, and QEMU refuses a hole past the width, so the
# OVMF rule also bounds a SeaBIOS guest's hole. Measured under TCG (40 bits): OVMF 2022.11 put a
# 64 GiB BAR at 896 GiB; SeaBIOS 1.16 put a 1 TiB BAR at 1 TiB, which the guest kernel dropped.
FIRMWARE_WINDOW_SHARE_BITS = 3
# OVMF sizes its 64-bit PCI aperture from the guest's physical address width from edk2-stable202211
# on; older builds keep 32 GiB unless fw_cfg opt/ovmf/X-PciMmio64Mb says otherwise.
OVMF_SIZES_FROM_PHYS_BITS = 202211
# q35's most vCPUs: 288 until QEMU 8.1 raised it to 1024 (QEMU refuses to start the domain beyond it).
Q35_MAX_VCPUS_OLD_QEMU = 288
Q35_MORE_VCPUS_QEMU = (8, 1)
# A TCG domain (domain_type qemu: tests and labs without KVM) runs QEMU's code translator, whose
# buffer is 1 GiB by default (an eighth of the host's memory on smaller hosts). With <locked/>
# QEMU locks its whole address space, the buffer included, within the memtune hard limit, so the
# buffer's size is set (libvirt's <tcg><tb-cache>, 8.0 on) and counted in the limit. Measured on
# the lab: the passthrough proof's 1 GiB domain, limit 2.0 GiB, failed to start ("mlockall: Cannot
# allocate memory") on a 6 GiB host (a 768 MiB buffer) and started on a 4 GiB one (512 MiB).
TCG_TB_CACHE_MIB = 256
PXB_BUS_STEP = 0x20  # guest bus numbers reserved per pcie-expander-bus
MAX_CELLS = 7
FIRST_PORT_SLOT = 0x02  # pcie.0 slot of the first root port (0x00 host bridge, 0x1f ICH9)
LAST_PORT_SLOT = 0x1E
VFIO_PCI = "vfio-pci"
GPU_PURPOSE = "GPU "  # a root port's purpose: 'GPU 0000:41:00.0'
NVSWITCH_PURPOSE = "NVSwitch "

TEMPLATES_ENV = "GPUHOST_TEMPLATES"

# Render's conflicts: each refuses the VM on that host (RenderRefused lists them all).
GPU_NONE = register("render.gpu.none", Stage.RENDER, Severity.ERROR, "the host has no passthrough GPU (gpus: all)")
GPU_UNKNOWN = register(
    "render.gpu.unknown",
    Stage.RENDER,
    Severity.ERROR,
    "a GPU named in gpus is no passthrough GPU alias or address of the host",
)
GPU_KEPT = register("render.gpu.kept", Stage.RENDER, Severity.ERROR, "a GPU named in gpus is one the host keeps")
GPU_DUPLICATE = register(
    "render.gpu.duplicate", Stage.RENDER, Severity.ERROR, "the same GPU is named twice (an alias and its address)"
)
GPU_TAKEN = register(
    "render.gpu.taken", Stage.RENDER, Severity.ERROR, "a function is already a hostdev of another defined domain"
)
GPU_NUMA_UNKNOWN = register(
    "render.gpu.numa_unknown", Stage.RENDER, Severity.ERROR, "a GPU's NUMA node is unknown while the others have one"
)
FUNCTION_NOT_VFIO = register(
    "render.function.not_vfio",
    Stage.RENDER,
    Severity.ERROR,
    "a function to pass is not bound to vfio-pci (gpuhost apply first)",
)
GROUP_UNKNOWN = register(
    "render.group.unknown",
    Stage.RENDER,
    Severity.ERROR,
    "a GPU's IOMMU group listing is empty, unreadable or names unknown devices",
)
GROUP_SPLIT = register(
    "render.group.split",
    Stage.RENDER,
    Severity.ERROR,
    "the GPU's IOMMU group holds another GPU that the VM does not ask for",
)
GROUP_INTRUDER = register(
    "render.group.intruder",
    Stage.RENDER,
    Severity.ERROR,
    "the GPU's IOMMU group holds another device (unless gpuhost_allow_shared_group)",
)
VCPUS_TOO_MANY = register("render.vcpus.too_many", Stage.RENDER, Severity.ERROR, "more vCPUs than the host has CPUs")
VCPUS_QEMU_Q35_LIMIT = register(
    "render.vcpus.qemu_q35_limit",
    Stage.RENDER,
    Severity.ERROR,
    "more than 288 vCPUs, the most q35 takes on the host's QEMU (before 8.1)",
)
VCPUS_UNEVEN = register(
    "render.vcpus.uneven", Stage.RENDER, Severity.ERROR, "the vCPUs do not split evenly over the guest NUMA cells"
)
VCPUS_NODE_TOO_SMALL = register(
    "render.vcpus.node_too_small",
    Stage.RENDER,
    Severity.ERROR,
    "more vCPUs per cell than its NUMA node has usable CPUs",
)
VCPUS_NODE_FULL = register(
    "render.vcpus.node_full",
    Stage.RENDER,
    Severity.ERROR,
    "the VMs declared before it and other defined domains leave too few free CPUs on its NUMA node",
)
NODE_CPUS_UNKNOWN = register(
    "render.node.cpus_unknown", Stage.RENDER, Severity.ERROR, "the CPUs of a GPU's NUMA node are unknown"
)
NUMA_TOO_MANY_NODES = register(
    "render.numa.too_many_nodes",
    Stage.RENDER,
    Severity.ERROR,
    "the GPUs span more NUMA nodes than guest cells are supported",
)
MEMORY_UNEVEN = register(
    "render.memory.uneven", Stage.RENDER, Severity.ERROR, "the memory does not split evenly over the guest NUMA cells"
)
MEMORY_NOT_GIB = register(
    "render.memory.not_gib",
    Stage.RENDER,
    Severity.ERROR,
    "1 GiB huge pages, but the memory is not a whole number of GiB",
)
MEMORY_NODE_TOO_SMALL = register(
    "render.memory.node_too_small", Stage.RENDER, Severity.ERROR, "more memory per cell than its NUMA node has"
)
MEMORY_TOO_MUCH = register("render.memory.too_much", Stage.RENDER, Severity.ERROR, "more memory than the host has")
NVSWITCH_PARTIAL = register(
    "render.nvswitch.partial",
    Stage.RENDER,
    Severity.ERROR,
    "a VM on an NVSwitch host that does not take every NVIDIA GPU (full passthrough: all GPUs and NVSwitches)",
)
LIBVIRT_MAXPHYSADDR = register(
    "render.libvirt.maxphysaddr",
    Stage.RENDER,
    Severity.ERROR,
    "the host's libvirt is older than 8.7, which <maxphysaddr> needs (every KVM guest, a TCG guest with large BARs)",
)
BARS_ADDRESS_WIDTH = register(
    "render.bars.address_width",
    Stage.RENDER,
    Severity.ERROR,
    "the guest's physical address width leaves its firmware a 64-bit PCI window smaller than the GPUs' BARs",
)
HUGEPAGES_NONE_RESERVED = register(
    "render.hugepages.none_reserved",
    Stage.RENDER,
    Severity.ERROR,
    "hugepages: on, but the host reserved no 1 GiB pages",
)
HUGEPAGES_NOT_FREE = register(
    "render.hugepages.not_free",
    Stage.RENDER,
    Severity.ERROR,
    "fewer free 1 GiB pages (on the node) than the memory needs",
)

HUGEPAGES_NODE_SHORT = register(
    "render.hugepages.node_short",
    Stage.RENDER,
    Severity.ERROR,
    "the VMs declared before it (gpuhost_vms) leave its NUMA node too few of the node's 1 GiB pages",
)


def _conflict(code: str, subject: str, message: str, remedy: str = "") -> Problem:
    """One reason the VM cannot be rendered; the message and remedy read as one sentence when joined."""
    return Problem(code, Severity.ERROR, subject, message, remedy)


class RenderRefused(InputError):
    """The VM cannot be given what it asks for on this host; the message lists every conflict."""

    def __init__(self, vm: str, host: str, conflicts: Sequence[Problem]) -> None:
        self.conflicts = tuple(conflicts)
        lines = "\n".join(f"  - {conflict.message} {conflict.remedy}".rstrip() for conflict in conflicts)
        super().__init__(f"refusing to render VM {vm!r} for host {host}:\n{lines}")


@dataclass(frozen=True)
class GuestFunction:
    host: PciFunction
    guest_function: int
    multifunction: bool  # function 0 of a device with several functions


@dataclass(frozen=True)
class RootPort:
    """A pcie-root-port controller and what sits behind it (one device, maybe multifunction)."""

    index: int  # controller index = the guest bus its device is addressed on
    chassis: int
    port: int
    bus: int  # controller index of its parent (0: pcie.0, else a pcie-expander-bus)
    slot: int
    purpose: str  # 'GPU 0000:41:00.0', 'disk', 'network', 'rng'
    functions: tuple[GuestFunction, ...] = ()


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


@dataclass(frozen=True)
class GuestAddressWidth:
    """The guest CPU's physical address width, as <maxphysaddr> says it: the host's (passthrough, KVM)
    or a number of bits (emulate, TCG)."""

    mode: Literal["passthrough", "emulate"]
    bits: int | None = None  # emulate only


@dataclass(frozen=True)
class DomainPlan:
    name: str
    host: str
    domain_type: str
    vcpus: int
    memory_kib: int
    hugepages: bool
    firmware: str
    ovmf_code: str
    ovmf_vars: str
    nvram: str
    kernel: str | None
    initrd: str | None
    cmdline: str | None
    cpu_mode: str
    sockets: int
    cores: int
    threads: int  # per core: 2 where the vCPUs are pinned to whole cores (both SMT threads)
    cells: tuple[Cell, ...]  # guest NUMA cells; empty for a single-node VM
    host_nodes: tuple[int, ...]  # host NUMA nodes the memory is bound to; empty: not bound (unknown)
    hard_limit_kib: int | None  # memtune hard_limit, with <locked/> (hugepages); None: neither
    tcg_tb_cache_mib: int | None  # a TCG domain's translation buffer (<tcg><tb-cache>); None under KVM
    vcpu_pins: tuple[tuple[int, int], ...]  # (vcpu, host cpu)
    emulator_cpus: str | None
    hole64_gib: int
    maxphysaddr: GuestAddressWidth | None  # <maxphysaddr>; None: QEMU's default width holds the BARs
    ovmf_mmio64_mib: int | None  # -fw_cfg opt/ovmf/X-PciMmio64Mb for an OVMF older than 202211; None: not needed
    expanders: tuple[ExpanderBus, ...]
    ports: tuple[RootPort, ...]
    disk_path: str | None
    network: str | None
    serial_log: str
    notes: tuple[str, ...]  # facts worth a comment in the XML
    # The cloud-init NoCloud seed (an ISO on the host) attached as a read-only SATA CD-ROM; only
    # `gpuhost guest up` sets it, once it has created the seed: `gpuhost render` output has none.
    seed_path: str | None = None

    @property
    def passthrough_ports(self) -> tuple[RootPort, ...]:
        """Every root port with a host device behind it: the GPUs, then the NVSwitches."""
        return tuple(port for port in self.ports if port.functions)

    @property
    def gpu_ports(self) -> tuple[RootPort, ...]:
        return tuple(port for port in self.passthrough_ports if port.purpose.startswith(GPU_PURPOSE))

    @property
    def nvswitch_ports(self) -> tuple[RootPort, ...]:
        return tuple(port for port in self.passthrough_ports if port.purpose.startswith(NVSWITCH_PURPOSE))

    def port(self, purpose: str) -> RootPort | None:
        return next((port for port in self.ports if port.purpose == purpose), None)


def format_cpulist(cpus: Sequence[int]) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8'."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = previous = None
    for cpu in [*ordered, None]:
        if cpu is not None and previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = cpu
    return ",".join(ranges)


def plan_domain(
    facts: HostFacts,
    spec: VmSpec,
    policy: HostPolicy,
    *,
    host: str,
    taken: Mapping[str, str] | None = None,
    host_vms: Sequence[VmSpec] | None = None,
    cpus_taken: Mapping[int, str] | None = None,
) -> DomainPlan:
    """Everything the domain XML says, decided; raises RenderRefused naming every conflict.

    `taken` maps host PCI addresses to the other defined domain that has them as a hostdev
    (the guest lifecycle reads it from libvirt); a domain of the same name is this VM redefined.
    `host_vms` are every VM declared for the host (`gpuhost_vms`, in inventory order; `spec`
    among them, else it comes after them; default: `spec` alone) and `cpus_taken` maps host CPUs
    to the defined domain their vCPUs are pinned to (`guest up` reads it from libvirt): the CPUs
    are allocated for them all (`allocate_cpus`), so this VM's pins are the same whichever of
    them is rendered.
    """
    conflicts: list[Problem] = []
    notes: list[str] = []
    cards = _resolve_gpus(facts, spec, policy, conflicts)
    groups = _passthrough_groups(facts, cards, policy, conflicts)
    nvswitches = _nvswitches(facts, cards, policy, conflicts)
    _check_functions(groups, spec, taken or {}, conflicts, extra=nvswitches)

    node_of = {card.gpu.address: card_numa_node(facts, card) for card in cards}
    nodes = _known_nodes(node_of)
    if cards and len(nodes) < len({*node_of.values()}) and nodes:
        unknown = ", ".join(address for address, node in node_of.items() if node is None)
        conflicts.append(
            _conflict(
                GPU_NUMA_UNKNOWN,
                unknown,
                f"the NUMA node of {unknown} is unknown while the other GPUs have one; cannot place the VM.",
            )
        )
    if not nodes:
        notes.append("the host reports no NUMA node for these GPUs: vCPUs and memory are not pinned")

    host_cpus = facts.cpu.logical_cpus if facts.cpu is not None else None
    if host_cpus is not None and spec.vcpus > host_cpus:
        conflicts.append(
            _conflict(VCPUS_TOO_MANY, "vCPUs", f"{spec.vcpus} vCPUs asked, but the host has {host_cpus} CPUs.")
        )
    cells_count = max(1, len(nodes))
    if len(nodes) > MAX_CELLS:
        conflicts.append(
            _conflict(
                NUMA_TOO_MANY_NODES,
                "GPUs",
                f"the GPUs span {len(nodes)} NUMA nodes; at most {MAX_CELLS} are supported.",
            )
        )
    if spec.vcpus % cells_count:
        conflicts.append(
            _conflict(
                VCPUS_UNEVEN,
                "vCPUs",
                f"the GPUs sit on NUMA nodes {format_cpulist(nodes)}: {spec.vcpus} vCPUs cannot be split evenly "
                f"over {cells_count} guest NUMA cells;",
                f"ask for a multiple of {cells_count}.",
            )
        )
    hugepages = _use_hugepages(facts, spec, conflicts)
    granule_mib = 1024 if hugepages else 1
    if spec.memory_mib % (granule_mib * cells_count):
        unit = "GiB (1 GiB huge pages)" if hugepages else "MiB"
        conflicts.append(
            _conflict(
                MEMORY_UNEVEN,
                "memory",
                f"memory {spec.memory_mib} MiB cannot be split evenly over {cells_count} guest NUMA cells "
                f"in whole {unit}.",
            )
        )
    vms = tuple(host_vms or ())
    if spec not in vms:
        vms = (*(vm for vm in vms if vm.name != spec.name), spec)
    _check_q35_vcpus(facts, spec, conflicts)
    cpus = allocate_cpus(facts, policy, vms, cpus_taken=cpus_taken).of(spec)
    conflicts.extend(cpus.conflicts)
    _check_memory(facts, spec, nodes, hugepages, conflicts)
    if hugepages:
        _check_declared_pages(facts, spec, vms, policy, conflicts)
    if conflicts:
        raise RenderRefused(spec.name, host, conflicts)

    cell_memory_kib = spec.memory_mib * KIB_PER_MIB // cells_count
    per_cell = spec.vcpus // cells_count
    cells = (
        tuple(Cell(i, node, i * per_cell, (i + 1) * per_cell - 1, cell_memory_kib) for i, node in enumerate(nodes))
        if len(nodes) > 1
        else ()
    )
    expanders, ports = _layout(spec, groups, node_of, nodes, nvswitches)
    hole64 = _hole64_bytes(ports)
    # Known only once the cards are laid out behind their ports (each port's window aligned to its
    # largest BAR), so refused on its own, after the conflicts above.
    maxphysaddr = _guest_address_width(facts, spec, hole64, conflicts, notes)
    if conflicts:
        raise RenderRefused(spec.name, host, conflicts)
    if maxphysaddr is not None and maxphysaddr.mode == "passthrough" and len(cards) > 1:  # peer-to-peer: two GPUs
        notes.extend(_iommu_width_note(facts))
    ovmf_mmio64_mib = _ovmf_mmio64_mib(facts, spec, hole64, notes)
    tcg_tb_cache_mib = TCG_TB_CACHE_MIB if spec.domain_type == "qemu" else None
    return DomainPlan(
        name=spec.name,
        host=host,
        domain_type=spec.domain_type,
        vcpus=spec.vcpus,
        memory_kib=spec.memory_mib * KIB_PER_MIB,
        hugepages=hugepages,
        hard_limit_kib=lock_limit_kib(spec.memory_mib * KIB_PER_MIB, ports, tcg_tb_cache_mib) if hugepages else None,
        tcg_tb_cache_mib=tcg_tb_cache_mib,
        firmware=spec.firmware,
        ovmf_code=policy.ovmf_code,
        ovmf_vars=policy.ovmf_vars,
        nvram=f"{policy.nvram_dir.rstrip('/')}/{spec.name}_VARS.fd",
        kernel=spec.kernel,
        initrd=spec.initrd,
        cmdline=spec.cmdline,
        cpu_mode="host-passthrough" if spec.domain_type == "kvm" else "maximum",
        sockets=cells_count,
        cores=per_cell // cpus.threads,
        threads=cpus.threads,
        cells=cells,
        host_nodes=tuple(nodes),
        vcpu_pins=cpus.vcpu_pins,
        emulator_cpus=cpus.emulator_cpus,
        hole64_gib=hole64 >> 30,
        maxphysaddr=maxphysaddr,
        ovmf_mmio64_mib=ovmf_mmio64_mib,
        expanders=expanders,
        ports=ports,
        disk_path=f"{policy.images_dir.rstrip('/')}/{spec.name}.qcow2" if spec.has_disk else None,
        network=spec.network,
        serial_log=f"{policy.serial_log_dir.rstrip('/')}/{spec.name}-serial.log",
        notes=tuple(notes),
    )


def _resolve_gpus(facts: HostFacts, spec: VmSpec, policy: HostPolicy, conflicts: list[Problem]) -> tuple[GpuCard, ...]:
    if not spec.gpus:  # gpus: none, asked for explicitly
        return ()
    picked = vm_gpus(facts, policy.gpus, spec.gpus)
    if spec.gpus == ("all",) and not picked.available:
        conflicts.append(_conflict(GPU_NONE, "GPUs", f"the host has no passthrough GPU ({policy.gpus.describe()})."))
    known = ", ".join(f"gpu{i} ({card.gpu.address})" for i, card in enumerate(picked.available)) or "none"
    for name, miss in picked.misses:
        if miss is VmGpuMiss.NO_SUCH_INDEX:
            conflicts.append(
                _conflict(GPU_UNKNOWN, name, f"unknown GPU {name!r}: the host's passthrough GPUs are {known}.")
            )
        elif miss is VmGpuMiss.KEPT:
            conflicts.append(
                _conflict(
                    GPU_KEPT,
                    name,
                    f"GPU {name} is not one of the host's passthrough GPUs ({policy.gpus.describe()}): "
                    f"the host keeps it. Passthrough GPUs: {known}.",
                )
            )
        else:
            conflicts.append(
                _conflict(
                    GPU_UNKNOWN,
                    name,
                    f"unknown GPU {name!r}: the host has no GPU at that address. Passthrough GPUs: {known}.",
                )
            )
    unique = {card.gpu.address: card for card in picked.cards}
    if len(unique) < len(picked.cards):
        conflicts.append(_conflict(GPU_DUPLICATE, "GPUs", "the same GPU is named twice (an alias and its address)."))
    return tuple(sorted(unique.values(), key=lambda card: card.gpu.address))


@dataclass(frozen=True)
class _Group:
    """What one card brings to the guest: its functions, plus what shares its IOMMU group."""

    card: GpuCard
    devices: tuple[tuple[PciFunction, ...], ...]  # by host slot, the card's own slot first


def _passthrough_groups(
    facts: HostFacts, cards: Sequence[GpuCard], policy: HostPolicy, conflicts: list[Problem]
) -> tuple[_Group, ...]:
    groups: list[_Group] = []
    placed: set[str] = set()
    for isolation in analyse_groups(facts, cards):  # judged for this VM's GPUs: a GPU of the group left out splits it
        card = isolation.card
        if isolation.listing is GroupListing.UNKNOWN:
            conflicts.append(
                _conflict(
                    GROUP_UNKNOWN,
                    card.gpu.address,
                    f"GPU {card.gpu.address} is in IOMMU group {card.gpu.iommu_group}, but {isolation.unknown_reason}: "
                    "what else would go to the guest is unknown;",
                    "audit the host as root (gpuhost audit) and check the group's devices.",
                )
            )
        for other in isolation.kept_cards:
            conflicts.append(
                _conflict(
                    GROUP_SPLIT,
                    card.gpu.address,
                    f"GPU {card.gpu.address} shares IOMMU group {card.gpu.iommu_group} with GPU "
                    f"{other.gpu.address}: both go to the same guest or neither does;",
                    "add it to gpus.",
                )
            )
        intruders = isolation.intruders
        if intruders and card.gpu.address not in policy.allow_shared_group:
            conflicts.append(
                _conflict(
                    GROUP_INTRUDER,
                    card.gpu.address,
                    f"GPU {card.gpu.address} shares IOMMU group {card.gpu.iommu_group} with "
                    f"{', '.join(f.describe() for f in intruders)}, which would go to the guest too;",
                    "accept that with gpuhost_allow_shared_group, or move the card.",
                )
            )
        # What vfio-pci owns for this card, laid out by slot: its functions and its group's intruders (other
        # GPUs of the group are laid out with their own card).
        mine = {f.address for f in (*card.functions, *intruders)}
        functions = [f for f in isolation.to_bind if f.address in mine and f.address not in placed]
        placed.update(f.address for f in functions)
        by_slot: dict[str, list[PciFunction]] = {}
        for function in sorted(functions, key=lambda f: (f.slot != card.gpu.slot, f.address)):
            by_slot.setdefault(function.slot, []).append(function)
        groups.append(_Group(card, tuple(tuple(slot) for slot in by_slot.values())))
    return tuple(groups)


def _nvswitches(
    facts: HostFacts, cards: Sequence[GpuCard], policy: HostPolicy, conflicts: list[Problem]
) -> tuple[PciFunction, ...]:
    """An NVSwitch host's VM with GPUs takes every NVIDIA GPU and every NVSwitch (NVIDIA's full
    passthrough model, the one gpuhost supports); anything less is refused: its GPUs' NVLinks would
    need a Fabric Manager outside the guest (the shared NVSwitch model)."""
    selection = select_gpus(facts, policy.gpus)
    if not selection.nvswitches or not any(card.gpu.vendor == VENDOR_NVIDIA for card in cards):
        return ()
    every_gpu = {card.gpu.address for card in (*selection.passthrough_nvidia, *selection.kept_nvidia)}
    missing = sorted(every_gpu - {card.gpu.address for card in cards})
    if missing:
        conflicts.append(
            _conflict(
                NVSWITCH_PARTIAL,
                "NVSwitch",
                f"the host has {len(selection.nvswitches)} NVSwitch(es); a VM there takes every NVIDIA GPU and "
                f"NVSwitch (NVIDIA's full passthrough model), but this one leaves out {listed(missing)}; "
                "splitting the NVLink fabric between VMs needs the shared NVSwitch model, which gpuhost does "
                "not support:",
                "give this VM gpus: all, and declare no other VM with GPUs on this host.",
            )
        )
        return ()
    for intruder in nvswitch_group_intruders(facts, selection):
        conflicts.append(
            _conflict(
                GROUP_INTRUDER,
                intruder.address,
                f"{intruder.describe()} shares IOMMU group {intruder.iommu_group} with an NVSwitch and would go to "
                "the guest too;",
                "move the device to another slot.",
            )
        )
    return nvswitch_functions_to_bind(facts, selection)


def _check_functions(
    groups: Sequence[_Group],
    spec: VmSpec,
    taken: Mapping[str, str],
    conflicts: list[Problem],
    extra: Sequence[PciFunction] = (),
) -> None:
    functions = [f for group in groups for device in group.devices for f in device] + list(extra)
    for function in functions:
        if function.driver != VFIO_PCI:
            bound = f"bound to {function.driver}" if function.driver else "bound to no driver"
            conflicts.append(
                _conflict(
                    FUNCTION_NOT_VFIO,
                    function.address,
                    f"{function.describe()} is {bound}, not vfio-pci:",
                    "run `gpuhost apply` on the host (and reboot) before giving it to a guest.",
                )
            )
        owner = taken.get(function.address)
        if owner is not None and owner != spec.name:
            conflicts.append(
                _conflict(GPU_TAKEN, function.address, f"{function.describe()} is already given to domain {owner!r}.")
            )


def _use_hugepages(facts: HostFacts, spec: VmSpec, conflicts: list[Problem]) -> bool:
    if spec.hugepages == "off":
        return False
    pool = facts.hugepage_pool(GIB_KIB)
    reserved = pool is not None and (pool.total or 0) > 0
    if not reserved:
        if spec.hugepages == "on":
            conflicts.append(
                _conflict(
                    HUGEPAGES_NONE_RESERVED,
                    "huge pages",
                    "hugepages: on, but the host has no 1 GiB huge pages reserved",
                    "(run `gpuhost apply`).",
                )
            )
        return False
    if spec.memory_mib % 1024:
        conflicts.append(
            _conflict(
                MEMORY_NOT_GIB,
                "memory",
                f"memory {spec.memory_mib} MiB is not a whole number of GiB, which 1 GiB huge pages need",
                "(or set hugepages: off).",
            )
        )
    return True


def _known_nodes(node_of: Mapping[str, int | None]) -> list[int]:
    """The host NUMA nodes of a VM's GPUs (by address), those known, in order."""
    return sorted({node for node in node_of.values() if node is not None})


@dataclass(frozen=True)
class VmCpus:
    """One VM's share of its host's CPUs."""

    vm: str
    vcpu_pins: tuple[tuple[int, int], ...]  # (vcpu, host cpu), no other VM's; () where not pinned or not placed
    emulator_cpus: str | None  # on the VM's nodes, never another VM's vCPUs; None: not pinned
    conflicts: tuple[Problem, ...]  # why its vCPUs cannot be pinned (plan_domain refuses the VM with them)
    threads: int = 1  # 2: vCPUs pinned by whole cores (both SMT threads), the guest told so


@dataclass(frozen=True)
class CpuAllocation:
    """Every VM of a host with its CPUs, in inventory order."""

    vms: tuple[VmCpus, ...]

    def of(self, spec: VmSpec) -> VmCpus:
        return next(cpus for cpus in self.vms if cpus.vm == spec.name)


def allocate_cpus(
    facts: HostFacts,
    policy: HostPolicy,
    vms: Sequence[VmSpec],
    *,
    cpus_taken: Mapping[int, str] | None = None,
) -> CpuAllocation:
    """The host's CPUs shared out among all its VMs (`gpuhost_vms`, in inventory order).

    Each VM in turn takes, on each of its GPUs' NUMA nodes, the lowest-numbered CPUs that are not
    in gpuhost_reserved_cpus, not a vCPU of a VM before it and not in `cpus_taken` (host CPU ->
    the defined domain whose vCPU is pinned there; a domain of the VM's own name is the VM
    redefined). Inventory order makes it stable: a VM's pins never depend on which VM is being
    rendered. A VM that cannot be placed (its node is full, a GPU or node is unknown, its vCPUs
    do not split over its nodes) takes no CPUs, so the VMs after it are placed as if it were
    not declared; it is refused when rendered. Emulator threads go on the VM's nodes' CPUs that
    are not reserved and hold no VM's or other domain's vCPU; where none is left, on the VM's
    own vCPUs (never on another VM's). A VM without GPUs, or whose GPUs have no NUMA node, is
    not pinned.

    SMT: a VM takes whole physical cores (every thread free and not reserved; where the siblings
    are unknown each CPU is its own core), in core order, its vCPUs on the cores' threads in turn;
    with an odd vCPU count per node the last core's idle thread is the VM's too, so no two VMs
    ever share a core (issue 27.3). Where every core of its nodes has two threads and its vCPUs
    per node are even, its guest topology says threads=2 (vCPUs 2k and 2k+1 on one core), else
    threads=1. Emulator threads never go on a sibling of any pinned vCPU (which would share its core).
    """
    reserved = frozenset(parse_cpulist(policy.reserved_cpus))
    holders = _CpuHolders(cpus_taken or {})
    pinned: list[tuple[VmCpus, list[int]]] = []  # each VM's pins, with its nodes
    for spec in vms:
        nodes, settled = _vcpu_nodes(facts, spec, policy)
        conflicts: list[Problem] = []
        threads = _threads_per_core(facts, spec, nodes)
        pins, held = _pin_vcpus(facts, spec, nodes, reserved, holders, conflicts)
        if not settled or conflicts:
            pins, held = (), ()  # not placed: its CPUs stay free for the VMs after it
        # The VM holds the whole cores it is pinned to: the idle thread of an odd vCPU's core too.
        holders.vms.update((cpu, spec.name) for cpu in held)
        pinned.append((VmCpus(spec.name, pins, None, tuple(conflicts), threads if pins else 1), nodes))
    # Emulator threads once every VM's vCPUs are known: a VM declared later is no less another VM.
    shares: list[VmCpus] = []
    for share, nodes in pinned:
        if share.vcpu_pins:
            # A domain of the VM's own name is the VM redefined: its old pins are no other vCPUs.
            busy = [*holders.vms, *(cpu for cpu, domain in holders.domains.items() if domain != share.vm)]
            vcpu_cores = {sibling for cpu in busy for sibling in _core_of(facts, cpu)}
            local = (cpu for node_id in nodes for cpu in _node_cpus(facts, node_id) or ())
            spare = [
                cpu
                for cpu in local
                if cpu not in reserved and holders.holder(cpu, share.vm) is None and cpu not in vcpu_cores
            ]
            emulator = format_cpulist(spare or [cpu for _, cpu in share.vcpu_pins])
            share = dataclasses.replace(share, emulator_cpus=emulator)
        shares.append(share)
    return CpuAllocation(tuple(shares))


class _CpuHolders:
    """Who holds each host CPU: the host's VMs placed so far, and other defined domains."""

    def __init__(self, cpus_taken: Mapping[int, str]) -> None:
        self.vms: dict[int, str] = {}  # host CPU -> the VM of this host whose vCPU it is
        self.domains = cpus_taken  # host CPU -> the defined domain whose vCPU is pinned there

    def holder(self, cpu: int, vm: str) -> str | None:
        """Who keeps `cpu` from VM `vm` ('VM train-a', 'defined domain legacy'); None: it is free.
        A defined domain of the VM's own name is the VM redefined."""
        if cpu in self.vms:
            return f"VM {self.vms[cpu]}"
        domain = self.domains.get(cpu)
        return f"defined domain {domain}" if domain is not None and domain != vm else None


def _vcpu_nodes(facts: HostFacts, spec: VmSpec, policy: HostPolicy) -> tuple[list[int], bool]:
    """The host NUMA nodes a VM's vCPUs go on (its GPUs' nodes), and whether they are settled: not
    where a GPU name or node is unknown or the vCPUs do not split over the nodes (plan_domain
    refuses those, and such a VM takes no CPUs from the VMs after it)."""
    conflicts: list[Problem] = []
    cards = _resolve_gpus(facts, spec, policy, conflicts)
    node_of = {card.gpu.address: card_numa_node(facts, card) for card in cards}
    nodes = _known_nodes(node_of)
    unknown_node = len(nodes) < len({*node_of.values()})
    settled = not conflicts and not unknown_node and len(nodes) <= MAX_CELLS and spec.vcpus % max(1, len(nodes)) == 0
    return nodes, settled


def _core_of(facts: HostFacts, cpu: int) -> tuple[int, ...]:
    """The logical CPUs of `cpu`'s core (itself alone where the siblings are unknown)."""
    return facts.thread_siblings.get(cpu, (cpu,))


def _threads_per_core(facts: HostFacts, spec: VmSpec, nodes: Sequence[int]) -> int:
    """2 where the VM can be pinned by whole cores: every CPU of its nodes has exactly one sibling,
    on the same node, and its vCPUs per node are even; else 1."""
    if not nodes or spec.vcpus % len(nodes) or (spec.vcpus // len(nodes)) % 2:
        return 1
    for node_id in nodes:
        node_cpus = _node_cpus(facts, node_id)
        if not node_cpus:
            return 1
        members = set(node_cpus)
        for cpu in node_cpus:
            core = facts.thread_siblings.get(cpu)
            if core is None or len(core) != 2 or not members.issuperset(core):
                return 1
    return 2


def _node_cpus(facts: HostFacts, node_id: int) -> tuple[int, ...] | None:
    node = next((n for n in facts.numa_nodes if n.node_id == node_id), None)
    return None if node is None or node.cpulist is None else parse_cpulist(node.cpulist)


def _pin_vcpus(
    facts: HostFacts,
    spec: VmSpec,
    nodes: Sequence[int],
    reserved: frozenset[int],
    holders: _CpuHolders,
    conflicts: list[Problem],
) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """One VM's vCPUs on free whole cores of its nodes (one guest cell per node), in core order, a
    core's threads to consecutive vCPUs; and every thread of those cores (what the VM holds)."""
    if not nodes:
        return (), ()
    per_cell = spec.vcpus // len(nodes) if spec.vcpus % len(nodes) == 0 else spec.vcpus
    pins: list[tuple[int, int]] = []
    held: list[int] = []
    for cell, node_id in enumerate(nodes):
        node_cpus = _node_cpus(facts, node_id)
        if node_cpus is None:
            conflicts.append(
                _conflict(
                    NODE_CPUS_UNKNOWN,
                    f"NUMA node {node_id}",
                    f"the CPUs of NUMA node {node_id} are unknown; cannot pin vCPUs to them.",
                )
            )
            continue
        # Whole cores only: every thread usable, listed core by core (threads=2 needs two-thread cores).
        usable = [cpu for core in _whole_cores(facts, [c for c in node_cpus if c not in reserved]) for cpu in core]
        cpulist = format_cpulist(node_cpus)
        if per_cell > len(usable):
            kept = f" ({len(reserved)} reserved by gpuhost_reserved_cpus)" if reserved else ""
            conflicts.append(
                _conflict(
                    VCPUS_NODE_TOO_SMALL,
                    f"NUMA node {node_id}",
                    f"{per_cell} vCPUs to pin on NUMA node {node_id} (CPUs {cpulist}{kept}), which has "
                    f"{len(usable)} usable CPUs on whole cores;",
                    "ask for fewer vCPUs.",
                )
            )
            continue
        free_cores = _whole_cores(facts, [cpu for cpu in usable if holders.holder(cpu, spec.name) is None])
        taken: list[int] = []
        for core in free_cores:
            if len(taken) >= per_cell:
                break
            taken.extend(core)
        if per_cell > len(taken):
            conflicts.append(_node_full(spec, node_id, per_cell, usable, holders))
            continue
        pins.extend((cell * per_cell + i, cpu) for i, cpu in enumerate(taken[:per_cell]))
        held.extend(taken)
    return tuple(pins), tuple(held)


def _whole_cores(facts: HostFacts, cpus: Sequence[int]) -> list[tuple[int, ...]]:
    """The cores all of whose threads are among `cpus`, ordered by their first thread."""
    present = set(cpus)
    cores = {_core_of(facts, cpu) for cpu in cpus}
    return sorted((core for core in cores if present.issuperset(core)), key=lambda core: core[0])


def _node_full(spec: VmSpec, node_id: int, wanted: int, usable: Sequence[int], holders: _CpuHolders) -> Problem:
    """The refusal of a VM that would fit its node alone, naming who holds the node's CPUs."""
    counts: dict[str, int] = {}
    for cpu in usable:
        holder = holders.holder(cpu, spec.name)
        if holder is not None:
            counts[holder] = counts.get(holder, 0) + 1
    # This host's VMs first (in the order they took CPUs), then the other domains.
    named = sorted(counts, key=lambda holder: not holder.startswith("VM "))
    held = sum(counts.values())
    return _conflict(
        VCPUS_NODE_FULL,
        f"NUMA node {node_id}",
        f"{wanted} vCPUs to pin on NUMA node {node_id}, which has {len(usable)} usable CPUs: "
        f"{', '.join(f'{holder} ({counts[holder]})' for holder in named)} hold {held} of them, "
        f"{len(usable) - held} are left (a VM takes whole cores: no two VMs share one);",
        "ask for fewer vCPUs, put the VM's GPUs on another node, or remove a VM declared before it "
        "(VMs take CPUs in gpuhost_vms order).",
    )


def _check_memory(
    facts: HostFacts, spec: VmSpec, nodes: Sequence[int], hugepages: bool, conflicts: list[Problem]
) -> None:
    cells = max(1, len(nodes))
    need_kib = spec.memory_mib * KIB_PER_MIB // cells
    if hugepages:
        pages = spec.memory_mib // 1024 // cells
        pool = facts.hugepage_pool(GIB_KIB)
        if not nodes:
            free = pool.free if pool else None
            if free is None or free < pages * cells:
                conflicts.append(
                    _conflict(
                        HUGEPAGES_NOT_FREE,
                        "huge pages",
                        f"{pages * cells} free 1 GiB huge pages needed, the host has {free} free.",
                    )
                )
            return
        for node_id in nodes:
            node = next((n for n in facts.numa_nodes if n.node_id == node_id), None)
            node_pool = node.pool(GIB_KIB) if node is not None else None
            free = node_pool.free if node_pool is not None else None
            if free is None and len(facts.numa_nodes) <= 1 and pool is not None:
                free = pool.free
            if free is None or free < pages:
                total = node_pool.total if node_pool is not None else None
                conflicts.append(
                    _conflict(
                        HUGEPAGES_NOT_FREE,
                        f"NUMA node {node_id}",
                        f"{pages} free 1 GiB huge pages needed on NUMA node {node_id}, which has {free} free "
                        f"(of {total});",
                        "free some, reserve more, or ask for less memory.",
                    )
                )
        return
    for node_id in nodes:
        node = next((n for n in facts.numa_nodes if n.node_id == node_id), None)
        total = node.mem_total_kib if node is not None else None
        if total is not None and need_kib > total:
            conflicts.append(
                _conflict(
                    MEMORY_NODE_TOO_SMALL,
                    f"NUMA node {node_id}",
                    f"{need_kib // 1024} MiB of memory to bind to NUMA node {node_id}, which has {total // 1024} MiB.",
                )
            )
    host_kib = facts.memory.total_kib if facts.memory is not None else None
    if not nodes and host_kib is not None and need_kib > host_kib:
        conflicts.append(
            _conflict(
                MEMORY_TOO_MUCH,
                "memory",
                f"{spec.memory_mib} MiB of memory asked, the host has {host_kib // 1024} MiB.",
            )
        )


def _check_declared_pages(
    facts: HostFacts, spec: VmSpec, vms: Sequence[VmSpec], policy: HostPolicy, conflicts: list[Problem]
) -> None:
    """The VMs declared before this one take their pages from their nodes first (inventory order,
    as for CPUs): what is left of the node's reserved pages must hold this VM's share."""
    mine = vm_pages(facts, policy.gpus, spec)
    if mine is None:
        return
    index = next((i for i, vm in enumerate(vms) if vm.name == spec.name), len(vms))
    before = declared_vm_pages(facts, policy.gpus, vms[:index])
    taken = pages_by_node(before)
    for node_id, pages in mine.per_node:
        node = next((n for n in facts.numa_nodes if n.node_id == node_id), None)
        pool = node.pool(GIB_KIB) if node is not None else None
        if pool is None and len(facts.numa_nodes) <= 1:
            pool = facts.hugepage_pool(GIB_KIB)
        reserved = pool.total if pool is not None else None
        if reserved is None or not taken.get(node_id) or taken[node_id] + pages <= reserved:
            continue
        holders = ", ".join(vm.vm for vm in before if node_id in dict(vm.per_node))
        conflicts.append(
            _conflict(
                HUGEPAGES_NODE_SHORT,
                f"NUMA node {node_id}",
                f"{pages} 1 GiB huge pages needed on NUMA node {node_id}, which has {reserved} reserved; the VMs "
                f"declared before it ({holders}) take {taken[node_id]} of them;",
                "reserve more on that node (gpuhost_hugepages, then gpuhost apply), give the VMs less memory, "
                "or set hugepages: off for one of them.",
            )
        )


def _layout(
    spec: VmSpec,
    groups: Sequence[_Group],
    node_of: Mapping[str, int | None],
    nodes: Sequence[int],
    nvswitches: Sequence[PciFunction] = (),
) -> tuple[tuple[ExpanderBus, ...], tuple[RootPort, ...]]:
    """Controller indices, pcie.0 slots and guest buses, all explicit so the XML is stable."""
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
    for group in groups:
        parent = parent_of.get(node_of[group.card.gpu.address], 0)
        for device in group.devices:
            # A pxb's own root ports sit on its bus, slot 0 upwards; pcie.0's take the next free slot.
            slot = sum(1 for p in ports if p.bus == parent) if parent else next(slots)
            multifunction = len(device) > 1
            functions = tuple(
                GuestFunction(host=f, guest_function=i, multifunction=multifunction and i == 0)
                for i, f in enumerate(device)
            )
            ports.append(
                RootPort(index, chassis, 0x10 + chassis - 1, parent, slot, GPU_PURPOSE + device[0].address, functions)
            )
            index += 1
            chassis += 1
    # NVSwitches on pcie.0, each behind its own root port: the guest's Fabric Manager only needs to
    # find them; NVLink traffic never crosses the guest's PCI topology.
    for nvswitch in nvswitches:
        function = GuestFunction(host=nvswitch, guest_function=0, multifunction=False)
        ports.append(
            RootPort(
                index, chassis, 0x10 + chassis - 1, 0, next(slots), NVSWITCH_PURPOSE + nvswitch.address, (function,)
            )
        )
        index += 1
        chassis += 1
    extras = (("disk", spec.has_disk), ("network", spec.network is not None), ("virtio-serial", True), ("rng", True))
    for purpose, wanted in extras:
        if wanted:
            ports.append(RootPort(index, chassis, 0x10 + chassis - 1, 0, next(slots), purpose))
            index += 1
            chassis += 1
    return tuple(expanders), tuple(ports)


def _guest_address_width(
    facts: HostFacts, spec: VmSpec, hole64: int, conflicts: list[Problem], notes: list[str]
) -> GuestAddressWidth | None:
    """What <maxphysaddr> the guest needs for its firmware's 64-bit window to hold `hole64`.

    KVM: the host's width (passthrough), refused where the host CPU's own width is too narrow.
    TCG: QEMU's 40 bits are left alone where they suffice, else the fewest bits that do (emulate).
    Either needs libvirt 8.7; an older one is refused, naming it."""
    needed = max(QEMU_DEFAULT_PHYS_BITS, (hole64 - 1).bit_length() + FIRMWARE_WINDOW_SHARE_BITS)
    window = f"a {_gib(hole64)} 64-bit PCI window (the BARs of the passed functions)"
    if spec.domain_type == "kvm":
        cpu_bits = facts.cpu.physical_address_bits if facts.cpu is not None else None
        if cpu_bits is not None and cpu_bits < needed:
            conflicts.append(
                _conflict(
                    BARS_ADDRESS_WIDTH,
                    "BARs",
                    f"the VM needs {window}, but the host's CPU has {cpu_bits} physical address bits, which leave the "
                    f"guest's firmware a window of {_gib(1 << (cpu_bits - FIRMWARE_WINDOW_SHARE_BITS))}: the BARs that "
                    "do not fit are not assigned;",
                    f"give the VM fewer GPUs (or GPUs with smaller BARs), or run it on a host whose CPU has at least "
                    f"{needed} physical address bits.",
                )
            )
        width = GuestAddressWidth("passthrough")
    elif needed <= QEMU_DEFAULT_PHYS_BITS:
        return None
    elif needed > TCG_MAX_PHYS_BITS:
        conflicts.append(
            _conflict(
                BARS_ADDRESS_WIDTH,
                "BARs",
                f"the VM needs {window}, which would take {needed} physical address bits, more than the "
                f"{TCG_MAX_PHYS_BITS} QEMU emulates;",
                "give the VM fewer GPUs (or GPUs with smaller BARs).",
            )
        )
        return None
    else:
        notes.append(
            f"the guest CPU gets {needed} physical address bits (QEMU's default {QEMU_DEFAULT_PHYS_BITS} leave the "
            f"firmware a {_gib(1 << (QEMU_DEFAULT_PHYS_BITS - FIRMWARE_WINDOW_SHARE_BITS))} window; the VM needs "
            f"{window})"
        )
        width = GuestAddressWidth("emulate", needed)
    _check_maxphysaddr_libvirt(facts, conflicts, notes)
    return width


def _gib(size: int) -> str:
    return f"{size >> 30} GiB" if size < 1 << 40 or size % (1 << 40) else f"{size >> 40} TiB"


def _check_maxphysaddr_libvirt(facts: HostFacts, conflicts: list[Problem], notes: list[str]) -> None:
    """<maxphysaddr> is libvirt 8.7's: an older one is refused, naming it (`virsh define` would fail).
    Unknown (no package database, libvirt not installed): emitted, and said."""
    software = facts.virtualization
    release = software.libvirt_release if software is not None else None
    if release is None:
        notes.append("the libvirt version of the host is unknown: maxphysaddr needs libvirt 8.7 or later")
        return
    if release < MAXPHYSADDR_LIBVIRT:
        assert software is not None
        conflicts.append(
            _conflict(
                LIBVIRT_MAXPHYSADDR,
                "libvirt",
                f"the host's libvirt is {software.libvirt} (libvirt-daemon), older than 8.7: it does not know "
                "<maxphysaddr>, through which the guest gets the physical address width its firmware needs for "
                "the GPUs' BARs, so `virsh define` would fail;",
                "upgrade libvirt to 8.7 or later (Debian 12 ships 9.0, Ubuntu 24.04 10.0) and audit again.",
            )
        )


def _iommu_width_note(facts: HostFacts) -> list[str]:
    """The audit's gpu.p2p.iommu_width, said where it matters: in the XML that passes the CPU's width on."""
    cpu_bits = facts.cpu.physical_address_bits if facts.cpu is not None else None
    iommu_bits = facts.kernel_log.iommu_address_bits if facts.kernel_log is not None else None
    if cpu_bits is None or iommu_bits is None or iommu_bits >= cpu_bits:
        return []
    return [
        f"the IOMMU of the host remaps {iommu_bits}-bit addresses, its CPU has {cpu_bits} bits: BARs placed above "
        f"2^{iommu_bits} by OVMF cannot be mapped for peer-to-peer between the passed devices"
    ]


def _check_q35_vcpus(facts: HostFacts, spec: VmSpec, conflicts: list[Problem]) -> None:
    """More than 288 vCPUs on a QEMU before 8.1: q35 refuses them when the domain starts."""
    software = facts.virtualization
    release = software.qemu_release if software is not None else None
    if spec.vcpus <= Q35_MAX_VCPUS_OLD_QEMU or release is None or release >= Q35_MORE_VCPUS_QEMU:
        return
    assert software is not None
    conflicts.append(
        _conflict(
            VCPUS_QEMU_Q35_LIMIT,
            "vCPUs",
            f"{spec.vcpus} vCPUs asked, but the host's QEMU is {software.qemu}, whose q35 machine takes at most "
            f"{Q35_MAX_VCPUS_OLD_QEMU};",
            f"ask for at most {Q35_MAX_VCPUS_OLD_QEMU} vCPUs, or upgrade QEMU to 8.1 or later.",
        )
    )


def _ovmf_mmio64_mib(facts: HostFacts, spec: VmSpec, hole64: int, notes: list[str]) -> int | None:
    """The 64-bit aperture to hand an OVMF older than edk2-stable202211 through fw_cfg (it keeps 32 GiB
    otherwise, and a larger BAR is not assigned); None where OVMF sizes it itself or is not used."""
    if spec.firmware != "uefi":
        return None
    software = facts.virtualization
    release = software.ovmf_release if software is not None else None
    if release is None:
        notes.append(
            "the OVMF version of the host is unknown: an OVMF older than edk2-stable202211 keeps a 32 GiB "
            "64-bit PCI window whatever the address width of the guest"
        )
        return None
    if release >= OVMF_SIZES_FROM_PHYS_BITS:
        return None
    assert software is not None
    notes.append(
        f"the OVMF of the host ({software.ovmf}) predates edk2-stable202211 and keeps a 32 GiB 64-bit PCI window: "
        f"it is set to {hole64 >> 20} MiB through fw_cfg opt/ovmf/X-PciMmio64Mb"
    )
    return hole64 >> 20


def lock_limit_kib(memory_kib: int, ports: Sequence[RootPort], tcg_tb_cache_mib: int | None = None) -> int:
    """The memtune hard_limit of a domain with locked memory: the guest memory, every BAR of every
    passed-through function (VFIO maps them into the process; libvirt's docs: the limit must hold
    the guest's memory and what the process itself uses), a TCG domain's translation buffer and
    libvirt's own VFIO allowance. A limit too low keeps the domain from starting; one this size
    only bounds it."""
    bars = sum(bar.size for port in ports for f in port.functions for bar in f.host.bars)
    translator = (tcg_tb_cache_mib or 0) * KIB_PER_MIB
    return memory_kib + -(-bars // 1024) + translator + VFIO_LOCK_ALLOWANCE_KIB


def _hole64_bytes(ports: Sequence[RootPort]) -> int:
    """64-bit prefetchable BARs per root port, each window aligned to its largest BAR, summed and
    rounded up to a power of two; at least QEMU's default."""
    total = 0
    for port in ports:
        sizes = sorted(
            (bar.size for f in port.functions for bar in f.host.bars if bar.is_64bit and bar.is_prefetchable),
            reverse=True,
        )
        if sizes:
            total += -(-sum(sizes) // sizes[0]) * sizes[0]
    hole = HOLE64_MIN_BYTES
    while hole < total:
        hole <<= 1
    return hole


def templates_dir() -> Path:
    """templates/ of the checkout, or of an install (<prefix>/share/gpuhost/templates)."""
    return require_data_dir("templates", "domain.xml.j2", env_var=TEMPLATES_ENV)


def render_plan(plan: DomainPlan, template_dir: Path | None = None) -> str:
    """The domain XML of a plan (templates/domain.xml.j2; every value XML-escaped)."""
    try:
        import jinja2
    except ImportError as error:
        from gpuhost.errors import MissingDependencyError

        raise MissingDependencyError("jinja2", "controller", "Rendering domain XML") from error
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir or templates_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return environment.get_template("domain.xml.j2").render(plan=plan, hex=_hex)


def _hex(value: int, width: int = 2) -> str:
    return f"0x{value:0{width}x}"


def render_domain(
    facts: HostFacts,
    spec: VmSpec,
    policy: HostPolicy,
    *,
    host: str,
    taken: Mapping[str, str] | None = None,
    host_vms: Sequence[VmSpec] | None = None,
    cpus_taken: Mapping[int, str] | None = None,
) -> str:
    """Plan and render in one call: facts + VM spec + host policy -> domain XML."""
    return render_plan(
        plan_domain(facts, spec, policy, host=host, taken=taken, host_vms=host_vms, cpus_taken=cpus_taken)
    )
