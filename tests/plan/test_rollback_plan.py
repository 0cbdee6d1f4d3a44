"""The rollback plan (gpuhost.plan.rollback) as data: one list of files with apply's plan, the boot
loader's refresh from the host's facts, and the records apply leaves read back from real `find` output."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from gpuhost.facts.model import HostFacts
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.files import GPUHOST_FILES
from gpuhost.plan.model import (
    FSTAB_PATH,
    INITRAMFS_MODULES_PATH,
    KERNEL_CMDLINE_PATH,
    KERNEL_INSTALL_REFRESH,
    PROXMOX_BOOT_TOOL_REFRESH,
    FileState,
    HostPlan,
)
from gpuhost.plan.rollback import Backups, BackupsUnreadable, parse_backups, plan_rollback, read_backups_command
from tests.helpers import SNAPSHOTS, snapshot_facts

SETTINGS = [
    {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 0},
    {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 0, "gpuhost_trial_boot": False},
    {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1, "gpuhost_hugetlbfs_mount": "/mnt/hugepages-1G"},
]


def applicable_plans() -> list[tuple[str, HostFacts, HostPlan]]:
    """Every capture's plan that apply would carry out, under each of SETTINGS."""
    plans = []
    for snapshot in sorted(p.name for p in SNAPSHOTS.iterdir()):
        facts = snapshot_facts(snapshot)
        for variables in SETTINGS:
            plan = plan_host(snapshot, facts, PlanSettings.from_variables(variables, snapshot))
            if plan.applicable:
                plans.append((snapshot, facts, plan))
    return plans


def every_path(plan: HostPlan) -> list[str]:
    return [c.path for c in (*plan.files.configure, *plan.files.commit, *plan.files.revert)]


def test_the_rollback_undoes_every_path_of_every_plan_and_each_as_apply_rebuilds_it() -> None:
    """One list: each path apply's phases change is gpuhost's (removed) or recorded (put back), never
    both, and the rollback rebuilds after it what apply rebuilt after it."""
    plans = applicable_plans()
    assert {name for name, _, _ in plans} >= {"lab-gpu-pair-fresh", "lab-uefi-systemd-boot"}
    assert any(plan.hugepages.mount_point for _, _, plan in plans)
    for name, facts, plan in plans:
        assert not set(plan.backup_files) & set(GPUHOST_FILES), name
        assert set(every_path(plan)) <= set(GPUHOST_FILES) | set(plan.backup_files), name
        # As apply leaves it: the mount point was not there; every other recorded path was copied.
        mount = plan.hugepages.mount_point
        backups = Backups(copied=tuple(p for p in plan.backup_files if p != mount), absent=(mount,) if mount else ())
        rollback = plan_rollback(name, facts, backups, 900)
        undone = {change.path: change for change in rollback.files}
        for change in (*plan.files.configure, *plan.files.commit, *plan.files.revert):
            assert change.path in undone, (name, change.path)
            if change.regenerates is not None:
                assert undone[change.path].regenerates is change.regenerates, (name, change.path)
        assert undone[FSTAB_PATH].state is FileState.RESTORED and undone[FSTAB_PATH].marker
        if mount:
            assert undone[mount].state is FileState.ABSENT


def test_a_host_applied_by_an_earlier_gpuhost_loses_its_blocks_without_a_copy() -> None:
    rollback = plan_rollback("lab-1", snapshot_facts("lab-gpu-pair-fresh"), Backups((), ()), 900)
    blocks = {c.path: c for c in rollback.files if c.state is FileState.BLOCK}
    assert set(blocks) == {INITRAMFS_MODULES_PATH, FSTAB_PATH} and not any(c.content for c in blocks.values())
    assert any("no record of apply" in note for note in rollback.notes)


def test_systemd_boot_is_refreshed_from_the_facts_not_by_the_tools_a_host_has() -> None:
    """The rollback role chose update-grub wherever /usr/sbin/update-grub existed: a systemd-boot host
    with GRUB's tools (Proxmox VE on ZFS) kept its gpuhost loader entries. The facts say which loader boots."""
    systemd_boot = snapshot_facts("lab-uefi-systemd-boot")
    rollback = plan_rollback("lab-1", systemd_boot, Backups((KERNEL_CMDLINE_PATH,), ()), 900)
    assert rollback.rebuild == {"initramfs": "update-initramfs -u -k all", "loader-entries": KERNEL_INSTALL_REFRESH}
    restored = next(c for c in rollback.files if c.path == KERNEL_CMDLINE_PATH)
    assert restored.state is FileState.RESTORED and restored.regenerates.value == "loader-entries"
    assert "/boot/efi/loader/entries/gpuhost-trial.conf" in [c.path for c in rollback.files]
    proxmox = dataclasses.replace(
        systemd_boot,
        firmware=dataclasses.replace(systemd_boot.firmware, proxmox_boot_tool=True),
        bootloader=dataclasses.replace(systemd_boot.bootloader, has_proxmox_boot_tool=True),
    )
    assert plan_rollback("pve", proxmox, Backups((), ()), 900).rebuild["loader-entries"] == PROXMOX_BOOT_TOOL_REFRESH
    grub = plan_rollback("lab-1", snapshot_facts("lab-gpu-pair-fresh"), Backups((), ()), 900)
    assert grub.rebuild == {"initramfs": "update-initramfs -u -k all", "grub": "update-grub"}


def test_the_records_are_read_back_from_the_hosts_own_find_output(tmp_path: Path) -> None:
    backup_dir = tmp_path / "backup"
    for path in ("etc/fstab", "etc/modprobe.d/vfio conf.conf", "etc/kernel/cmdline"):
        (backup_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (backup_dir / path).write_text("x\n")
    (backup_dir / "etc/link").symlink_to("fstab")
    command = read_backups_command(str(backup_dir))
    assert parse_backups(subprocess.run(["sh", "-c", command], capture_output=True).stdout, str(backup_dir)) == Backups(
        ("/etc/fstab", "/etc/kernel/cmdline", "/etc/link", "/etc/modprobe.d/vfio conf.conf"), ()
    )
    Path(f"{backup_dir}-absent.json").write_text(json.dumps(["/mnt/hugepages-1G"]))
    output = subprocess.run(["sh", "-c", command], capture_output=True).stdout
    assert parse_backups(output, str(backup_dir)).absent == ("/mnt/hugepages-1G",)
    nothing = subprocess.run(["sh", "-c", read_backups_command(str(tmp_path / "none"))], capture_output=True)
    assert parse_backups(nothing.stdout, str(tmp_path / "none")) == Backups((), ())
    Path(f"{backup_dir}-absent.json").write_text('{"not": "a list"}')
    with pytest.raises(BackupsUnreadable, match="not a list of absolute paths"):
        parse_backups(subprocess.run(["sh", "-c", command], capture_output=True).stdout, str(backup_dir))
