"""Faults 4 and 5 and rollback on a lab host of their own (issue 7), beside the fault suite.

4. an invalid /etc/default/grub is refused, nothing written; then an unusual but valid one (CRLF,
   single quotes, a continuation, a cloud drop-in overriding the variable, an old vfio-pci.ids=)
5. plus a conflicting `options vfio-pci ids=` in modprobe.d: trial boot, commit, exactly one
   correct setting, the modprobe.d line commented out and its original backed up;
rollback: `gpuhost rollback --limit A`: the host's own old command line and the modprobe.d file
are back, nothing of gpuhost's left.

These ran at the end of test_faults_lab.py on its host A; they need none of that module's state,
so they boot their own base host, on the pytest-xdist worker beside the fault suite's.
Run alone: `pytest -m lab tests/lab/test_grub_files_lab.py -n 0 -s`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from gpuhost.lab.image import Image
from gpuhost.lab.recipe import KERNEL_CMDLINE

from .rollout_lab import OPTIONS, HostLayout, Lab, apply, booted_lab, timing

# Group lab-rest (this, the guest lifecycle, test_lab_vms, Molecule) takes about as long as the
# fault suite (group lab-faults): the two groups run side by side on the two pytest-xdist workers.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

A = "a-1"
LAYOUT = {A: HostLayout("base", 2048, {"gpuhost_hugepages": 0})}


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with booted_lab(tmp_path_factory.mktemp("grub-files-lab"), image_dir, LAYOUT) as booted:
        yield booted


UNUSUAL_GRUB = (
    "# gpuhost fault 4: unusual but valid shell\n"
    "GRUB_DEFAULT=0\n"
    "GRUB_TIMEOUT=0\n"
    "GRUB_TIMEOUT_STYLE=hidden\n"
    "GRUB_DISTRIBUTOR='Debian'\n"
    f"GRUB_CMDLINE_LINUX='{KERNEL_CMDLINE}'\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="vfio-pci.ids=10de:1111 \\\n'
    '    quiet"  # an older passthrough try\n'
    'GRUB_TERMINAL="serial console"\n'
    'GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"\n'
    "GRUB_DISABLE_OS_PROBER=true\n"
)
CLOUD_DROPIN = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT net.ifnames=0"\n'
OLD_MODPROBE = "# an older passthrough setup\noptions vfio-pci ids=10de:1111 disable_vga=1\n"


def test_fault4_and_5_unusual_grub_and_conflicting_vfio_settings_end_with_one_correct_setting(lab: Lab) -> None:
    host_a = lab.hosts[A]
    # CRLF on the command line variables: the part gpuhost reads. (A whole CRLF file also turns
    # GRUB_TIMEOUT into "0\r", which GRUB cannot parse: it would wait at its menu, gpuhost or not.)
    crlf = "".join(
        line.replace("\n", "\r\n") if line.startswith(("GRUB_CMDLINE_LINUX=", "    quiet")) else line
        for line in UNUSUAL_GRUB.splitlines(keepends=True)
    )
    # Invalid shell first (an unterminated quote): refused, nothing written.
    host_a.sh("printf 'GRUB_CMDLINE_LINUX=\"quiet\\n' >> /etc/default/grub")
    broken = host_a.hashes()
    code, report, _ = apply(lab, lab.inventory("fault4-invalid"), "fault4-invalid", "--limit", A)
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "refused", entry
    assert "is not valid shell" in entry["message"] and "/etc/default/grub" in entry["message"], entry
    assert host_a.hashes() == broken
    host_a.sh(
        f"cat > /etc/default/grub <<'EOF'\n{crlf}EOF\n"
        f"cat > /etc/default/grub.d/50-cloudimg-settings.cfg <<'EOF'\n{CLOUD_DROPIN}EOF\n"
        f"cat > /etc/modprobe.d/vfio-old.conf <<'EOF'\n{OLD_MODPROBE}EOF\n"
    )
    # Counted on the host: the SSH output is read with universal newlines, which hide a '\r'.
    assert host_a.sh("grep -c \"$(printf '\\r')\" /etc/default/grub").strip() == "2"
    code, report, _ = apply(lab, lab.inventory("fault4-5"), "fault4-5", "--limit", A)
    entry = report["hosts"][A]
    assert code == 0 and entry["status"] == "ready", entry
    cmdline = host_a.cmdline()
    assert [t for t in cmdline if t.startswith("vfio-pci.ids=")] == [OPTIONS[0]], cmdline
    assert {"quiet", "net.ifnames=0", "console=ttyS0,115200n8", "no_timer_check"} <= set(cmdline)
    assert host_a.sh("grep -c \"$(printf '\\r')\" /proc/cmdline || true").strip() == "0"
    modprobe = host_a.sh(
        "grep -rhE '^[[:space:]]*options[[:space:]]+vfio[-_]pci' /etc/modprobe.d/ || true; "
        "cat /var/lib/gpuhost/backup/etc/modprobe.d/vfio-old.conf"
    )
    assert modprobe == OLD_MODPROBE, modprobe  # no active ids= left; the original kept for rollback


def test_rollback_restores_the_old_command_line_and_the_backed_up_files(lab: Lab) -> None:
    host_a = lab.hosts[A]
    started = time.monotonic()
    code = main(["rollback", "-i", str(lab.inventory("rollback")), "--limit", A, "--yes"])
    timing(f"rollback of A (with its reboot): {time.monotonic() - started:.0f} s")
    assert code == 0
    cmdline = host_a.cmdline()
    # The host's own settings are back, old vfio-pci.ids= included; nothing of gpuhost's is left.
    assert [t for t in cmdline if t.startswith("vfio-pci.ids=")] == ["vfio-pci.ids=10de:1111"], cmdline
    assert not {"iommu=pt", "gpuhost.trial=1", "modprobe.blacklist=nouveau,nvidia,nvidiafb"} & set(cmdline)
    left = host_a.sh(
        "cat /etc/modprobe.d/vfio-old.conf; test ! -e /etc/default/grub.d/gpuhost.cfg && "
        "test ! -e /etc/grub.d/42_gpuhost_trial && test ! -e /etc/initramfs-tools/scripts/init-top/gpuhost-vfio && "
        "test ! -e /var/lib/gpuhost/backup && ! grep -qE '^vfio|gpuhost: vfio-pci' /etc/initramfs-tools/modules && "
        "echo clean"
    )
    # The modules file keeps the lab disk's own lines (its comment says "gpuhost lab"): gpuhost's
    # marked block and its vfio lines are what must be gone.
    assert left == OLD_MODPROBE + "clean\n", left
