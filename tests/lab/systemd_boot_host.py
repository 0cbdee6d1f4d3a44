"""What the systemd-boot lab modules share: the boot mode, where its loader entries and one-shot
variable are, an apply with testing-only options on the trial entry, and the state a reverted trial
must leave (tests/lab/test_systemd_boot_lab.py, test_systemd_boot_hangs_lab.py,
test_systemd_boot_kernel_stall_lab.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.cli.main import main
from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab import fleet
from gpuhost.lab.boot import boot_mode
from gpuhost.lab.paths import LabPaths

from .conftest import _timing, on_lab_host

SYSTEMD_BOOT = boot_mode("uefi", "systemd-boot")
ONESHOT_VARIABLE = "/sys/firmware/efi/efivars/LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
ENTRIES = "/boot/efi/loader/entries"


@dataclass(frozen=True)
class BootState:
    """What a reverted trial must leave as it was: the running and configured command lines and
    the default loader entry."""

    running: list[str]
    kernel_cmdline: str
    kernel: str
    default_entry: str


def boot_state(lab: LabPaths) -> BootState:
    kernel = on_lab_host(lab, "uname", "-r").strip()
    return BootState(
        running=on_lab_host(lab, "cat", "/proc/cmdline").split(),
        kernel_cmdline=on_lab_host(lab, "cat", "/etc/kernel/cmdline"),
        kernel=kernel,
        default_entry=on_lab_host(lab, "cat", f"{ENTRIES}/debian-{kernel}.conf"),
    )


@dataclass(frozen=True)
class TrialRun:
    code: int
    entry: dict[str, Any]  # the host's entry of apply's JSON report
    console: str  # the host's serial console during the apply


def apply_with_trial_options(
    lab: LabPaths, monkeypatch: pytest.MonkeyPatch, label: str, options: str, **host_settings: Any
) -> TrialRun:
    """`gpuhost apply` of the lab's one host with testing-only `options` on its trial entry (and
    `host_settings` added to its inventory entry)."""
    inventory = lab.inventory
    if host_settings:
        loaded = yaml.safe_load(lab.inventory.read_text())
        loaded["all"]["hosts"]["lab-1"].update(host_settings)
        inventory = lab.root / f"{label}-inventory.yml"
        inventory.write_text(yaml.safe_dump(loaded))
    serial_log = Path(fleet.find_host(lab, "lab-1").serial_log)
    offset = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, options)
    report_path = lab.root / f"{label}-report.json"
    started = time.monotonic()
    code = main(["apply", "-i", str(inventory), "--yes", "--report", str(report_path)])
    _timing(f"systemd-boot {label}: apply in {time.monotonic() - started:.0f} s")
    with serial_log.open("rb") as log:
        log.seek(offset)
        console = log.read().decode(errors="replace")
    return TrialRun(code, json.loads(report_path.read_text())["hosts"]["lab-1"], console)


def assert_reverted(lab: LabPaths, before: BootState) -> None:
    """The host is back on its old boot: the same command line running and configured, the same
    default entry, no trial entry, and the one-shot variable spent (systemd-boot removed it as it
    booted the trial entry)."""
    assert on_lab_host(lab, "cat", "/proc/cmdline").split() == before.running
    assert on_lab_host(lab, "sh", "-c", f"test -e {ONESHOT_VARIABLE} || echo gone").strip() == "gone"
    assert on_lab_host(lab, "ls", ENTRIES).split() == [f"debian-{before.kernel}.conf"]  # no trial entry
    assert on_lab_host(lab, "cat", "/etc/kernel/cmdline") == before.kernel_cmdline
    # The default entry is as it was (whatever update-initramfs's hooks wrote, from the same cmdline).
    assert on_lab_host(lab, "cat", f"{ENTRIES}/debian-{before.kernel}.conf") == before.default_entry
