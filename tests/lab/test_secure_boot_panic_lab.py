"""The panic fallback under Secure Boot (the extended lab set, tests/lab/rotation.py): one host booted
by OVMF with Secure Boot enforcing (Debian's signed shim, GRUB and kernel). Apply's trial kernel panics
for real (the testing-only rdinit= option), panic=10 reboots it, and signed GRUB has consumed its
one-shot next_entry in /boot/grub/grubenv (the ESP's stub points GRUB at /boot/grub; there is no
grubenv on the ESP): the host comes back on its old command line with Secure Boot still enforcing,
the report says "trial reverted" and nothing of gpuhost's trial is left. Apply and its commit under
Secure Boot are tests/lab/test_uefi_lab.py (every landing).

Run alone: `GPUHOST_LAB_EXTENDED=test_secure_boot_panic_lab.py pytest -m lab
tests/lab/test_secure_boot_panic_lab.py -n 0 -s`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab import fleet
from gpuhost.lab.paths import LabPaths
from gpuhost.plan.model import TRIAL_MARKER

from .conftest import _timing, on_lab_host, uefi_lab_host
from .rollout_lab import PANIC_TRIAL_OPTION, console_since, panicked_and_rebooted
from .test_uefi_lab import SECURE_BOOT, TRIAL_LEFTOVERS, _apply, _secure_boot_enabled

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]


@pytest.fixture(scope="module")
def secure_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(SECURE_BOOT, image_dir, tmp_path_factory.mktemp("uefi-secureboot-panic"))


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
