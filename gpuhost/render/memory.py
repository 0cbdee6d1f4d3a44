"""The guest's memory: its size per cell, its huge pages, and what the host's nodes can hold."""

from __future__ import annotations

from collections.abc import Sequence

from gpuhost.facts.model import GIB_KIB, HostFacts
from gpuhost.inventory.spec import HostPolicy, VmHugePages, VmSpec
from gpuhost.numa import declared_vm_pages, pages_by_node, vm_pages
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.render.conflicts import render_conflict

KIB_PER_MIB = 1024

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


def use_hugepages(facts: HostFacts, spec: VmSpec, conflicts: list[Problem]) -> bool:
    if spec.hugepages is VmHugePages.OFF:
        return False
    pool = facts.hugepage_pool(GIB_KIB)
    reserved = pool is not None and (pool.total or 0) > 0
    if not reserved:
        if spec.hugepages is VmHugePages.ON:
            conflicts.append(
                render_conflict(
                    HUGEPAGES_NONE_RESERVED,
                    "huge pages",
                    "hugepages: on, but the host has no 1 GiB huge pages reserved",
                    "(run `gpuhost apply`).",
                )
            )
        return False
    if spec.memory_mib % 1024:
        conflicts.append(
            render_conflict(
                MEMORY_NOT_GIB,
                "memory",
                f"memory {spec.memory_mib} MiB is not a whole number of GiB, which 1 GiB huge pages need",
                "(or set hugepages: off).",
            )
        )
    return True


def check_memory(
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
                    render_conflict(
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
                    render_conflict(
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
                render_conflict(
                    MEMORY_NODE_TOO_SMALL,
                    f"NUMA node {node_id}",
                    f"{need_kib // 1024} MiB of memory to bind to NUMA node {node_id}, which has {total // 1024} MiB.",
                )
            )
    host_kib = facts.memory.total_kib if facts.memory is not None else None
    if not nodes and host_kib is not None and need_kib > host_kib:
        conflicts.append(
            render_conflict(
                MEMORY_TOO_MUCH,
                "memory",
                f"{spec.memory_mib} MiB of memory asked, the host has {host_kib // 1024} MiB.",
            )
        )


def check_declared_pages(
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
            render_conflict(
                HUGEPAGES_NODE_SHORT,
                f"NUMA node {node_id}",
                f"{pages} 1 GiB huge pages needed on NUMA node {node_id}, which has {reserved} reserved; the VMs "
                f"declared before it ({holders}) take {taken[node_id]} of them;",
                "reserve more on that node (gpuhost_hugepages, then gpuhost apply), give the VMs less memory, "
                "or set hugepages: off for one of them.",
            )
        )
