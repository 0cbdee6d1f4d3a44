"""A lab host booted by OVMF without Secure Boot, through shim and Debian's signed GRUB.

Without Secure Boot, Debian's GRUB 2.06 boots Linux through its own loader and gives the kernel the
framebuffer of the first of its video drivers that sets the mode. Its native bochs driver takes any
1234:1111 VGA, so it took the stand-in GPU and efifb took its BAR 0 (the lab-uefi capture). The
lab's UEFI GRUB disk asks for a mode that only GRUB's cirrus driver sets, the BMC display's
(recipe.EFI_GRUB_GFXPAYLOAD). One host, in order:
1. booted from the image's own grub.cfg: the audit says UEFI, Secure Boot disabled, shim + GRUB;
   the BMC display is the boot VGA with efifb on its BAR 0, and no `gpu.boot_display` finding;
2. after update-grub (the grub.cfg that apply's trial boot and commit boot from) and a reboot:
   the same.
Apply's trial, commit, panic fallback and rollback on this disk run under Secure Boot
(test_uefi_lab.py); without it only the video handover differs, which is what this module proves.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.lab import fleet
from gpuhost.lab.boot import boot_mode
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.recipe import EFI_GRUB_GFXPAYLOAD
from tests.lab.conftest import _timing, audit_report, on_lab_host, uefi_lab_host

# An uncached image build and an OVMF boot under TCG pass the suite-wide 900 s. On lab-rest: with the
# trial's hang rescues in the extended set, lab-faults (the fault suite, systemd-boot's apply and
# rollback, numa-gpus) is the longer group even with the extended module on lab-rest.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

UEFI_GRUB = boot_mode("uefi", "grub")
BMC_DISPLAY = "0000:00:02.0"


@pytest.fixture(scope="module")
def uefi_grub_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(UEFI_GRUB, image_dir, tmp_path_factory.mktemp("uefi-grub"))


def _assert_bmc_display_is_the_boot_display(lab: LabPaths, capsys: pytest.CaptureFixture[str]) -> None:
    kernel_log = on_lab_host(lab, "dmesg")
    assert f"pci {BMC_DISPLAY}: BAR 0: assigned to efifb" in kernel_log, kernel_log
    mode = re.search(r"efifb: mode is (\d+x\d+x\d+)", kernel_log)
    assert mode is not None and mode.group(1) == EFI_GRUB_GFXPAYLOAD, kernel_log
    report = audit_report(lab, capsys)
    firmware = report["system"]["firmware"]
    assert firmware["mode"] == "uefi" and firmware["secure_boot"] is False, firmware
    assert firmware["loader"] == "shim+grub-efi" and firmware["cmdline_source"] == "/etc/default/grub", firmware
    boot_vga = {gpu["vendor_device"]: gpu["boot_vga"] for gpu in report["gpus"]}
    assert boot_vga == {"1234:1111": False, "1013:00b8": True}, boot_vga
    assert "gpu.boot_display" not in [finding["code"] for finding in report["findings"]], report["findings"]


def test_the_images_grub_cfg_hands_the_kernel_the_bmc_display(
    uefi_grub_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    _assert_bmc_display_is_the_boot_display(uefi_grub_lab, capsys)


def test_update_grubs_entries_hand_the_kernel_the_bmc_display_after_a_reboot(
    uefi_grub_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """apply regenerates grub.cfg with update-grub: its entries (and the trial entry cloned from
    the first) must carry the mode from /etc/default/grub, and the host boots them."""
    on_lab_host(uefi_grub_lab, "update-grub")
    generated = on_lab_host(uefi_grub_lab, "cat", "/boot/grub/grub.cfg")
    assert f"set linux_gfx_mode={EFI_GRUB_GFXPAYLOAD}" in generated, generated
    assert "gpuhost lab" not in generated, "update-grub left the image's hand-written grub.cfg"
    seconds = fleet.reboot(uefi_grub_lab, "lab-1", timeout=900)
    _timing(f"uefi + grub: reboot through update-grub's grub.cfg in {seconds:.0f} s")
    _assert_bmc_display_is_the_boot_display(uefi_grub_lab, capsys)
