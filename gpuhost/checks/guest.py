"""A passthrough guest: the VM that received a GPU, seen from inside."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext, describe_function
from gpuhost.checks.gpus import check_link, check_numa
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
    Severity.INFO,
    "inside a guest: the GPU sits on the root bus (no root port above it)",
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
            yield ctx.finding(
                GUEST_TOPOLOGY_FLAT,
                INFO,
                gpu.address,
                f"{gpu.describe()} sits on the guest's root bus (no PCIe root port above it): the driver cannot "
                "see the link's NUMA placement",
                "Render the domain with a pcie-root-port per GPU (gpuhost render does).",
            )
