"""A lab host booted by OVMF with Secure Boot enforcing (Debian's signed shim, GRUB and kernel).

One host, booted once for the module, in order:
1. the audit of the live host says UEFI with Secure Boot enabled and shim + GRUB, and
   `mokutil --sb-state` inside the host agrees;
2. panic fallback under signed GRUB: apply's trial kernel panics for real (the testing-only
   rdinit= option), panic=10 reboots it, signed GRUB has consumed its one-shot next_entry in
   /boot/grub/grubenv (the ESP's stub points GRUB at /boot/grub; there is no grubenv on the ESP),
   the host comes back on its old command line, the report says "trial reverted" and nothing of
   gpuhost's trial is left;
3. apply: trial boot, verified, committed; `gpuhost audit` READY with Secure Boot still enforcing.
What the BIOS fault suite proves of the GRUB path (refusals, killed hosts, idempotence, rollback)
is not repeated: the same drop-in and trial script, under shim and signed GRUB. Rollback under
Secure Boot removes the same files and boots the same signed kernel as tests 2 and 3, so it ran
here until CI's time went over budget (issue 26) and is now proven on the BIOS GRUB and
systemd-boot hosts only. Building the image (once,
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
from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab import fleet
from gpuhost.lab.boot import boot_mode
from gpuhost.lab.paths import LabPaths
from gpuhost.plan.model import TRIAL_MARKER
from tests.lab.conftest import _timing, audit_report, on_lab_host, uefi_lab_host
from tests.lab.rollout_lab import OPTIONS, PANIC_TRIAL_OPTION, console_since, panicked_and_rebooted

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


@pytest.fixture(scope="module")
def original_cmdline(secure_boot_lab: LabPaths) -> list[str]:
    return on_lab_host(secure_boot_lab, "cat", "/proc/cmdline").split()


def test_panicking_trial_kernel_under_signed_grub_comes_back_on_the_old_command_line(
    secure_boot_lab: LabPaths, original_cmdline: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = secure_boot_lab
    # Where signed GRUB keeps its environment block on this layout: the stub on the ESP (shim starts
    # grubx64.efi, which reads \EFI\BOOT\grub.cfg) sets GRUB's prefix to /boot/grub on the root
    # file system, and load_env/save_env use $prefix/grubenv; the ESP holds no grubenv of its own.
    layout = on_lab_host(
        lab,
        "sh",
        "-c",
        "cat /boot/efi/EFI/BOOT/grub.cfg; echo ---; find /boot/efi -iname 'grubenv*'; echo ---; "
        "findmnt -no UUID,FSTYPE -T /boot/grub; echo ---; grep -c 'load_env' /boot/grub/grub.cfg || true",
    ).split("---\n")
    uuid, fstype = layout[2].split()
    assert f"search.fs_uuid {uuid} root" in layout[0] and "set prefix=($root)'/boot/grub'" in layout[0], layout
    assert layout[1] == "" and fstype == "ext4", layout
    record = fleet.find_host(lab, "lab-1")
    serial_log = Path(record.serial_log)
    offset = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, PANIC_TRIAL_OPTION)
    started = time.monotonic()
    code, entry = _apply(lab, "panic")
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "came back without the trial entry" in entry["message"], entry
    trial = panicked_and_rebooted(console_since(serial_log, offset), TRIAL_MARKER)
    # The trial kernel was signed GRUB's trial entry, booted with Secure Boot enforcing.
    assert PANIC_TRIAL_OPTION in trial.splitlines()[0] and "Secure boot enabled" in trial, trial[:3000]
    # GRUB itself cleared the one-shot: grub-reboot wrote next_entry=gpuhost-trial to /boot/grub/grubenv,
    # and only GRUB's `set next_entry=; save_env next_entry` leaves the variable there empty.
    grubenv = on_lab_host(lab, "grub-editenv", "/boot/grub/grubenv", "list")
    assert "next_entry=\n" in grubenv, grubenv
    assert on_lab_host(lab, "cat", "/proc/cmdline").split() == original_cmdline
    assert _secure_boot_enabled(lab)
    left = on_lab_host(lab, "sh", "-c", TRIAL_LEFTOVERS)
    assert left.count("No such file") == 2 and left.strip().endswith("0"), left
    _timing(f"secure boot panic fallback (two boots) in {time.monotonic() - started:.0f} s")


def test_apply_trial_boot_commit_and_audit_ready_with_secure_boot_enabled(
    secure_boot_lab: LabPaths, original_cmdline: list[str], capsys: pytest.CaptureFixture[str]
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
