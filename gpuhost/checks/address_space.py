"""The guest physical address space the passed GPUs need: whether the host's CPU and IOMMU are wide enough."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.bar_window import bars_window_bytes, bits_for_window, describe_size, window_of_bits
from gpuhost.checks.base import CheckContext
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.selection import NvSwitchModel

GPU_P2P_IOMMU_WIDTH = register(
    "gpu.p2p.iommu_width",
    Stage.AUDIT,
    Severity.WARNING,
    "the IOMMU remaps fewer address bits than the CPU has (2 GPUs or more): BARs above its width break peer-to-peer",
)
GPU_BARS_ADDRESS_WIDTH = register(
    "gpu.bars.address_width",
    Stage.AUDIT,
    Severity.ERROR,
    "an NVSwitch host passes all its GPUs to one VM, whose BARs need more physical address bits than the CPU has",
)


def check_address_space(ctx: CheckContext) -> Iterator[Problem]:
    yield from _check_full_passthrough_window(ctx)
    yield from _check_iommu_width(ctx)


def _check_full_passthrough_window(ctx: CheckContext) -> Iterator[Problem]:
    """With its NVSwitches passed through, an HGX host's GPUs go to one VM (Fabric Manager runs in the
    guest and trains every NVLink at once), so that VM's BAR window is known now: every GPU card behind
    a root port of its own, each NVSwitch behind one, as render lays them out. A KVM guest's width is
    the CPU's (maxphysaddr passthrough); render refuses the VM on a CPU too narrow, and so does this."""
    cpu_bits = ctx.facts.cpu.physical_address_bits if ctx.facts.cpu is not None else None
    if ctx.selection.nvswitch_model is not NvSwitchModel.FULL_PASSTHROUGH or cpu_bits is None:
        return
    window = bars_window_bytes(
        [card.functions for card in ctx.selection.passthrough] + [(nvswitch,) for nvswitch in ctx.selection.nvswitches]
    )
    needed = bits_for_window(window)
    if cpu_bits >= needed:
        return
    yield ctx.finding(
        GPU_BARS_ADDRESS_WIDTH,
        Severity.ERROR,
        "BARs",
        f"the VM of all {len(ctx.selection.passthrough)} GPUs and {len(ctx.selection.nvswitches)} NVSwitches needs a "
        f"{describe_size(window)} 64-bit PCI window for their BARs, but the CPU has {cpu_bits} physical address bits, "
        f"which leave the guest's firmware a window of {describe_size(window_of_bits(cpu_bits))}: the BARs that do "
        "not fit are not assigned, and gpuhost render refuses the VM",
        f"Run these GPUs on a host whose CPU has at least {needed} physical address bits, or keep the NVSwitches on "
        "the host (Fabric Manager's shared NVSwitch model) and pass fewer GPUs per VM.",
    )


def _check_iommu_width(ctx: CheckContext) -> Iterator[Problem]:
    """With <maxphysaddr mode='passthrough'/> the guest's OVMF sizes its 64-bit window from the CPU's
    address width and may place BARs above what the IOMMU can remap: DMA between the passed GPUs
    then fails, though each works alone. Said where at least two GPUs are passed."""
    facts = ctx.facts
    cpu_bits = facts.cpu.physical_address_bits if facts.cpu is not None else None
    iommu_bits = facts.kernel_log.iommu_address_bits if facts.kernel_log is not None else None
    if len(ctx.selection.passthrough) < 2 or cpu_bits is None or iommu_bits is None or iommu_bits >= cpu_bits:
        return  # one GPU has no GPU peer
    yield ctx.finding(
        GPU_P2P_IOMMU_WIDTH,
        Severity.WARNING,
        "IOMMU",
        f"the IOMMU remaps {iommu_bits}-bit addresses (its capability register in the kernel log) and the CPU has "
        f"{cpu_bits} physical address bits: a guest rendered with maxphysaddr passthrough may get its GPUs' BARs "
        f"above 2^{iommu_bits}, where the IOMMU cannot map them, so peer-to-peer between the GPUs fails",
        "Check peer-to-peer in the guest (gpuhost smoke-test); where it fails, keep the BARs below the IOMMU's "
        "width (a maxphysaddr limit, or a BIOS setting that widens the IOMMU's address width).",
    )
