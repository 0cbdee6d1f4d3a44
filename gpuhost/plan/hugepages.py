"""How many 1 GiB huge pages to reserve at boot, and whether the host can hold them.

`auto` follows the guide's table of installed RAM -> huge pages (an operator's empirically
validated rows, VM memory plus a buffer):

    RAM (GB)   768  1024  1256  1512  2048  4096
    pages      700   880  1140  1300  1920  3880

Rule, with RAM read as MemTotal in GiB (a few percent below the installed RAM, so never more
pages than the table gives):
- below the audit's "optional" band (128 GB, 5% margin): no huge pages;
- between two rows: linear interpolation between them, rounded down;
- below the first row: the first row's ratio (700/768 of RAM); above the last: the last row's
  ratio (3880/4096).
Whatever the source (auto, N, a size), the host always keeps at least HOST_MINIMUM_KIB and
HOST_MINIMUM_FRACTION of its memory (the table's smallest margin is 5.3%), on every NUMA node;
a request that would leave less is refused: the guide warns that with too many pages the
machine does not boot. A NUMA node also keeps the gigabytes that the kernel's boot allocations
can break (BOOT_TAKES_GIB), or the kernel reserves fewer pages on it than planned.

Where the pages go (`place_on_nodes`): on a host of one memory node, there; `hugepages=N` as
before. On several nodes the pages go where the guests' memory is bound (render binds a VM's
memory to its GPUs' nodes): first what the declared VMs (`gpuhost_vms`) need on each node, then
the rest of the total shared among the nodes of the selected GPUs, in proportion to their GPUs
(largest remainder, lower node first on a tie). The command line names the nodes
(`hugepages=0:440,1:440`, the kernel's node form, Linux 5.16 on); where that placement is what
the kernel's even split gives anyway, the plain `hugepages=N` is kept. Where a selected GPU's
node is unknown the kernel's even split is kept.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from gpuhost.checks.memory import hugepage_recommendation
from gpuhost.facts.model import GIB_KIB, HostFacts
from gpuhost.inventory.plan_settings import PlanSettings
from gpuhost.numa import declared_vm_pages, pages_by_node
from gpuhost.plan.model import HugePagePlan
from gpuhost.plan.platform import Refuse
from gpuhost.problems import Severity, Stage, register
from gpuhost.selection import GpuSelection, card_numa_node

GUIDE_TABLE: tuple[tuple[int, int], ...] = (
    (768, 700),
    (1024, 880),
    (1256, 1140),
    (1512, 1300),
    (2048, 1920),
    (4096, 3880),
)
HOST_MINIMUM_KIB = 2 * GIB_KIB
HOST_MINIMUM_FRACTION = 0.05
# hugepages=<node>:<count>,... (the node form) is read by Linux 5.16 on (commit b5389086ad7b,
# "hugetlbfs: extend the definition of hugepages parameter to support node allocation"); an older
# kernel reads it with sscanf("%lu") and takes the first node's number for the count of pages.
NODE_FORM_KERNEL = (5, 16)


def auto_pages(mem_total_kib: int) -> tuple[int, str]:
    """The pages `auto` asks for on a host with this MemTotal, and the rule that gave them."""
    gib = mem_total_kib / GIB_KIB
    if hugepage_recommendation(mem_total_kib) == "skip":
        return 0, f"auto: {gib:.0f} GiB of RAM is below 128 GB, where the guide skips huge pages"
    first_ram, first_pages = GUIDE_TABLE[0]
    last_ram, last_pages = GUIDE_TABLE[-1]
    if gib <= first_ram:
        pages = math.floor(gib * first_pages / first_ram)
        return pages, f"auto: {gib:.0f} GiB x {first_pages}/{first_ram} (the guide's first row's ratio)"
    if gib >= last_ram:
        pages = math.floor(gib * last_pages / last_ram)
        return pages, f"auto: {gib:.0f} GiB x {last_pages}/{last_ram} (the guide's last row's ratio)"
    for (low_ram, low_pages), (high_ram, high_pages) in itertools.pairwise(GUIDE_TABLE):
        if low_ram <= gib <= high_ram:
            pages = math.floor(low_pages + (gib - low_ram) * (high_pages - low_pages) / (high_ram - low_ram))
            return pages, (
                f"auto: {gib:.0f} GiB interpolated between the guide's rows {low_ram} GB -> {low_pages} "
                f"and {high_ram} GB -> {high_pages}"
            )
    raise AssertionError("unreachable: the table's rows cover every RAM size between its ends")


def requested_pages(value: str, mem_total_kib: int) -> tuple[int, str]:
    """Pages for a validated gpuhost_hugepages value (auto, N, or a size such as 512G / 2T)."""
    if value == "auto":
        return auto_pages(mem_total_kib)
    if value.isdigit():
        return int(value), f"gpuhost_hugepages: {value} pages"
    match = re.fullmatch(r"(\d+)([GgTt])", value.replace("iB", "").replace("B", ""))
    if match is None:
        raise ValueError(f"not a validated huge page value: {value!r}")
    gib = int(match.group(1)) * (1024 if match.group(2).lower() == "t" else 1)
    return gib, f"gpuhost_hugepages: {value} = {gib} pages of 1 GiB"


def host_minimum_kib(mem_total_kib: int) -> int:
    return max(HOST_MINIMUM_KIB, math.ceil(mem_total_kib * HOST_MINIMUM_FRACTION))


def split_across_nodes(facts: HostFacts, pages: int) -> tuple[tuple[int, int], ...]:
    """What the kernel does with `hugepages=N` at boot: spread evenly over the memory nodes."""
    nodes = [node.node_id for node in facts.numa_nodes if node.mem_total_kib]
    if not nodes:
        return ((0, pages),) if pages else ()
    base, extra = divmod(pages, len(nodes))
    return tuple((node, base + (1 if index < extra else 0)) for index, node in enumerate(sorted(nodes)))


@dataclass(frozen=True)
class Placement:
    """Where the pages go at boot, one count per memory node, and how the command line says it."""

    per_node: tuple[tuple[int, int], ...]  # (NUMA node, pages), every memory node
    node_form: bool  # the command line names the nodes (hugepages=0:440,1:440)
    how: str  # why they go there, for the plan's text


# A node's 1 GiB pages are whole, aligned gigabytes of it that nothing took before hugetlb
# reserves them, early in boot. Measured on the lab's numa-pair host (Debian 12's 6.1 kernel, two
# nodes of 3 GiB, node 1 = [5 GiB, 8 GiB), memblock=debug): the kernel's early allocations for a
# node (NODE_DATA, the memmap of its pages) sit at the node's top and take its last gigabyte on
# every boot, and KASLR puts the kernel image (about 52 MiB with its bss) in a random 2 MiB slot
# of any node, on node 1 in 8 of 14 boots (/proc/iomem); across a gigabyte boundary it takes two more. A
# 64 MiB reservation across node 1's 6 GiB boundary (memmap=64M$0x17e000000, the image's size and
# place) left no page for hugepages=1:1: the CI failure of issue 26. MemTotal is a little under a
# node's span, so floor(MemTotal) - 2 gigabytes are always left whole.
BOOT_TAKES_GIB = 2


def node_page_limit(node_mem_kib: int, total_kib: int, minimum_kib: int) -> int:
    """The most 1 GiB pages one memory node can be given: it keeps its share of the host's minimum
    (prorated by its memory), and the gigabytes that boot allocations can break (BOOT_TAKES_GIB)."""
    share = minimum_kib * node_mem_kib // total_kib
    return max(0, min((node_mem_kib - share) // GIB_KIB, node_mem_kib // GIB_KIB - BOOT_TAKES_GIB))


def node_capacity(facts: HostFacts, total_kib: int, minimum_kib: int) -> dict[int, int]:
    """node_page_limit of each memory node: what the planner's node_too_small refusal checks."""
    return {
        node.node_id: node_page_limit(node.mem_total_kib, total_kib, minimum_kib)
        for node in facts.numa_nodes
        if node.mem_total_kib
    }


def _spill_over(
    placed: dict[int, int], capacity: Mapping[int, int], vm_need: Mapping[int, int], gpu_nodes: list[int]
) -> int:
    """Move what a node cannot hold (beyond its VMs' own need, which stays) to nodes with room,
    the GPUs' nodes first; returns how many pages moved. What no node has room for stays put, for
    the node_too_small refusal to name."""
    moved = 0
    for node in list(placed):
        limit = max(capacity.get(node, placed[node]), vm_need.get(node, 0))
        excess = placed[node] - limit
        if excess <= 0:
            continue
        targets = [n for n in gpu_nodes if n != node] + [n for n in sorted(placed) if n not in gpu_nodes and n != node]
        for target in targets:
            room = capacity.get(target, 0) - placed[target]
            if room <= 0:
                continue
            step = min(room, excess)
            placed[target] += step
            placed[node] -= step
            excess -= step
            moved += step
            if not excess:
                break
    return moved


def place_on_nodes(
    facts: HostFacts,
    pages: int,
    gpus_per_node: Mapping[int, int] | None,
    vm_need: Mapping[int, int],
    capacity: Mapping[int, int] | None = None,
) -> Placement:
    """`pages` on the host's memory nodes: the declared VMs' need (`vm_need`, pages by node) first,
    the rest by the selected GPUs per node (`gpus_per_node`; None: a GPU's node is unknown). A node
    given more than it can hold (`capacity`, pages by node) passes the excess to other nodes, the
    GPUs' nodes first: the total stays the one asked for, as close to the GPUs as memory allows."""
    even = split_across_nodes(facts, pages)
    memory_nodes = sorted(node.node_id for node in facts.numa_nodes if node.mem_total_kib)
    if len(memory_nodes) <= 1:
        return Placement(even, False, "one NUMA node")
    if gpus_per_node is None or not gpus_per_node:
        return Placement(even, False, "spread evenly by the kernel: the selected GPUs' NUMA nodes are unknown")
    placed = {node: vm_need.get(node, 0) for node in memory_nodes}
    rest = max(0, pages - sum(placed.values()))
    gpus = {node: count for node, count in sorted(gpus_per_node.items()) if node in placed}
    if not gpus:
        return Placement(even, False, "spread evenly by the kernel: the selected GPUs are on no memory node")
    weight = sum(gpus.values())
    shares = {node: rest * count // weight for node, count in gpus.items()}
    left = rest - sum(shares.values())
    by_remainder = sorted(gpus, key=lambda node: (-(rest * gpus[node] % weight), node))
    for node in by_remainder[:left]:
        shares[node] += 1
    for node, share in shares.items():
        placed[node] += share
    moved = _spill_over(placed, capacity, vm_need, list(gpus)) if capacity is not None else 0
    per_node = tuple(placed.items())
    described = ", ".join(f"node {node}: {count} GPU(s)" for node, count in gpus.items())
    how = f"on the selected GPUs' NUMA nodes ({described})"
    if vm_need:
        how += "; the declared VMs need " + ", ".join(f"{count} on node {node}" for node, count in vm_need.items())
    if moved:
        how += f"; {moved} that the GPUs' nodes cannot hold go to the other nodes"
    if per_node == even:
        return Placement(per_node, False, how + "; the kernel's even split of hugepages=N gives the same")
    return Placement(per_node, True, how)


def node_form_supported(kernel_release: str | None) -> bool:
    """Whether the running kernel reads hugepages=<node>:<count> (Linux 5.16 on)."""
    match = re.match(r"(\d+)\.(\d+)", kernel_release or "")
    return match is not None and (int(match.group(1)), int(match.group(2))) >= NODE_FORM_KERNEL


REFUSE_HUGEPAGES_MEMORY_UNKNOWN = register(
    "plan.hugepages.memory_unknown", Stage.PLAN, Severity.ERROR, "huge pages asked for, but /proc/meminfo is unreadable"
)

REFUSE_HUGEPAGES_UNSUPPORTED = register(
    "plan.hugepages.unsupported", Stage.PLAN, Severity.ERROR, "1 GiB pages asked for, but the CPU has no pdpe1gb"
)

REFUSE_HUGEPAGES_TOO_MANY = register(
    "plan.hugepages.too_many",
    Stage.PLAN,
    Severity.ERROR,
    "the huge pages would leave the host less than it needs to boot",
)

REFUSE_HUGEPAGES_NODE_TOO_SMALL = register(
    "plan.hugepages.node_too_small",
    Stage.PLAN,
    Severity.ERROR,
    "a NUMA node's share of the pages would leave it too little memory",
)

REFUSE_HUGEPAGES_OLD_KERNEL = register(
    "plan.hugepages.old_kernel",
    Stage.PLAN,
    Severity.ERROR,
    "the pages must go on chosen NUMA nodes, but the kernel is older than 5.16 (no hugepages=<node>:<count>)",
)

REFUSE_HUGEPAGES_VMS_EXCEED = register(
    "plan.hugepages.vms_exceed",
    Stage.PLAN,
    Severity.ERROR,
    "the VMs declared for the host (gpuhost_vms) need more 1 GiB pages than gpuhost_hugepages gives",
)


def plan_hugepages(facts: HostFacts, settings: PlanSettings, selection: GpuSelection, refuse: Refuse) -> HugePagePlan:
    total = facts.memory.total_kib if facts.memory and facts.memory.total_kib else None
    mount = settings.hugetlbfs_mount
    if total is None:
        if settings.hugepages not in ("0", "auto"):
            refuse(
                REFUSE_HUGEPAGES_MEMORY_UNKNOWN,
                "huge pages",
                "/proc/meminfo could not be read.",
                "Connect as a user that can read /proc/meminfo.",
            )
        return HugePagePlan(0, settings.hugepages, "memory unknown: no huge pages", (), 0, mount)
    pages, rule = requested_pages(settings.hugepages, total)
    keeps = total - pages * GIB_KIB
    minimum = host_minimum_kib(total)
    need = pages_by_node(declared_vm_pages(facts, settings.gpus, settings.vms))
    gpu_nodes = [card_numa_node(facts, card) for card in selection.passthrough]
    gpus_per_node = None if None in gpu_nodes else dict(Counter(node for node in gpu_nodes if node is not None))
    placement = place_on_nodes(facts, pages, gpus_per_node, need, node_capacity(facts, total, minimum))
    if pages and facts.cpu is not None and "pdpe1gb" not in facts.cpu.flags:
        refuse(
            REFUSE_HUGEPAGES_UNSUPPORTED,
            "huge pages",
            f"{pages} 1 GiB huge pages are asked for ({rule}) but the CPU has no pdpe1gb flag.",
            "Set gpuhost_hugepages: 0 (use 2 MiB pages for guest memory instead).",
        )
    if pages and sum(need.values()) > pages:
        wanted = ", ".join(f"{count} on NUMA node {node}" for node, count in need.items())
        refuse(
            REFUSE_HUGEPAGES_VMS_EXCEED,
            "huge pages",
            f"the VMs declared for the host (gpuhost_vms) need {sum(need.values())} 1 GiB pages ({wanted}), "
            f"more than the {pages} planned ({rule}).",
            f"Set gpuhost_hugepages to at least {sum(need.values())}, or give the VMs less memory (or hugepages: off).",
        )
    if pages and keeps < minimum:
        refuse(
            REFUSE_HUGEPAGES_TOO_MANY,
            "huge pages",
            f"{pages} 1 GiB huge pages ({rule}) would leave the host {max(keeps, 0) / GIB_KIB:.1f} GiB of its "
            f"{total / GIB_KIB:.1f} GiB; it needs at least {minimum / GIB_KIB:.1f} GiB, and with too many pages "
            "the machine does not boot.",
            f"Lower gpuhost_hugepages to at most {(total - minimum) // GIB_KIB}."
            if total - minimum >= GIB_KIB
            else "Set gpuhost_hugepages: 0: this host is too small to give up any 1 GiB page.",
        )
    elif pages:
        _check_nodes(facts, pages, placement, total, minimum, refuse)
    if pages and placement.node_form and not node_form_supported(facts.kernel_release):
        refuse(
            REFUSE_HUGEPAGES_OLD_KERNEL,
            "kernel",
            f"the 1 GiB pages go on chosen NUMA nodes ({_describe_nodes(placement.per_node)}: {placement.how}), "
            f"which the command line says as hugepages=<node>:<count>, read by Linux 5.16 on; the host runs "
            f"{facts.kernel_release or 'an unknown kernel'}, which would take the first node number for the count.",
            "Install a kernel of 5.16 or later (Ubuntu 22.04: linux-generic-hwe-22.04) and reboot into it, "
            "then run gpuhost apply again.",
        )
    return HugePagePlan(
        pages,
        settings.hugepages,
        rule,
        placement.per_node,
        max(keeps, 0),
        mount if pages else None,
        node_form=placement.node_form and pages > 0,
        placement=placement.how,
        vms_per_node=tuple(need.items()),
    )


def _check_nodes(facts: HostFacts, pages: int, placement: Placement, total: int, minimum: int, refuse: Refuse) -> None:
    """Each node keeps its share of the host's minimum (prorated by its memory) after its pages,
    and the gigabytes the kernel's boot allocations can break (hugepages.node_page_limit)."""
    nodes = {node.node_id: node for node in facts.numa_nodes}
    for node_id, node_pages in placement.per_node:
        node = nodes.get(node_id)
        if node is None or not node.mem_total_kib:
            continue
        most = node_page_limit(node.mem_total_kib, total, minimum)
        if node_pages > most:
            why = (
                f"the plan puts {node_pages} of the {pages} pages on NUMA node {node_id} ({placement.how})"
                if placement.node_form
                else f"the kernel spreads hugepages={pages} evenly, {node_pages} on NUMA node {node_id}"
            )
            node_minimum = minimum * node.mem_total_kib // total
            refuse(
                REFUSE_HUGEPAGES_NODE_TOO_SMALL,
                f"NUMA node {node_id}",
                f"{why}, which has only {node.mem_total_kib / GIB_KIB:.1f} GiB: at most {most} fit, as the node keeps "
                f"{node_minimum / GIB_KIB:.1f} GiB (its share of host memory) and {BOOT_TAKES_GIB} gigabytes that "
                "the kernel's own boot allocations can break (a 1 GiB page needs a whole aligned gigabyte).",
                f"Lower gpuhost_hugepages so that NUMA node {node_id} gets at most {most} pages, or give the node "
                "more memory.",
            )


def _describe_nodes(per_node: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{count} on node {node}" for node, count in per_node)
