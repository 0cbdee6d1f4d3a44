"""Whether gpuhost supports a host at all: its architecture, its IOMMU and its GPUs' family.

One answer that the audit, the plan and render all ask first: a host gpuhost does not support gets
one error saying what it is and that gpuhost does not support it (and what would), never the x86
advice the other checks give (VT-x, VT-d, x2APIC, pdpe1gb, iommu=pt, vfio-pci.ids, an x86_64 q35).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.facts.model import HostFacts
from gpuhost.facts.pci import VENDOR_NVIDIA

SUPPORTED_MACHINES = ("x86_64",)

# IOMMU units as /sys/class/iommu names them: Intel VT-d's (dmar0) and AMD-Vi's (ivhd0).
SUPPORTED_IOMMU_UNIT_PREFIXES = ("dmar", "ivhd")

# GPUs whose memory is coherent with the CPU's (Grace Hopper, Grace Blackwell): vfio-pci alone cannot
# pass them; Linux 6.9's nvgrace-gpu-vfio-pci variant driver can (its id table:
# drivers/vfio/pci/nvgrace-gpu/main.c), which gpuhost does not configure.
NVGRACE_GPU_DEVICES = {
    0x2342: "GH200 120GB",
    0x2345: "GH200 480GB",
    0x2348: "GH200",
    0x2941: "GB200",
}


@dataclass(frozen=True)
class Unsupported:
    """Why gpuhost does not support a host: what it is, and what would (where known)."""

    subject: str  # architecture, IOMMU, GPU
    what: str  # "an aarch64 host (an ARM SMMU IOMMU: smmu3.0x...)"
    would: str  # what would support it, or what to do

    @property
    def message(self) -> str:
        return (
            f"this is {self.what}: gpuhost does not support it (it configures x86_64 hosts with Intel VT-d or "
            "AMD-Vi, whose GPUs vfio-pci passes)"
        )


def unsupported_host(facts: HostFacts) -> Unsupported | None:
    """The first reason gpuhost does not support the host (architecture, then IOMMU, then GPUs); None
    where it does or where what it is cannot be read (the other checks say what is unknown)."""
    machine = facts.machine
    units = facts.iommu.units
    foreign_units = [unit for unit in units if not unit.startswith(SUPPORTED_IOMMU_UNIT_PREFIXES)]
    grace = [
        f"{function.address} ({NVGRACE_GPU_DEVICES[function.device]})"
        for function in facts.pci
        if function.vendor == VENDOR_NVIDIA and function.device in NVGRACE_GPU_DEVICES
    ]
    gpus = f"; its GPUs {', '.join(grace)} need the nvgrace-gpu-vfio-pci variant driver (Linux 6.9)" if grace else ""
    if machine is not None and machine not in SUPPORTED_MACHINES:
        iommu = f", IOMMU units {', '.join(units)}" if units else ""
        return Unsupported(
            "architecture",
            f"an {machine} host{iommu}{gpus}",
            "Configure it by hand (its IOMMU, vfio-pci or a variant driver, its firmware) or pass the GPUs on an "
            "x86_64 host; gpuhost's audit, plan and render answer for x86_64 only.",
        )
    if foreign_units:
        return Unsupported(
            "IOMMU",
            f"a host whose IOMMU is neither Intel VT-d nor AMD-Vi (units {', '.join(foreign_units)})",
            "Configure its IOMMU and vfio-pci by hand; gpuhost plans Intel VT-d and AMD-Vi hosts.",
        )
    if grace:
        return Unsupported(
            "GPU",
            f"a host with CPU-coherent GPUs{gpus}",
            "Bind them to nvgrace-gpu-vfio-pci by hand (Linux 6.9 or later); gpuhost binds GPUs to vfio-pci.",
        )
    return None
