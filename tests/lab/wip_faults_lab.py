"""Fault injection on real lab hosts (issue 7): each fault for real, each outcome asserted exactly.

Two gpu-pair hosts, A and B, booted once for the module and configured by one inventory; the
faults run in this order, each leaving the hosts in a known state for the next:

1. huge pages beyond A's memory: refused, A's files byte-identical;
8. check mode on both: every file byte-identical (the second half of 8 is after fault 6);
3. A's QEMU killed during its reboot: the batch fails after the reboot timeout, the report names
   A as unreachable, B (the next batch) is untouched; A is then started again;
2. forced past the refusal (the testing-only environment variable), A's trial boot cannot
   allocate its huge pages: gpuhost reboots it onto the old default, "trial reverted", B untouched;
6. A's host key changes after an audit: A is aborted (unreachable), B goes on: trial boot, commit;
   8. a second apply on B changes nothing and reboots nothing;
4+5. A with an unusual /etc/default/grub (CRLF, single quotes, a continuation, a cloud drop-in
   overriding the variable, an old vfio-pci.ids=) and an `options vfio-pci ids=` in modprobe.d:
   trial boot, commit, exactly one vfio-pci.ids= and no active modprobe.d ids;
rollback: `gpuhost rollback --limit A`: the old command line and the modprobe.d file are back.

Fault 7 (hostile inventory values) and the pure half of 4 need no VM: tests/test_hostile_inventory.py
and tests/test_trial_boot.py. Times are printed as [fault timing] lines (run with -s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.audit import audit_target
from gpuhost.cli.main import main
from gpuhost.lab import fleet
from gpuhost.lab.image import Image
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.state import VmRecord, is_our_process, load_state, process_start_ticks, save_state
from gpuhost.plan.settings import FORCE_PAST_REFUSALS_ENV
from gpuhost.targets import ConnectionDefaults, inventory_targets

# Each fault test boots or waits out reboots under TCG: more than the suite-wide 900 s on a busy machine.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]

A, B = "a-1", "b-1"
OPTIONS = ("vfio-pci.ids=1234:1111,8086:293e", "modprobe.blacklist=nouveau,nvidia,nvidiafb", "iommu=pt")
REBOOT_TIMEOUT = 600  # generous for TCG on a loaded machine
KILLED_REBOOT_TIMEOUT = 120  # fault 3 waits this out
# Everything apply or rollback may write; plus the boot ID, so a reboot shows as a change.
HASH_SCRIPT = r"""
for f in /etc/default/grub /etc/default/grub.d/* /etc/default/gpuhost-trial.cfg /etc/grub.d/* \
         /boot/grub/grub.cfg /boot/grub/grubenv /boot/initrd.img-* /etc/initramfs-tools/modules \
         /etc/initramfs-tools/scripts/init-top/* /etc/modprobe.d/* /etc/apt/preferences.d/* /etc/fstab; do
  [ -f "$f" ] && sha256sum "$f"
done
[ -d /var/lib/gpuhost ] && find /var/lib/gpuhost -type f | sort
cat /proc/sys/kernel/random/boot_id
"""


def _timing(message: str) -> None:
    print(f"[fault timing] {message}", flush=True)


@dataclass
class Host:
    paths: LabPaths
    name: str

    @property
    def record(self) -> VmRecord:
        return fleet.find_host(self.paths, "lab-1")

    def sh(self, script: str, timeout: float = 180) -> str:
        result = fleet.run_on(self.paths, self.record, ["sh", "-s"], stdin=script, timeout=timeout)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def hashes(self) -> str:
        return self.sh(HASH_SCRIPT)

    def cmdline(self) -> list[str]:
        return self.sh("cat /proc/cmdline").split()


@dataclass(frozen=True)
class Lab:
    hosts: dict[str, Host]
    root: Path

    def inventory(self, name: str, **overrides: dict[str, Any]) -> Path:
        """One inventory for both hosts, as an operator has it; `overrides` per host name."""
        entries: dict[str, Any] = {}
        for host_name, host in self.hosts.items():
            data = yaml.safe_load(host.paths.inventory.read_text())
            (variables,) = data["all"]["hosts"].values()
            entries[host_name] = {
                **variables,
                "gpuhost_hugepages": 0,
                "gpuhost_verify_reboot_timeout": REBOOT_TIMEOUT,
                **overrides.get(host_name, {}),
            }
        path = self.root / f"{name}-inventory.yml"
        path.write_text(yaml.safe_dump({"all": {"hosts": entries}}))
        return path


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("faults-lab")
    labs = {name: LabPaths(root=root / name, images=image_dir) for name in (A, B)}
    started = time.monotonic()
    try:
        for paths in labs.values():
            fleet.up(paths, hosts=1, topology="gpu-pair", memory_mib=2048, cpus=2, wait=False)
        with ThreadPoolExecutor(len(labs)) as pool:
            for future in [pool.submit(fleet.wait_for_ssh, p, fleet.status(p)[0].hosts, 900) for p in labs.values()]:
                future.result()
        _timing(f"2 hosts up in {time.monotonic() - started:.0f} s")
        yield Lab(hosts={name: Host(paths, name) for name, paths in labs.items()}, root=root)
    finally:
        for paths in labs.values():
            fleet.down(paths)


def apply(lab: Lab, inventory: Path, label: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    report = lab.root / f"{label}-report.json"
    started = time.monotonic()
    code = main(["apply", "-i", str(inventory), "--yes", "--report", str(report), *extra])
    seconds = time.monotonic() - started
    _timing(f"{label}: apply {' '.join(extra)} in {seconds:.0f} s")
    return code, json.loads(report.read_text()), seconds


@pytest.fixture(scope="module")
def original(lab: Lab) -> dict[str, dict[str, Any]]:
    return {name: {"hashes": host.hashes(), "cmdline": host.cmdline()} for name, host in lab.hosts.items()}


def test_fault1_hugepages_beyond_memory_are_refused_and_nothing_is_written(
    lab: Lab, original: dict[str, dict[str, Any]]
) -> None:
    inventory = lab.inventory("fault1", **{A: {"gpuhost_hugepages": 4}})
    code, report, _ = apply(lab, inventory, "fault1", "--limit", A)
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "refused", entry
    # The only host failed in the plan play, so Ansible ran no report play: the CLI's entry has the message.
    assert "refuses to configure this host; nothing was written" in entry["message"], entry
    assert "a-1: 4 1 GiB huge pages" in entry["message"] and "the machine does not boot" in entry["message"]
    assert lab.hosts[A].hashes() == original[A]["hashes"]


def test_fault8_check_mode_leaves_every_file_byte_identical(lab: Lab, original: dict[str, dict[str, Any]]) -> None:
    _, report, _ = apply(lab, lab.inventory("fault8-check"), "fault8-check", "--check")
    assert report["check_mode"] is True and report["ansible_rc"] == 0, report
    assert all(report["hosts"][name]["reboot_needed"] is True for name in (A, B))
    for name, host in lab.hosts.items():
        assert host.hashes() == original[name]["hashes"], f"check mode changed {name}"


def _kill_during_reboot(host: Host, killed: dict[str, float]) -> None:
    """Wait until A's trial is armed (grub-reboot) and its SSH goes away, then kill its QEMU."""
    deadline = time.monotonic() + 900
    armed = False
    while time.monotonic() < deadline:
        time.sleep(1)
        if not armed:
            with contextlib.suppress(Exception):
                result = fleet.run_on(host.paths, host.record, ["grub-editenv", "list"], timeout=20)
                armed = "next_entry=gpuhost-trial" in result.stdout
            continue
        if not fleet._ssh_banner(host.record.ssh_port, timeout=2):
            record = host.record
            os.kill(record.pid, signal.SIGKILL)
            killed["at"] = time.monotonic()
            return


def _start_again(host: Host) -> float:
    """Start the killed VM with the same QEMU command line (same disk overlay and port)."""
    started = time.monotonic()
    record = host.record
    while is_our_process(record):
        time.sleep(0.5)
    Path(record.pidfile).unlink(missing_ok=True)
    subprocess.run(record.argv, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    pid = int(Path(record.pidfile).read_text().strip())
    ticks = process_start_ticks(pid)
    assert ticks is not None
    state = load_state(host.paths.state_file)
    fresh = dataclasses.replace(record, pid=pid, start_ticks=ticks)
    save_state(host.paths.state_file, dataclasses.replace(state, hosts=(fresh,)))
    fleet.wait_for_ssh(host.paths, [fresh], 900)
    return time.monotonic() - started


def test_fault3_host_killed_during_its_reboot_fails_the_batch_and_the_next_is_untouched(
    lab: Lab, original: dict[str, dict[str, Any]]
) -> None:
    host_a = lab.hosts[A]
    killed: dict[str, float] = {}
    killer = threading.Thread(target=_kill_during_reboot, args=(host_a, killed), daemon=True)
    killer.start()
    # A short reboot timeout for A: it is killed, so the whole timeout is waited out.
    inventory = lab.inventory("fault3", **{A: {"gpuhost_verify_reboot_timeout": KILLED_REBOOT_TIMEOUT}})
    code, report, _ = apply(lab, inventory, "fault3")
    killer.join(timeout=5)
    assert "at" in killed, "A's QEMU was never killed"
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "unreachable", entry
    assert entry["message"], entry  # Ansible's own words: timed out, or connection refused
    assert report["hosts"].get(B, {}).get("status") not in ("ready", "trial reverted")
    assert lab.hosts[B].hashes() == original[B]["hashes"], "the next batch was touched"
    waited = time.monotonic() - killed["at"]
    _timing(f"fault3: batch failed {waited:.0f} s after the kill (timeout {KILLED_REBOOT_TIMEOUT} s)")
    _timing(f"fault3: A started again and back on SSH in {_start_again(host_a):.0f} s")


def test_fault2_forced_trial_boot_fails_and_the_host_returns_on_its_old_command_line(
    lab: Lab, original: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORCE_PAST_REFUSALS_ENV, "hugepages.too_many")
    inventory = lab.inventory("fault2", **{A: {"gpuhost_hugepages": 4}})
    code, report, _ = apply(lab, inventory, "fault2")
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "not as planned" in entry["message"] and "hugepages 1G" in entry["message"], entry
    host_a = lab.hosts[A]
    assert host_a.cmdline() == original[A]["cmdline"]
    state = host_a.sh(
        "grub-editenv list; ls /etc/default/grub.d/ /etc/default/gpuhost-trial.cfg 2>&1; "
        "grep -c gpuhost-trial /boot/grub/grub.cfg || true"
    )
    assert "next_entry=\n" in state or "next_entry" not in state, state
    assert "gpuhost.cfg" not in state and "No such file" in state, state
    assert state.strip().endswith("0"), state  # no trial entry left in grub.cfg
    assert report["hosts"].get(B, {}).get("status") not in ("ready", "trial reverted")
    assert lab.hosts[B].hashes() == original[B]["hashes"], "the rollout went on past the reverted host"


def test_fault6_host_key_change_aborts_that_host_and_the_others_go_on(lab: Lab) -> None:
    inventory = lab.inventory("fault6")
    host_a = lab.hosts[A]
    for target in inventory_targets(inventory, None, ConnectionDefaults()):
        assert audit_target(target).facts is not None  # the audit saw both hosts with their keys
    known_hosts = host_a.paths.known_hosts
    saved = known_hosts.read_text()
    stranger = lab.root / "stranger-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    key = Path(f"{stranger}.pub").read_text().split()[:2]
    known_hosts.write_text(
        "".join(f"{line.split()[0]} {' '.join(key)}\n" for line in saved.splitlines() if line.strip())
    )
    try:
        code, report, _ = apply(lab, inventory, "fault6")
    finally:
        known_hosts.write_text(saved)
        files_a = host_a.sh("ls /etc/default/grub.d/ /etc/default/gpuhost-trial.cfg 2>&1; cat /proc/cmdline")
    entry_a, entry_b = report["hosts"][A], report["hosts"][B]
    assert entry_a["status"] == "unreachable" and "host key" in entry_a["message"].lower(), entry_a
    assert "gpuhost.cfg" not in files_a and "vfio-pci.ids" not in files_a  # A was not touched
    assert code != 0 and entry_b["status"] == "ready", entry_b
    assert entry_b["rebooted"] is True
    cmdline_b = lab.hosts[B].cmdline()
    assert [t for t in cmdline_b if t.startswith("vfio-pci.ids=")] == [OPTIONS[0]]
    assert "gpuhost.trial=1" in cmdline_b  # B runs the trial entry, now committed as the default
    committed = lab.hosts[B].sh(
        "grub-editenv list; ls /etc/default/gpuhost-trial.cfg 2>&1; grep -c gpuhost-trial /boot/grub/grub.cfg || true; "
        "awk '/^menuentry /{n++} n==1 && /linux\\t/{print; exit}' /boot/grub/grub.cfg"
    )
    assert "No such file" in committed and "\n0\n" in committed, committed
    assert all(option in committed for option in OPTIONS) and "panic=" not in committed, committed


def test_fault8_second_apply_changes_nothing_and_reboots_nothing(lab: Lab) -> None:
    host_b = lab.hosts[B]
    before = host_b.hashes()
    _, report, _ = apply(lab, lab.inventory("fault8-second"), "fault8-second", "--limit", B)
    entry = report["hosts"][B]
    assert report["ansible_rc"] == 0 and entry["status"] == "ready", entry
    assert entry["reboot_needed"] is False and entry["rebooted"] is False
    assert report["ansible_stats"]["changed"].get(B, 0) == 0, report["ansible_stats"]
    assert host_b.hashes() == before


UNUSUAL_GRUB = (
    "# gpuhost fault 4: unusual but valid shell\n"
    "GRUB_DEFAULT=0\n"
    "GRUB_TIMEOUT=0\n"
    "GRUB_TIMEOUT_STYLE=hidden\n"
    "GRUB_DISTRIBUTOR='Debian'\n"
    "GRUB_CMDLINE_LINUX='console=ttyS0,115200n8 no_timer_check'\n"
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
    host_a.sh(
        f"cat > /etc/default/grub <<'EOF'\n{crlf}EOF\n"
        f"cat > /etc/default/grub.d/50-cloudimg-settings.cfg <<'EOF'\n{CLOUD_DROPIN}EOF\n"
        f"cat > /etc/modprobe.d/vfio-old.conf <<'EOF'\n{OLD_MODPROBE}EOF\n"
    )
    assert "\r\n" in host_a.sh("cat /etc/default/grub")
    code, report, _ = apply(lab, lab.inventory("fault4-5"), "fault4-5", "--limit", A)
    entry = report["hosts"][A]
    assert code == 0 and entry["status"] == "ready", entry
    cmdline = host_a.cmdline()
    assert [t for t in cmdline if t.startswith("vfio-pci.ids=")] == [OPTIONS[0]], cmdline
    assert {"quiet", "net.ifnames=0", "console=ttyS0,115200n8", "no_timer_check"} <= set(cmdline)
    assert not any("\r" in token for token in cmdline)
    modprobe = host_a.sh(
        "grep -rhE '^[[:space:]]*options[[:space:]]+vfio[-_]pci' /etc/modprobe.d/ || true; "
        "cat /var/lib/gpuhost/backup/etc/modprobe.d/vfio-old.conf"
    )
    assert modprobe == OLD_MODPROBE, modprobe  # no active ids= left; the original kept for rollback


def test_rollback_restores_the_old_command_line_and_the_backed_up_files(lab: Lab) -> None:
    host_a = lab.hosts[A]
    started = time.monotonic()
    code = main(["rollback", "-i", str(lab.inventory("rollback")), "--limit", A, "--yes"])
    _timing(f"rollback of A (with its reboot): {time.monotonic() - started:.0f} s")
    assert code == 0
    cmdline = host_a.cmdline()
    # The host's own settings are back, old vfio-pci.ids= included; nothing of gpuhost's is left.
    assert [t for t in cmdline if t.startswith("vfio-pci.ids=")] == ["vfio-pci.ids=10de:1111"], cmdline
    assert not {"iommu=pt", "gpuhost.trial=1", "modprobe.blacklist=nouveau,nvidia,nvidiafb"} & set(cmdline)
    left = host_a.sh(
        "cat /etc/modprobe.d/vfio-old.conf; test ! -e /etc/default/grub.d/gpuhost.cfg && "
        "test ! -e /etc/grub.d/42_gpuhost_trial && test ! -e /etc/initramfs-tools/scripts/init-top/gpuhost-vfio && "
        "test ! -e /var/lib/gpuhost/backup && ! grep -q gpuhost /etc/initramfs-tools/modules && echo clean"
    )
    assert left == OLD_MODPROBE + "clean\n", left
