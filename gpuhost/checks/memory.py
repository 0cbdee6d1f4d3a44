"""1 GiB huge pages: support, the guide's recommendation, what is configured and what is allocated.

The guide's rule of thumb by installed RAM: below 128 GB skip, 128-512 GB optional, above 512 GB
recommended. MemTotal reads a few percent below the installed RAM, so each band starts 5% lower.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext
from gpuhost.facts.model import GIB_KIB
from gpuhost.facts.parsers import parse_hugepages_by_node, parse_hugepages_request
from gpuhost.numa import declared_vm_pages
from gpuhost.problems import Problem, Severity, Stage, register

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

HUGEPAGES_UNKNOWN = register(
    "hugepages.unknown", Stage.AUDIT, Severity.WARNING, "/proc/meminfo unreadable: memory and huge pages unknown"
)
HUGEPAGES_SUPPORT = register(
    "hugepages.support",
    Stage.AUDIT,
    None,
    "no pdpe1gb: no 1 GiB pages (warning where the guide recommends them, else info)",
)
HUGEPAGES_ALLOCATION = register(
    "hugepages.allocation", Stage.AUDIT, Severity.ERROR, "fewer 1 GiB pages allocated than the command line asks"
)
HUGEPAGES_ALLOCATED = register(
    "hugepages.allocated", Stage.AUDIT, Severity.INFO, "1 GiB pages allocated, per NUMA node"
)
HUGEPAGES_RECOMMENDED = register(
    "hugepages.recommended",
    Stage.AUDIT,
    Severity.WARNING,
    "above 512 GB of RAM and no 1 GiB pages (MemTotal bands start 5% lower)",
)
HUGEPAGES_RECOMMENDATION = register(
    "hugepages.recommendation",
    Stage.AUDIT,
    Severity.INFO,
    "the guide's advice by RAM: below 128 GB skip, 128-512 GB optional",
)
HUGEPAGES_NODE_ALLOCATION = register(
    "hugepages.node_allocation",
    Stage.AUDIT,
    Severity.ERROR,
    "fewer 1 GiB pages on a NUMA node than the command line's hugepages=<node>:<count> asks for it",
)
HUGEPAGES_NODE_SHORT = register(
    "hugepages.node_short",
    Stage.AUDIT,
    Severity.ERROR,
    "a NUMA node has fewer 1 GiB pages than the VMs declared on its GPUs (gpuhost_vms) need",
)
HUGEPAGES_MOUNT = register("hugepages.mount", Stage.AUDIT, Severity.INFO, "no hugetlbfs mount with 1 GiB pages")

OPTIONAL_FROM_GIB = 128 * 0.95
RECOMMENDED_ABOVE_GIB = 512 * 0.95


_ADVICE_TEXT = {
    "skip": "1 GiB huge pages can be skipped (below 128 GB their benefit is small)",
    "optional": "1 GiB huge pages are optional (128-512 GB: they reduce latency jitter)",
    "recommended": "1 GiB huge pages are recommended",
}


def hugepage_recommendation(mem_total_kib: int) -> str:
    """'skip', 'optional' or 'recommended', by the guide's table."""
    gib = mem_total_kib / GIB_KIB
    if gib < OPTIONAL_FROM_GIB:
        return "skip"
    if gib <= RECOMMENDED_ABOVE_GIB:
        return "optional"
    return "recommended"


def check_hugepages(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    memory = facts.memory
    if memory is None or memory.total_kib is None:
        yield ctx.unreadable(HUGEPAGES_UNKNOWN, "huge pages", "/proc/meminfo", "memory and huge pages are unknown")
        return
    total_gib = memory.total_kib / GIB_KIB
    advice = hugepage_recommendation(memory.total_kib)
    pool = facts.hugepage_pool(GIB_KIB)
    allocated = pool.total if pool and pool.total is not None else 0
    requested = parse_hugepages_request(facts.cmdline.tokens).get(GIB_KIB) if facts.cmdline else None
    supports = facts.cpu is None or "pdpe1gb" in facts.cpu.flags
    if not supports:
        yield ctx.finding(
            HUGEPAGES_SUPPORT,
            WARNING if advice == "recommended" else INFO,
            "huge pages",
            "the CPU has no pdpe1gb flag: 1 GiB huge pages are not available",
            "Use 2 MiB huge pages for guest memory instead.",
        )
    if requested is not None and allocated < requested:
        yield ctx.finding(
            HUGEPAGES_ALLOCATION,
            ERROR,
            "huge pages",
            f"the kernel command line asks for {requested} 1 GiB pages but only {allocated} were allocated at boot",
            "Lower hugepages= to what the host can hold (leave the host its buffer), and check the NUMA split.",
        )
    if allocated:
        per_node = ", ".join(
            f"node {node.node_id}: {p.total}" for node in facts.numa_nodes if (p := node.pool(GIB_KIB))
        )
        free = pool.free if pool and pool.free is not None else "?"
        yield ctx.finding(
            HUGEPAGES_ALLOCATED,
            INFO,
            "huge pages",
            f"{allocated} 1 GiB pages allocated ({free} free)" + (f"; {per_node}" if per_node else ""),
        )
        yield from _check_hugetlbfs(ctx)
    elif advice == "recommended":
        yield ctx.finding(
            HUGEPAGES_RECOMMENDED,
            WARNING,
            "huge pages",
            f"{total_gib:.0f} GiB of RAM and no 1 GiB huge pages: above 512 GB they make guest start-up reliable",
            "Reserve 1 GiB pages for the guests' memory plus a buffer (gpuhost_hugepages: auto).",
        )
    else:
        yield ctx.finding(
            HUGEPAGES_RECOMMENDATION,
            INFO,
            "huge pages",
            f"{total_gib:.0f} GiB of RAM: " + _ADVICE_TEXT[advice],
        )


def check_hugepages_per_node(ctx: CheckContext) -> Iterator[Problem]:
    """Each node's 1 GiB pages against what the command line asks for it (the plan, once applied)
    and against what the VMs declared on its GPUs need (render binds their memory there)."""
    facts = ctx.facts
    host_pool = facts.hugepage_pool(GIB_KIB)
    requested = parse_hugepages_by_node(facts.cmdline.tokens).get(GIB_KIB, ()) if facts.cmdline else ()
    nodes = {node.node_id: node for node in facts.numa_nodes}
    for node_id, count in requested:
        if node_id is None:
            continue
        node = nodes.get(node_id)
        pool = node.pool(GIB_KIB) if node is not None else None
        allocated = pool.total if pool is not None else None
        if allocated is None or allocated < count:
            yield ctx.finding(
                HUGEPAGES_NODE_ALLOCATION,
                ERROR,
                f"NUMA node {node_id}",
                f"the kernel command line asks for {count} 1 GiB pages on NUMA node {node_id}, "
                + (f"{allocated} were allocated there" if allocated is not None else "which the host does not have"),
                f"Lower gpuhost_hugepages or move the GPUs' VMs: NUMA node {node_id} cannot hold {count} pages at boot "
                "(its memory, less what the kernel takes early).",
            )
    if not host_pool or not host_pool.total:
        return  # no 1 GiB pages reserved: the VMs use ordinary memory (hugepages: auto)
    vms = declared_vm_pages(facts, ctx.policy.gpus, ctx.policy.vms)
    need: dict[int, list[tuple[str, int]]] = {}
    for vm in vms:
        for node_id, pages in vm.per_node:
            need.setdefault(node_id, []).append((vm.vm, pages))
    for node_id, wanted in sorted(need.items()):
        node = nodes.get(node_id)
        pool = node.pool(GIB_KIB) if node is not None else None
        if pool is None and len(nodes) <= 1:
            pool = host_pool
        have = pool.total if pool is not None and pool.total is not None else 0
        total = sum(pages for _, pages in wanted)
        if have < total:
            names = ", ".join(f"{name} {pages}" for name, pages in wanted)
            yield ctx.finding(
                HUGEPAGES_NODE_SHORT,
                ERROR,
                f"NUMA node {node_id}",
                f"NUMA node {node_id} has {have} 1 GiB pages; the VMs declared on its GPUs need {total} ({names})",
                "Run gpuhost apply: it places the pages on the GPUs' nodes, the declared VMs' first.",
            )


def _check_hugetlbfs(ctx: CheckContext) -> Iterator[Problem]:
    mounts = ctx.facts.mounts
    if mounts is None:
        return
    hugetlbfs = [m for m in mounts if m.fstype == "hugetlbfs"]
    one_gib = [m for m in hugetlbfs if "pagesize=1024M" in m.options or "pagesize=1G" in m.options]
    if not one_gib:
        present = ", ".join(f"{m.target} ({[o for o in m.options if o.startswith('pagesize')]})" for m in hugetlbfs)
        yield ctx.finding(
            HUGEPAGES_MOUNT,
            INFO,
            "huge pages",
            "no hugetlbfs mount with 1 GiB pages" + (f" (mounted: {present})" if present else ""),
            "libvirt mounts its own; for QEMU by hand mount -t hugetlbfs -o pagesize=1G none /dev/hugepages1G.",
        )
