"""A lab host booted by OVMF with Secure Boot enforcing (Debian's signed shim, GRUB and kernel).

One host, booted once for the module, in order:
1. the audit of the live host says UEFI with Secure Boot enabled and shim + GRUB, and
   `mokutil --sb-state` inside the host agrees;
2. apply: trial boot, verified, committed; `gpuhost audit` READY with Secure Boot still enforcing.
What the BIOS fault suite proves of the GRUB path (refusals, killed hosts, idempotence, rollback)
is not repeated: the same drop-in and trial script, under shim and signed GRUB. Rollback under
Secure Boot removes the same files and boots the same signed kernel as the apply, so it ran here
until CI's time went over budget and is now proven on the BIOS GRUB and systemd-boot hosts only.
The panic fallback under signed GRUB (a trial kernel that panics, and GRUB's own one-shot) is in the
extended lab set: tests/lab/test_secure_boot_panic_lab.py. Building the image (once,
cached) needs root. Times are printed as [lab timing] lines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhost.cli.main import main
from gpuhost.lab.boot import boot_mode
from gpuhost.lab.paths import LabPaths
from gpuhost.plan.model import TRIAL_MARKER
from tests.lab.conftest import _timing, audit_report, on_lab_host, uefi_lab_host
from tests.lab.rollout_lab import OPTIONS

# Building the UEFI image (when not cached, ~6 min) and an OVMF boot under TCG: past the suite-wide 900 s.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

SECURE_BOOT = boot_mode("uefi-secureboot", "grub")


@pytest.fixture(scope="module")
def secure_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(SECURE_BOOT, image_dir, tmp_path_factory.mktemp("uefi-secureboot"))


def test_secure_boot_host_audits_as_uefi_with_secure_boot_enabled(
    secure_boot_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    state = on_lab_host(secure_boot_lab, "mokutil", "--sb-state")
    assert "SecureBoot enabled" in state, state
    report = audit_report(secure_boot_lab, capsys)
    firmware = report["system"]["firmware"]
    assert firmware["mode"] == "uefi" and firmware["secure_boot"] is True, firmware
    assert firmware["loader"] == "shim+grub-efi" and firmware["esp"] == "/boot/efi"
    assert firmware["cmdline_source"] == "/etc/default/grub"
    # The BMC display is the firmware's console, not the stand-in GPU.
    boot_vga = {gpu["vendor_device"]: gpu["boot_vga"] for gpu in report["gpus"]}
    assert boot_vga == {"1234:1111": False, "1013:00b8": True}


def _apply(lab: LabPaths, label: str) -> tuple[int, dict[str, Any]]:
    report = lab.root / f"{label}-report.json"
    started = time.monotonic()
    code = main(["apply", "-i", str(lab.inventory), "--yes", "--report", str(report)])
    _timing(f"secure boot {label}: apply in {time.monotonic() - started:.0f} s")
    entry: dict[str, Any] = json.loads(report.read_text())["hosts"]["lab-1"]
    return code, entry


def _secure_boot_enabled(lab: LabPaths) -> bool:
    return "SecureBoot enabled" in on_lab_host(lab, "mokutil", "--sb-state")


# What gpuhost's GRUB trial leaves while it runs, and what must be gone once it ended.
TRIAL_LEFTOVERS = (
    "ls /etc/default/gpuhost-trial.cfg /etc/default/grub.d/gpuhost.cfg 2>&1; "
    "grep -c gpuhost-trial /boot/grub/grub.cfg || true"
)


def test_apply_trial_boot_commit_and_audit_ready_with_secure_boot_enabled(
    secure_boot_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    lab = secure_boot_lab
    with capsys.disabled():  # the test's capsys would swallow the timing line
        code, entry = _apply(lab, "apply")
    assert code == 0 and entry["status"] == "ready" and entry["rebooted"] is True, entry
    running = on_lab_host(lab, "cat", "/proc/cmdline").split()
    # The kernel running now is the trial entry's (booted once under signed GRUB, then committed).
    assert TRIAL_MARKER in running and "panic=10" in running and set(OPTIONS) <= set(running), running
    assert on_lab_host(lab, "mokutil", "--sb-state").strip() == "SecureBoot enabled"
    committed = on_lab_host(
        lab,
        "sh",
        "-c",
        TRIAL_LEFTOVERS + "; grub-editenv /boot/grub/grubenv list; "
        "awk '/^menuentry /{n++} n==1 && /linux\\t/{print; exit}' /boot/grub/grub.cfg",
    )
    # The trial settings are gone, the drop-in is there, grub.cfg has no trial entry.
    assert committed.count("No such file") == 1 and "/etc/default/gpuhost-trial.cfg" in committed, committed
    assert "\n/etc/default/grub.d/gpuhost.cfg\n0\n" in committed, committed
    assert "next_entry=gpuhost" not in committed, committed
    default_line = committed.splitlines()[-1]
    assert all(option in default_line for option in OPTIONS) and "panic=" not in default_line, committed
    report = audit_report(lab, capsys)
    assert report["ready"] is True, report["findings"]
    firmware = report["system"]["firmware"]
    assert firmware["secure_boot"] is True and firmware["loader"] == "shim+grub-efi", firmware
