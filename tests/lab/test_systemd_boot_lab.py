"""A lab host booted by OVMF and systemd-boot, its kernel command line in /etc/kernel/cmdline.

One host, one boot: systemd-boot (not the firmware's menu) started the kernel from kernel-install's
loader entry on the ESP, `bootctl status` inside the host says so, and the audit names the loader
and the file its command line comes from. Building the image (once, cached) needs root.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from gpuhost.lab import fleet
from gpuhost.lab import image as lab_image
from gpuhost.lab.boot import boot_mode
from gpuhost.lab.paths import LabPaths
from tests.lab.conftest import BOOT_TIMEOUT, MEMORY_MIB, _timing

# An uncached image build and an OVMF boot under TCG pass the suite-wide 900 s.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

SYSTEMD_BOOT = boot_mode("uefi", "systemd-boot")


@pytest.fixture(scope="module")
def systemd_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    if not SYSTEMD_BOOT.ovmf or not SYSTEMD_BOOT.ovmf.code.exists():
        pytest.skip("needs Debian's ovmf package (apt-get install ovmf)")
    for program in ("qemu-system-x86_64", "qemu-img", "ssh"):
        if shutil.which(program) is None:
            pytest.skip(f"lab tests need {program}")
    paths = LabPaths(root=tmp_path_factory.mktemp("uefi-systemd-boot"), images=image_dir)
    if lab_image.find_image(paths, "base", SYSTEMD_BOOT.layout) is None and os.geteuid() != 0:
        pytest.skip(f"no cached systemd-boot lab image in {image_dir} and building one needs root")
    started = time.monotonic()
    try:
        fleet.up(paths, hosts=1, memory_mib=MEMORY_MIB, boot=SYSTEMD_BOOT, timeout=BOOT_TIMEOUT)
        _timing(f"uefi + systemd-boot host up in {time.monotonic() - started:.0f} s")
        yield paths
    finally:
        fleet.down(paths)


def _on_host(lab: LabPaths, *command: str) -> str:
    result = fleet.run_on(lab, fleet.find_host(lab, "lab-1"), list(command), timeout=600)
    assert result.returncode == 0, f"{command}: {result.stdout}{result.stderr}"
    return result.stdout


def _audit(lab: LabPaths, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    main(["audit", "-i", str(lab.inventory), "--json"])
    report: dict[str, object] = json.loads(capsys.readouterr().out.splitlines()[0])
    return report


def test_systemd_boot_started_the_kernel_from_kernel_installs_entry(
    systemd_boot_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _on_host(systemd_boot_lab, "bootctl", "status", "--no-pager")
    assert "Product: systemd-boot" in status, status
    kernel = _on_host(systemd_boot_lab, "uname", "-r").strip()
    # The entry that booted is kernel-install's, named after /etc/kernel/entry-token.
    assert f"debian-{kernel}.conf" in status, status
    report = _audit(systemd_boot_lab, capsys)
    firmware = report["system"]["firmware"]  # type: ignore[index]
    assert firmware["mode"] == "uefi" and firmware["secure_boot"] is False, firmware
    assert firmware["loader"] == "systemd-boot" and firmware["esp"] == "/boot/efi", firmware
    assert firmware["cmdline_source"] == "/etc/kernel/cmdline", firmware
