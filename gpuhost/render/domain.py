"""Host facts + a VM spec + the host's policy -> a libvirt domain (pure: no I/O beyond the template).

`plan_domain` decides everything and refuses, naming each conflict, what cannot work on that
host; `render_plan` only fills templates/domain.xml.j2 in. The layout, and why:

- q35 with every passed-through card behind its own pcie-root-port, the card's functions kept
  together as one multifunction device (function 0 carries multifunction='on'): on the root bus a
  GPU would be an integrated endpoint, whose link speed and width the guest driver cannot read.
- Devices behind a PCIe switch on the host sit behind a guest switch that mirrors it (a root port,
  a pcie-switch-upstream-port behind it, a pcie-switch-downstream-port per device; on the node's
  expander bus like the other root ports): devices that share a host switch share the guest's, and
  NCCL, reading the guest's tree or the topology file, sees which GPUs and NICs share one.
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuhost.errors import InputError
from gpuhost.facts.model import Firmware, HostFacts
from gpuhost.facts.parsers import parse_cpulist as parse_cpulist  # re-exported: render's CLI and tests read it here
from gpuhost.host_support import unsupported_host
from gpuhost.inventory.spec import DomainType, HostPolicy, VmSpec
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.render.address_width import (
    TCG_TB_CACHE_MIB,
    GuestAddressWidth,
    bars_window,
    check_q35_vcpus,
    guest_address_width,
    hole64_bytes,
    iommu_width_note,
    lock_limit_kib,
    older_ovmf_mmio64_mib,
)
from gpuhost.render.conflicts import render_conflict
from gpuhost.render.cpus import allocate_cpus, format_cpulist, known_nodes
from gpuhost.render.devices import (
    check_declared_once,
    check_functions,
    host_switches,
    passthrough_groups,
    passthrough_nvswitches,
    resolve_gpus,
)
from gpuhost.render.layout import (
    MAX_CELLS,
    Cell,
    ExpanderBus,
    GuestFunction,
    PortKind,
    RootPort,
    guest_bus_numbers,
    pci_layout,
)
from gpuhost.render.memory import KIB_PER_MIB, check_declared_pages, check_memory, use_hugepages
from gpuhost.selection import card_numa_node

HOST_UNSUPPORTED = register(
    "render.host.unsupported",
    Stage.RENDER,
    Severity.ERROR,
    "gpuhost does not support the host's architecture, IOMMU or GPU family: no domain is written",
)

GPU_NUMA_UNKNOWN = register(
    "render.gpu.numa_unknown", Stage.RENDER, Severity.ERROR, "a GPU's NUMA node is unknown while the others have one"
)

VCPUS_TOO_MANY = register("render.vcpus.too_many", Stage.RENDER, Severity.ERROR, "more vCPUs than the host has CPUs")

VCPUS_UNEVEN = register(
    "render.vcpus.uneven", Stage.RENDER, Severity.ERROR, "the vCPUs do not split evenly over the guest NUMA cells"
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


class RenderRefused(InputError):
    """The VM cannot be given what it asks for on this host; the message lists every conflict."""

    def __init__(self, vm: str, host: str, conflicts: Sequence[Problem]) -> None:
        self.conflicts = tuple(conflicts)
        lines = "\n".join(f"  - {conflict.message} {conflict.remedy}".rstrip() for conflict in conflicts)
        super().__init__(f"refusing to render VM {vm!r} for host {host}:\n{lines}")


@dataclass(frozen=True)
class DomainPlan:
    name: str
    host: str
    domain_type: DomainType
    vcpus: int
    memory_kib: int
    hugepages: bool
    firmware: Firmware
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
        """Every port with a host device behind it (a root port, or a guest switch's downstream
        port): the GPUs, then the NVSwitches."""
        return tuple(port for port in self.ports if port.functions)

    @property
    def gpu_ports(self) -> tuple[RootPort, ...]:
        return tuple(port for port in self.passthrough_ports if port.kind is PortKind.GPU)

    @property
    def nvswitch_ports(self) -> tuple[RootPort, ...]:
        return tuple(port for port in self.passthrough_ports if port.kind is PortKind.NVSWITCH)

    @property
    def guest_buses(self) -> dict[int, int]:
        """Port controller index -> the guest bus number of what sits behind it (layout.guest_bus_numbers)."""
        return guest_bus_numbers(self.expanders, self.ports)

    def guest_address(self, port: RootPort, function: GuestFunction) -> str:
        """Where the guest sees a passed function: the PCI address its own lspci and NVML show."""
        return f"0000:{self.guest_buses[port.index]:02x}:00.{function.guest_function:x}"

    def port(self, kind: PortKind | str) -> RootPort | None:
        """The root port of `kind` (the template names it by its value: plan.port('disk'))."""
        wanted = PortKind(kind)
        return next((port for port in self.ports if port.kind is wanted), None)


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
    unsupported = unsupported_host(facts)
    if unsupported is not None:
        # One answer, the audit's and the plan's: no x86_64 q35/OVMF domain for a host gpuhost does not support.
        message = f"{unsupported.message};"
        raise RenderRefused(
            spec.name, host, [render_conflict(HOST_UNSUPPORTED, unsupported.subject, message, unsupported.would)]
        )
    conflicts: list[Problem] = []
    notes: list[str] = []
    cards = resolve_gpus(facts, spec, policy, conflicts)
    check_declared_once(facts, spec, policy, host_vms or (), conflicts)
    groups = passthrough_groups(facts, cards, policy, conflicts)
    nvswitches = passthrough_nvswitches(facts, cards, policy, conflicts)
    check_functions(groups, spec, taken or {}, conflicts, extra=nvswitches)

    node_of = {card.gpu.address: card_numa_node(facts, card) for card in cards}
    nodes = known_nodes(node_of)
    if cards and len(nodes) < len({*node_of.values()}) and nodes:
        unknown = ", ".join(address for address, node in node_of.items() if node is None)
        conflicts.append(
            render_conflict(
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
            render_conflict(VCPUS_TOO_MANY, "vCPUs", f"{spec.vcpus} vCPUs asked, but the host has {host_cpus} CPUs.")
        )
    cells_count = max(1, len(nodes))
    if len(nodes) > MAX_CELLS:
        conflicts.append(
            render_conflict(
                NUMA_TOO_MANY_NODES,
                "GPUs",
                f"the GPUs span {len(nodes)} NUMA nodes; at most {MAX_CELLS} are supported.",
            )
        )
    if spec.vcpus % cells_count:
        conflicts.append(
            render_conflict(
                VCPUS_UNEVEN,
                "vCPUs",
                f"the GPUs sit on NUMA nodes {format_cpulist(nodes)}: {spec.vcpus} vCPUs cannot be split evenly "
                f"over {cells_count} guest NUMA cells;",
                f"ask for a multiple of {cells_count}.",
            )
        )
    hugepages = use_hugepages(facts, spec, conflicts)
    granule_mib = 1024 if hugepages else 1
    if spec.memory_mib % (granule_mib * cells_count):
        unit = "GiB (1 GiB huge pages)" if hugepages else "MiB"
        conflicts.append(
            render_conflict(
                MEMORY_UNEVEN,
                "memory",
                f"memory {spec.memory_mib} MiB cannot be split evenly over {cells_count} guest NUMA cells "
                f"in whole {unit}.",
            )
        )
    vms = tuple(host_vms or ())
    if spec not in vms:
        vms = (*(vm for vm in vms if vm.name != spec.name), spec)
    check_q35_vcpus(facts, spec, conflicts)
    cpus = allocate_cpus(facts, policy, vms, cpus_taken=cpus_taken).of(spec)
    conflicts.extend(cpus.conflicts)
    check_memory(facts, spec, nodes, hugepages, conflicts)
    if hugepages:
        check_declared_pages(facts, spec, vms, policy, conflicts)
    if conflicts:
        raise RenderRefused(spec.name, host, conflicts)

    cell_memory_kib = spec.memory_mib * KIB_PER_MIB // cells_count
    per_cell = spec.vcpus // cells_count
    cells = (
        tuple(Cell(i, node, i * per_cell, (i + 1) * per_cell - 1, cell_memory_kib) for i, node in enumerate(nodes))
        if len(nodes) > 1
        else ()
    )
    expanders, ports = pci_layout(spec, groups, node_of, nodes, nvswitches, host_switches(facts, groups))
    hole64 = hole64_bytes(ports)
    # Known only once the cards are laid out behind their ports (each port's window aligned to its
    # largest BAR), so refused on its own, after the conflicts above.
    maxphysaddr = guest_address_width(facts, spec, bars_window(ports), conflicts, notes)
    if conflicts:
        raise RenderRefused(spec.name, host, conflicts)
    if maxphysaddr is not None and maxphysaddr.mode == "passthrough" and len(cards) > 1:  # peer-to-peer: two GPUs
        notes.extend(iommu_width_note(facts))
    ovmf_mmio64_mib = older_ovmf_mmio64_mib(facts, spec, hole64, notes)
    tcg_tb_cache_mib = TCG_TB_CACHE_MIB if spec.domain_type is DomainType.QEMU else None
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
        cpu_mode="host-passthrough" if spec.domain_type is DomainType.KVM else "maximum",
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
