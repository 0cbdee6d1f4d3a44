"""The guest's vCPUs: how many per NUMA cell, and the host CPUs each is pinned to."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuhost.facts.model import HostFacts
from gpuhost.facts.parsers import parse_cpulist
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.render.conflicts import render_conflict
from gpuhost.render.devices import resolve_gpus
from gpuhost.render.layout import MAX_CELLS
from gpuhost.selection import card_numa_node

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


def known_nodes(node_of: Mapping[str, int | None]) -> list[int]:
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
    cards = resolve_gpus(facts, spec, policy, conflicts)
    node_of = {card.gpu.address: card_numa_node(facts, card) for card in cards}
    nodes = known_nodes(node_of)
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
                render_conflict(
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
                render_conflict(
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
    return render_conflict(
        VCPUS_NODE_FULL,
        f"NUMA node {node_id}",
        f"{wanted} vCPUs to pin on NUMA node {node_id}, which has {len(usable)} usable CPUs: "
        f"{', '.join(f'{holder} ({counts[holder]})' for holder in named)} hold {held} of them, "
        f"{len(usable) - held} are left (a VM takes whole cores: no two VMs share one);",
        "ask for fewer vCPUs, put the VM's GPUs on another node, or remove a VM declared before it "
        "(VMs take CPUs in gpuhost_vms order).",
    )
