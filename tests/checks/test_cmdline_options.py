"""What the audit makes of the kernel command line's options (gpuhost.cmdline's table), on real captures:
the lab's UEFI GRUB host with the lines a real host would have edited."""

from __future__ import annotations

from pathlib import Path

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.policy import Role
from gpuhost.selection import GpuSelector
from tests import test_audit_cases as cases

LAB_GPU = AuditPolicy(gpus=GpuSelector.parse(["1234:1111"], "test"), role=Role.HOST)
# The host's own options and gpuhost's, beside options that are neither (quiet, console=).
EXTRA = (
    "vfio-pci.ids=1234:1111,8086:293e intel_iommu=on hugepages=64 hugepagesz=1G pcie_aspm=off pci=realloc nomodeset "
    "video=efifb:off pcie_acs_override=downstream quiet"
)


def _findings(edit: dict[str, dict[str, object]], tmp_path: Path):
    """The audit of the lab's UEFI GRUB host (tests/fixtures/snapshots/lab-uefi) with `edit` applied."""
    facts = build_facts(SnapshotTree(cases.derive_snapshot({"base": "lab-uefi", "edit": edit}, tmp_path)))
    return run_checks("lab-uefi", facts, LAB_GPU)[2]


def test_a_grub_line_the_running_kernel_lacks_is_a_pending_reboot_for_every_passthrough_option(tmp_path: Path):
    grub = "GRUB_CMDLINE_LINUX=console=ttyS0,115200n8 no_timer_check mitigations=off"
    findings = _findings({"commands/grub-effective.txt": {"replace": [grub, f"{grub} {EXTRA}"]}}, tmp_path)
    (pending,) = [f for f in findings if f.code == "cmdline.pending_reboot"]
    named = pending.message.split("GRUB has ")[1].split(" which the running kernel lacks")[0].split()
    assert named == sorted(EXTRA.split()[:-1]), pending.message  # all but quiet
    assert "quiet" not in pending.message


def test_an_ignored_file_is_reported_for_every_option_gpuhost_writes_and_the_audits_own(tmp_path: Path):
    """bootloader.cmdline_ignored names every option gpuhost writes (set in a file the boot loader never
    reads, none reaches the kernel), and the host's own passthrough options (amd_iommu, video); not
    pcie_acs_override (harmless where it does not act), the host's own others, nor the loader's."""
    line = f"root=UUID=90d9f22d-7da0-4412-b3e3-26287fa20a66 ro {EXTRA}\n"
    findings = _findings({"etc/kernel/cmdline": {"write": line}}, tmp_path)
    (ignored,) = [f for f in findings if f.code == "bootloader.cmdline_ignored"]
    named = ignored.message.split(" sets ")[1].split(" but ")[0].split()
    expected = [token for token in EXTRA.split() if not token.startswith(("pcie_acs_override", "quiet"))]
    assert named == expected, ignored.message
    for unnamed in ("pcie_acs_override", "quiet", "root="):
        assert unnamed not in ignored.message.split(" but ")[0], unnamed
