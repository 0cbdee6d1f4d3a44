"""A lab host booted by OVMF with Secure Boot enforcing (Debian's signed shim, GRUB and kernel).

One host, one boot: the audit of the live host says UEFI with Secure Boot enabled and shim + GRUB,
and `mokutil --sb-state` inside the host agrees. Building the image (once, cached) needs root.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from gpuhost.lab import fleet
from gpuhost.lab.boot import boot_mode
from gpuhost.lab.paths import LabPaths
from tests.lab.conftest import uefi_lab_host

# Building the UEFI image (when not cached, ~6 min) and an OVMF boot under TCG: past the suite-wide 900 s.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

SECURE_BOOT = boot_mode("uefi-secureboot", "grub")


@pytest.fixture(scope="module")
def secure_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(SECURE_BOOT, image_dir, tmp_path_factory.mktemp("uefi-secureboot"))


def test_secure_boot_host_audits_as_uefi_with_secure_boot_enabled(
    secure_boot_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    record = fleet.find_host(secure_boot_lab, "lab-1")
    state = fleet.run_on(secure_boot_lab, record, ["mokutil", "--sb-state"], timeout=300)
    assert "SecureBoot enabled" in state.stdout, state.stdout + state.stderr
    main(["audit", "-i", str(secure_boot_lab.inventory), "--json"])
    report = json.loads(capsys.readouterr().out.splitlines()[0])
    firmware = report["system"]["firmware"]
    assert firmware["mode"] == "uefi" and firmware["secure_boot"] is True, firmware
    assert firmware["loader"] == "shim+grub-efi" and firmware["esp"] == "/boot/efi"
    assert firmware["cmdline_source"] == "/etc/default/grub"
    # The BMC display is the firmware's console, not the stand-in GPU.
    boot_vga = {gpu["vendor_device"]: gpu["boot_vga"] for gpu in report["gpus"]}
    assert boot_vga == {"1234:1111": False, "1013:00b8": True}
