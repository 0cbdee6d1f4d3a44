"""A lab host booted by OVMF and systemd-boot, its kernel command line in /etc/kernel/cmdline.

One host, in order: systemd-boot (not the firmware's menu) started the kernel from kernel-install's
loader entry on the ESP, and the audit names the loader and its file (and the BMC display, not the
stand-in GPU, as the boot VGA); gpuhost apply boots the one-shot trial entry, verifies it and
commits (the default entry carries the options, the trial entry and the one-shot variable are gone,
the audit says READY); gpuhost rollback brings the old command line back, and every file of the
host's as it was before the first apply, the operator's own modprobe.d, fstab and GRUB drop-in
written before it included. What the BIOS fault suite proves of apply (faults, reverts, idempotence)
is not repeated: this is the systemd-boot path of the same engine. The trial's rescues on
systemd-boot (the root-device hang, the userspace and the kernel stall) are in the extended lab set
(test_systemd_boot_hangs_lab.py, test_systemd_boot_kernel_stall_lab.py). Building the image (once)
needs root.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from gpuhost.lab.paths import LabPaths
from gpuhost.plan.model import TRIAL_MARKER
from tests.lab.conftest import _timing, audit_report, on_lab_host, uefi_lab_host
from tests.lab.rollout_lab import (
    MANIFEST_SCRIPT,
    Manifest,
    manifest_differences,
    parse_manifest,
)
from tests.lab.systemd_boot_host import ENTRIES, ONESHOT_VARIABLE, SYSTEMD_BOOT

# An uncached image build and an OVMF boot under TCG pass the suite-wide 900 s. On lab-faults: the
# fault suite's hang faults went to the extended set, and lab-rest carries its one module a run.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-faults")]


@pytest.fixture(scope="module")
def systemd_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(SYSTEMD_BOOT, image_dir, tmp_path_factory.mktemp("uefi-systemd-boot"))


def test_systemd_boot_started_the_kernel_from_kernel_installs_entry(
    systemd_boot_lab: LabPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    status = on_lab_host(systemd_boot_lab, "bootctl", "status", "--no-pager")
    assert "Product: systemd-boot" in status, status
    kernel = on_lab_host(systemd_boot_lab, "uname", "-r").strip()
    # The entry that booted is kernel-install's, named after /etc/kernel/entry-token.
    assert f"debian-{kernel}.conf" in status, status
    report = audit_report(systemd_boot_lab, capsys)
    firmware = report["system"]["firmware"]
    assert firmware["mode"] == "uefi" and firmware["secure_boot"] is False, firmware
    assert firmware["loader"] == "systemd-boot" and firmware["esp"] == "/boot/efi", firmware
    assert firmware["cmdline_source"] == "/etc/kernel/cmdline", firmware
    # OVMF's console and efifb are the BMC's display here, as under BIOS: the stand-in GPU is not boot VGA.
    boot_vga = {gpu["vendor_device"]: gpu["boot_vga"] for gpu in report["gpus"]}
    assert boot_vga == {"1234:1111": False, "1013:00b8": True}, boot_vga


OPTIONS = ("vfio-pci.ids=1234:1111,8086:293e", "modprobe.blacklist=nouveau,nvidia,nvidiafb", "iommu=pt")
# An operator's own files before gpuhost's first apply: an `options vfio-pci ids=` continued
# over two lines, fstab entries (the last without a newline at its end) and a GRUB drop-in.
OPERATOR_FILES = (
    "printf '# the site list\\noptions vfio-pci \\\\\\n    ids=10de:2330\\n' > /etc/modprobe.d/vfio-site.conf; "
    "printf '# scratch, mounted by hand\\ntmpfs /mnt/site-scratch tmpfs noauto,nofail,size=8m 0 0' >> /etc/fstab; "
    "mkdir -p /etc/default/grub.d; "
    "printf 'GRUB_CMDLINE_LINUX_DEFAULT=\"$GRUB_CMDLINE_LINUX_DEFAULT quiet\"\\n' > /etc/default/grub.d/50-site.cfg"
)


def _manifest(lab: LabPaths) -> Manifest:
    return parse_manifest(on_lab_host(lab, "sh", "-s", stdin=MANIFEST_SCRIPT))


@pytest.fixture(scope="module")
def before_first_apply(systemd_boot_lab: LabPaths) -> Manifest:
    """The host with the operator's own files, before any apply: what rollback must leave."""
    on_lab_host(systemd_boot_lab, "sh", "-c", OPERATOR_FILES)
    assert "ids=10de:2330" in on_lab_host(systemd_boot_lab, "cat", "/etc/modprobe.d/vfio-site.conf")
    return _manifest(systemd_boot_lab)


def test_apply_boots_the_one_shot_trial_entry_verifies_and_commits(
    systemd_boot_lab: LabPaths, capsys: pytest.CaptureFixture[str], before_first_apply: Manifest
) -> None:
    old_cmdline = on_lab_host(systemd_boot_lab, "cat", "/etc/kernel/cmdline").split()
    report_path = systemd_boot_lab.root / "apply-report.json"
    started = time.monotonic()
    code = main(["apply", "-i", str(systemd_boot_lab.inventory), "--yes", "--report", str(report_path)])
    with capsys.disabled():  # the test's capsys would swallow the timing line
        _timing(f"systemd-boot apply (trial boot, commit) in {time.monotonic() - started:.0f} s")
    entry = json.loads(report_path.read_text())["hosts"]["lab-1"]
    assert code == 0 and entry["status"] == "ready" and entry["rebooted"] is True, entry
    running = on_lab_host(systemd_boot_lab, "cat", "/proc/cmdline").split()
    # The kernel running now is the trial entry's (booted once, then committed without a reboot).
    assert TRIAL_MARKER in running and "panic=10" in running and set(OPTIONS) <= set(running), running
    assert on_lab_host(systemd_boot_lab, "cat", "/etc/kernel/cmdline").split() == [*old_cmdline, *OPTIONS]
    kernel = on_lab_host(systemd_boot_lab, "uname", "-r").strip()
    assert on_lab_host(systemd_boot_lab, "ls", ENTRIES).split() == [f"debian-{kernel}.conf"]  # no trial entry
    default = on_lab_host(systemd_boot_lab, "cat", f"{ENTRIES}/debian-{kernel}.conf")
    assert f"options    {' '.join([*old_cmdline, *OPTIONS])}" in default.splitlines(), default
    # systemd-boot cleared the one-shot when it booted the trial entry.
    assert on_lab_host(systemd_boot_lab, "sh", "-c", f"test -e {ONESHOT_VARIABLE} || echo gone").strip() == "gone"
    report = audit_report(systemd_boot_lab, capsys)
    assert report["ready"] is True, report["findings"]


def test_rollback_restores_the_old_kernel_command_line(
    systemd_boot_lab: LabPaths, before_first_apply: Manifest
) -> None:
    """And after the committed apply, every file of the host's (/etc,
    the loader entries) and /proc/cmdline are as before the first apply; the loader entries are written
    again by kernel-install (the facts say systemd-boot), not by update-grub."""
    expected = [t for t in on_lab_host(systemd_boot_lab, "cat", "/etc/kernel/cmdline").split() if t not in OPTIONS]
    started = time.monotonic()
    code = main(["rollback", "-i", str(systemd_boot_lab.inventory), "--limit", "lab-1", "--yes"])
    _timing(f"systemd-boot rollback (with its reboot) in {time.monotonic() - started:.0f} s")
    assert code == 0
    assert on_lab_host(systemd_boot_lab, "cat", "/etc/kernel/cmdline").split() == expected
    running = on_lab_host(systemd_boot_lab, "cat", "/proc/cmdline").split()
    assert running[0].startswith("initrd=") and running[1:] == expected, running
    differences = manifest_differences(before_first_apply, _manifest(systemd_boot_lab))
    assert not differences, "rollback is not apply's inverse; differing:\n" + "\n".join(differences)
