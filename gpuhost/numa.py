"""Where a host's declared VMs (`gpuhost_vms`) keep their memory: on their GPUs' NUMA nodes.

Render binds a VM's memory to the nodes of its GPUs, split evenly over them (one guest cell per
node); with 1 GiB huge pages each node must hold its share in pages. The planner places the
host's pages by this, the audit and render compare the nodes' pages with it. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuhost.facts.model import HostFacts
from gpuhost.inventory.spec import VmHugePages, VmSpec
from gpuhost.selection import GpuSelector, card_numa_node, vm_gpus


@dataclass(frozen=True)
class VmPages:
    """The 1 GiB pages one VM's memory takes on each of its GPUs' nodes."""

    vm: str
    per_node: tuple[tuple[int, int], ...]  # (NUMA node, pages), by node


def vm_pages(facts: HostFacts, selector: GpuSelector, vm: VmSpec) -> VmPages | None:
    """None where the VM takes no pages from a node: hugepages: off, no GPU (its memory is not
    bound), or a GPU or its node unknown (render refuses such a VM)."""
    if vm.hugepages is VmHugePages.OFF or not vm.gpus:
        return None
    picked = vm_gpus(facts, selector, vm.gpus)
    if picked.misses:
        return None
    cards = picked.cards
    nodes = {card_numa_node(facts, card) for card in cards}
    if not cards or None in nodes:
        return None
    known = sorted(node for node in nodes if node is not None)
    pages = math.ceil(vm.memory_mib / 1024 / len(known))
    return VmPages(vm.name, tuple((node, pages) for node in known))


def declared_vm_pages(facts: HostFacts, selector: GpuSelector, vms: Sequence[VmSpec]) -> tuple[VmPages, ...]:
    """Every declared VM that takes pages from a node, in inventory order."""
    found = (vm_pages(facts, selector, vm) for vm in vms)
    return tuple(pages for pages in found if pages is not None)


def pages_by_node(vms: Iterable[VmPages]) -> dict[int, int]:
    """The pages the VMs need on each node, added up."""
    total: dict[int, int] = {}
    for vm in vms:
        for node, pages in vm.per_node:
            total[node] = total.get(node, 0) + pages
    return dict(sorted(total.items()))
