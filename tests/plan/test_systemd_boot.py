"""The plan of a systemd-boot host, on the real capture of the systemd-boot lab host.

tests/fixtures/snapshots/lab-uefi-systemd-boot: `gpuhost lab up --firmware uefi --boot systemd-boot`,
systemd-boot 252 at the ESP's removable path, kernel-install's entry debian-6.1.0-50-amd64.conf
(sort-key debian) written from /etc/kernel/cmdline.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuhost.cli.views import describe_plan
from gpuhost.facts.build import build_facts
from gpuhost.facts.parsers import parse_cmdline, parse_loader_entry
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.model import (
    FSTAB_PATH,
    INITRAMFS_MODULES_PATH,
    KERNEL_CMDLINE_PATH,
    KERNEL_INSTALL_REFRESH,
    PROXMOX_BOOT_TOOL_REFRESH,
    TRIAL_MARKER,
    HostPlan,
    KernelCmdlineWriter,
)
from gpuhost.plan.verify import verify_rollback
from tests.helpers import SNAPSHOTS

CAPTURE = SNAPSHOTS / "lab-uefi-systemd-boot"
OPTIONS = ("vfio-pci.ids=1234:1111,8086:293e", "modprobe.blacklist=nouveau,nvidia,nvidiafb", "iommu=pt")


def plan(root: Path = CAPTURE, **variables: object) -> HostPlan:
    settings = PlanSettings.from_variables({"gpuhost_gpus": ["1234:1111"], **variables}, "lab-1")
    return plan_host("lab-1", build_facts(SnapshotTree(root)), settings)


def test_the_kernel_command_line_goes_through_etc_kernel_cmdline_and_kernel_install() -> None:
    result = plan()
    assert result.applicable, result.refusals
    assert result.kernel_cmdline_writer is KernelCmdlineWriter.KERNEL_INSTALL
    sdboot = result.systemd_boot
    assert sdboot is not None and sdboot.refresh_command == KERNEL_INSTALL_REFRESH
    old = (CAPTURE / "etc/kernel/cmdline").read_text().split()
    assert sdboot.current_kernel_cmdline == " ".join(old)
    assert sdboot.kernel_cmdline == " ".join((*old, *OPTIONS)) + "\n"
    # rollback restores the host's own files: /etc/kernel/cmdline, the initramfs module list, fstab
    assert set(result.backup_files) == {KERNEL_CMDLINE_PATH, INITRAMFS_MODULES_PATH, FSTAB_PATH}
    assert result.reboot_needed


def test_the_trial_is_a_copy_of_the_entry_that_booted_that_never_sorts_first() -> None:
    result = plan()
    sdboot = result.systemd_boot
    assert sdboot is not None and sdboot.default_entry == "debian-6.1.0-50-amd64.conf"
    assert sdboot.trial_entry_path == "/boot/efi/loader/entries/gpuhost-trial.conf"
    default = parse_loader_entry((CAPTURE / "boot/efi/loader/entries/debian-6.1.0-50-amd64.conf").read_text())
    trial = parse_loader_entry(sdboot.trial_entry)
    assert (trial.linux, trial.initrds, trial.version) == (default.linux, default.initrds, default.version)
    rescue = " ".join(result.rescue.kernel_options)
    assert trial.options == parse_cmdline(sdboot.kernel_cmdline + f" panic=10 {TRIAL_MARKER} {rescue}")
    assert "systemd.wants=gpuhost-trial-deadline.timer" in rescue and rescue not in sdboot.kernel_cmdline
    # Seen with bootctl on the lab host: an exact copy of the entry (sort-key debian) sorted before
    # it and was the default; without a sort-key it sorts after every kernel-install entry.
    assert default.sort_key == "debian" and trial.sort_key is None


def test_plan_says_what_happens_on_a_systemd_boot_host() -> None:
    text = "\n".join(describe_plan(plan(), show_files=True))
    assert (
        "/etc/kernel/cmdline: adds " + " ".join(OPTIONS) + "; then kernel-install add for every installed kernel"
        in text
    )
    assert "booted once by bootctl set-oneshot" in text and "/boot/efi/loader/entries/gpuhost-trial.conf" in text
    assert "GRUB" not in text and "/etc/default/grub.d" not in text


def _proxmox_copy(tmp_path: Path) -> Path:
    """The capture as a Proxmox VE host's ESP bookkeeping has it: proxmox-boot-tool installed and
    /etc/kernel/proxmox-boot-uuids listing the ESP (its vfat UUID, from the capture's fstab)."""
    root = tmp_path / "snapshot"
    shutil.copytree(CAPTURE, root)
    with (root / "commands/which.txt").open("a") as which:
        which.write("/usr/sbin/proxmox-boot-tool\n")
    (root / "etc/kernel/proxmox-boot-uuids").write_text("147C-6D2E\n")
    return root


def test_proxmox_boot_tool_writes_the_entries_where_it_manages_the_esps(tmp_path: Path) -> None:
    root = _proxmox_copy(tmp_path)
    straight = plan(root, gpuhost_trial_boot=False)
    assert straight.applicable, straight.refusals
    assert straight.kernel_cmdline_writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL
    assert straight.systemd_boot is not None and straight.systemd_boot.refresh_command == PROXMOX_BOOT_TOOL_REFRESH
    # Its ESPs are not mounted: a trial entry beside the default would not be where it boots.
    assert [r.code for r in plan(root).refusals] == ["plan.trial.proxmox_boot_tool"]


def test_proxmox_boot_tool_alone_is_not_enough(tmp_path: Path) -> None:
    """proxmox-boot-tool without /etc/kernel/proxmox-boot-uuids manages no ESP: kernel-install it is."""
    root = _proxmox_copy(tmp_path)
    (root / "etc/kernel/proxmox-boot-uuids").unlink()
    assert plan(root).kernel_cmdline_writer is KernelCmdlineWriter.KERNEL_INSTALL


def test_an_entry_without_sort_key_refuses_the_trial(tmp_path: Path) -> None:
    root = tmp_path / "snapshot"
    shutil.copytree(CAPTURE, root)
    entry = root / "boot/efi/loader/entries/debian-6.1.0-50-amd64.conf"
    entry.write_text("".join(line for line in entry.read_text().splitlines(True) if not line.startswith("sort-key")))
    refused = plan(root)
    assert [r.code for r in refused.refusals] == ["plan.trial.entry_order"]
    assert "bootctl set-default debian-6.1.0-50-amd64.conf" in refused.refusals[0].remedy
    assert plan(root, gpuhost_trial_boot=False).applicable


def test_rollback_is_checked_against_the_restored_etc_kernel_cmdline() -> None:
    """The capture is a host as rollback leaves it: /proc/cmdline is systemd-boot's initrd= and then
    the entry's options, which kernel-install wrote from /etc/kernel/cmdline."""
    result = verify_rollback("lab-1", build_facts(SnapshotTree(CAPTURE)))
    assert result["ok"], result
    assert result["expected"] == (CAPTURE / "etc/kernel/cmdline").read_text().strip()


APPLIED = SNAPSHOTS / "lab-uefi-systemd-boot-applied"


def test_a_second_apply_changes_nothing_on_the_committed_host() -> None:
    """lab-uefi-systemd-boot-applied: the same host captured after gpuhost apply committed its trial
    (still running the trial entry's kernel, as apply leaves it; the trial entry is gone)."""
    again = plan(APPLIED)
    assert again.applicable and not again.reboot_needed, again.reboot_reasons
    sdboot = again.systemd_boot
    assert sdboot is not None and sdboot.kernel_cmdline == (APPLIED / "etc/kernel/cmdline").read_text()
    facts = build_facts(SnapshotTree(APPLIED))
    assert [f.id for f in facts.firmware.loader_entries] == ["debian-6.1.0-50-amd64.conf"]
    assert facts.firmware.loader_entry_oneshot is None  # systemd-boot cleared it when it booted the trial
    assert facts.firmware.loader_entries[0].entry.options.tokens[-3:] == OPTIONS
    # Not yet rolled back: the running kernel is the trial entry's.
    assert not verify_rollback("lab-1", facts)["ok"]
