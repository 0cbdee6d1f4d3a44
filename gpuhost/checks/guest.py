"""A passthrough guest: the VM that received a GPU, seen from inside."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext, describe_function
from gpuhost.checks.gpus import check_link, check_numa
from gpuhost.facts.model import NCCL_CONF, NCCL_GUEST_TOPOLOGY, NcclTopologyFile
from gpuhost.problems import Problem, Severity, Stage, register

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

GUEST_ROLE = register(
    "guest", Stage.AUDIT, Severity.INFO, "audited as a passthrough guest: the host checks do not apply"
)
GUEST_GPU_DRIVER = register(
    "guest.gpu.driver", Stage.AUDIT, None, "inside a guest: the GPU is driven by nvidia (info) or not (error)"
)
GUEST_TOPOLOGY_FLAT = register(
    "guest.topology.flat",
    Stage.AUDIT,
    None,
    "inside a guest: the GPU sits on the root bus (no root port above it): a warning, info where an NCCL "
    "topology file lists it",
)
GUEST_NCCL_TOPOLOGY = register(
    "guest.nccl.topology",
    Stage.AUDIT,
    None,
    "inside a guest: NCCL reads a topology file that lists every GPU, or none (info); the file is missing, "
    "unusable or leaves a GPU out (warning)",
)

TOPOLOGY_FIX = (
    f"Render the VM with `gpuhost render -o VM.xml` (a pcie-root-port per GPU, and VM.nccl-topo.xml beside it) "
    f"and bring it up with `gpuhost guest up`, which installs that file as {NCCL_GUEST_TOPOLOGY} and names it in "
    f"{NCCL_CONF}; or write NCCL_TOPO_FILE=FILE in {NCCL_CONF}, FILE an NCCL topology listing this guest's GPUs "
    "at their bus IDs."
)


def check_guest(ctx: CheckContext) -> Iterator[Problem]:
    cards = ctx.selection.passthrough + ctx.selection.kept
    iommu = "no IOMMU" if not ctx.facts.iommu.active else f"{len(ctx.facts.iommu.groups)} IOMMU groups"
    yield ctx.finding(
        GUEST_ROLE,
        INFO,
        "role",
        f"passthrough guest (a VM with {len(cards)} GPU(s) handed to it, {iommu}): host checks do not apply",
    )
    for card in cards:
        gpu = card.gpu
        if gpu.driver == "nvidia":
            yield ctx.finding(GUEST_GPU_DRIVER, INFO, gpu.address, f"{describe_function(gpu)} is driven by nvidia")
        else:
            yield ctx.finding(
                GUEST_GPU_DRIVER,
                ERROR,
                gpu.address,
                f"{describe_function(gpu)} is not driven by the NVIDIA driver in this guest",
                "Install the NVIDIA driver in the guest (gpuhost guest up does).",
            )
        yield from check_link(ctx, gpu)
        yield from check_numa(ctx, gpu)
        # Without the captured topology, bus 00 is the root bus.
        if not gpu.parents and gpu.address.split(":")[1] == "00":
            flat = f"{gpu.describe()} sits on the guest's root bus (no PCIe root port above it)"
            node = _listed_node(ctx.facts.nccl_topology, gpu.address)
            if node is not None and ctx.facts.nccl_topology is not None:
                yield ctx.finding(
                    GUEST_TOPOLOGY_FLAT,
                    INFO,
                    gpu.address,
                    f"{flat}, but NCCL reads its place from {ctx.facts.nccl_topology.path} (NUMA node {node})",
                )
            else:
                yield ctx.finding(
                    GUEST_TOPOLOGY_FLAT,
                    WARNING,
                    gpu.address,
                    f"{flat} and no NCCL topology file lists it: the driver cannot read the link's NUMA "
                    "placement, and NCCL sees no NUMA node or PCIe switch for it",
                    TOPOLOGY_FIX,
                )
    yield from _nccl_topology(ctx, [card.gpu.address for card in cards])


def _listed_node(topology: NcclTopologyFile | None, address: str) -> int | None:
    if topology is None or topology.gpus is None:
        return None
    return topology.gpus.get(address.lower())


def _nccl_topology(ctx: CheckContext, addresses: list[str]) -> Iterator[Problem]:
    """Whether NCCL will read a topology file that lists this guest's GPUs (by bus ID, as NCCL matches them)."""
    if not addresses:
        return
    topology = ctx.facts.nccl_topology
    if topology is None:
        yield ctx.finding(
            GUEST_NCCL_TOPOLOGY,
            INFO,
            NCCL_CONF,
            f"no NCCL topology file (no NCCL_TOPO_FILE in {NCCL_CONF}): NCCL detects the topology from the guest's "
            "PCI tree",
        )
        return
    where = f"named in {topology.named_in}" if topology.named_in else "NCCL's default path"
    if topology.gpus is None:
        yield ctx.finding(
            GUEST_NCCL_TOPOLOGY,
            WARNING,
            topology.path,
            f"the NCCL topology file {topology.path} ({where}) is unusable: {topology.error}; NCCL fails to read it "
            "or detects the topology from the guest's PCI tree",
            TOPOLOGY_FIX,
        )
        return
    missing = [address for address in addresses if address.lower() not in topology.gpus]
    if missing:
        yield ctx.finding(
            GUEST_NCCL_TOPOLOGY,
            WARNING,
            topology.path,
            f"the NCCL topology file {topology.path} ({where}) does not list {', '.join(missing)}: NCCL places "
            "those GPUs from the guest's PCI tree (a file for another VM or layout?)",
            TOPOLOGY_FIX,
        )
        return
    yield ctx.finding(
        GUEST_NCCL_TOPOLOGY,
        INFO,
        topology.path,
        f"NCCL reads the topology file {topology.path} ({where}): it lists all {len(addresses)} GPU(s) of this "
        "guest at their bus IDs",
    )
