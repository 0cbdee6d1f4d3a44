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
machine does not boot.
"""

from __future__ import annotations

import itertools
import math
import re

from gpuhost.checks.memory import hugepage_recommendation
from gpuhost.facts.model import GIB_KIB, HostFacts

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
