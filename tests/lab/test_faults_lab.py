"""Safe rollout on real lab hosts (issue 7): each fault injected for real, each outcome asserted.

Also the apply path itself (issue 4) and the point of it all (issue 6): after apply, libvirtd on the
host starts `gpuhost render`'s domain and the guest sees the GPU's functions.

Two gpu-pair hosts, booted once for the module and configured by one inventory, in this order:
A (base image, 2 GiB) is batch 1 of every rollout; B (the nested variant, 4 GiB, made to look like
an NVIDIA host with the lab's stand-in driver, one 1 GiB page, a VM to render) is batch 2.

1. huge pages beyond A's memory: refused before any change, A's files byte-identical;
2. forced past the refusal (a testing-only environment variable), A's trial kernel cannot allocate
   its huge pages: gpuhost reboots it onto the old default, "trial reverted", B not reached;
3. A's QEMU killed as its trial kernel boots: the batch fails after the reboot timeout, the report
   names A as unreachable, B (the next batch) is not reached and untouched; A started again (the
   operator's power cycle) is on its old command line;
2. A's trial kernel panics for real (testing-only rdinit=): panic=N, and the host comes back on
   its old command line by itself;
6. A's host key changes after an audit: A is aborted (unreachable), B goes on: driver purged,
   trial boot, commit, the audit says READY;
8. a second apply on B changes nothing and reboots nothing;
   the passthrough proof on B: render, virsh define/start, the guest lists the GPU's functions.

Faults 4 and 5 and rollback run on a host of their own in test_grub_files_lab.py, beside this
module, on the other pytest-xdist worker. Check mode (fault 8's first half: `--check --diff` on an
untouched stand-in NVIDIA host changes no file and no boot_id) is Molecule's prepare step
(playbooks/molecule/default/prepare.yml), which ran the same playbook on the same kind of host here
too; it runs once, there. Fault 7 (hostile inventory values) and the pure
half of 4 need no VM: tests/test_hostile_inventory.py and tests/test_trial_boot.py. Run alone:
`pytest -m lab tests/lab/test_faults_lab.py -n 0 -s`; the times are printed as [fault timing] lines.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhost.audit import AuditStatus, audit_target
from gpuhost.cli.main import main
from gpuhost.lab import fake_nvidia, fleet
from gpuhost.lab import image as lab_image
from gpuhost.lab.image import Image
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.recipe import GUEST_SPEED_OPTIONS, NESTED_GUEST_DIR
from gpuhost.lab.state import is_our_process, load_state, process_start_ticks, save_state
from gpuhost.plan.settings import FORCE_PAST_REFUSALS_ENV, TRIAL_TESTING_OPTIONS_ENV
from gpuhost.targets import ConnectionDefaults, inventory_targets

from .rollout_lab import GPU_FUNCTIONS, OPTIONS, Host, HostLayout, Lab, apply, booted_lab, timing

# Each fault test boots or waits out reboots under TCG: more than the suite-wide 900 s on a busy machine.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-faults")]

A, B = "a-1", "b-1"
KILLED_REBOOT_TIMEOUT = 60  # fault 3 waits this out
SLOW_TRIAL_BOOT_TIMEOUT = 1500  # fault 2's trial kernel, slow to boot (see the test)
# The trial kernel's first words on A's serial console (console=ttyS0): its command line.
TRIAL_BOOT_LINE = re.compile(rb"Command line: [^\n]*gpuhost\.trial=1")
# The VM of the passthrough proof on B: TCG (the lab host has no KVM), direct kernel boot of the
# busybox guest that lists the PCI functions it sees on its serial console, then powers off.
PROOF_VM: dict[str, Any] = {
    "name": "proof",
    "vcpus": 1,
    "memory": "1G",  # backed by the 1 GiB huge page apply reserves
    "gpus": "all",
    "domain_type": "qemu",
    "firmware": "bios",
    "network": "none",
    "kernel": f"{NESTED_GUEST_DIR}/vmlinux",  # ELF, booted through PVH: no decompressor at two levels of TCG
    "initrd": f"{NESTED_GUEST_DIR}/initrd.gz",
    "cmdline": f"console=ttyS0 quiet panic=-1 {GUEST_SPEED_OPTIONS}",
}
GUEST_SEES = ("1234:1111 class 0x030000", "8086:293e class 0x040300")
PCI_BEGIN, PCI_END = "GPUHOST-GUEST-PCI-BEGIN", "GPUHOST-GUEST-PCI-END"
LAYOUT = {
    A: HostLayout("base", 2048, {"gpuhost_hugepages": 0}),
    B: HostLayout("nested", 4096, {"gpuhost_hugepages": 1, "gpuhost_vms": [PROOF_VM]}, fake_nvidia=True),
}


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("faults-lab")
    started = time.monotonic()
    nested = lab_image.ensure_image(LabPaths(root=root / B, images=image_dir), "nested")
    timing(f"nested image {'reused' if nested.reused else 'built'} in {time.monotonic() - started:.0f} s")
    with booted_lab(root, image_dir, LAYOUT) as booted:
        yield booted


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


def _kill_in_trial_boot(host: Host, killed: dict[str, float]) -> None:
    """Kill A's QEMU as soon as its serial console shows the trial kernel booting: GRUB has used its
    one-shot entry by then, so this is a host that hangs or loses power in its trial boot."""
    serial_log = Path(host.record.serial_log)
    offset = serial_log.stat().st_size
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        time.sleep(0.5)
        with serial_log.open("rb") as console:
            console.seek(offset)
            if TRIAL_BOOT_LINE.search(console.read()):
                os.kill(host.record.pid, signal.SIGKILL)
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


@pytest.mark.timeout(2700)  # the slow trial boot may take up to its 1500 s
def test_fault2_forced_trial_boot_fails_and_the_host_returns_on_its_old_command_line(
    lab: Lab, original: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORCE_PAST_REFUSALS_ENV, "hugepages.too_many")
    # A trial kernel asked for more 1 GiB pages than the host has boots slowly ("Only allocated 0
    # hugepages"): 251 s on an idle machine (82 s without the pages), past 600 s beside the other lab
    # worker. The time goes before the kernel's first message (one run with nokaslr took 127 s: the
    # decompressor's KASLR handling of hugepages= is the suspect, not yet proven). It gets the time.
    inventory = lab.inventory(
        "fault2", **{A: {"gpuhost_hugepages": 4, "gpuhost_verify_reboot_timeout": SLOW_TRIAL_BOOT_TIMEOUT}}
    )
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
    assert report["hosts"][B]["status"] == "not reached", report["hosts"][B]
    assert lab.hosts[B].hashes() == original[B]["hashes"], "the rollout went on past the reverted host"


def test_fault3_host_killed_during_its_reboot_fails_the_batch_and_the_next_is_untouched(
    lab: Lab, original: dict[str, dict[str, Any]]
) -> None:
    host_a = lab.hosts[A]
    killed: dict[str, float] = {}
    killer = threading.Thread(target=_kill_in_trial_boot, args=(host_a, killed), daemon=True)
    killer.start()
    # A short reboot timeout for A: it is killed, so the whole timeout is waited out.
    inventory = lab.inventory("fault3", **{A: {"gpuhost_verify_reboot_timeout": KILLED_REBOOT_TIMEOUT}})
    code, report, _ = apply(lab, inventory, "fault3")
    killer.join(timeout=5)
    assert "at" in killed, "A's QEMU was never killed"
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "unreachable", entry
    assert entry["message"], entry  # Ansible's own words: timed out, or connection refused
    assert report["hosts"][B]["status"] == "not reached", report["hosts"][B]
    assert lab.hosts[B].hashes() == original[B]["hashes"], "the next batch was touched"
    waited = time.monotonic() - killed["at"]
    timing(f"fault3: batch failed {waited:.0f} s after the kill (timeout {KILLED_REBOOT_TIMEOUT} s)")
    timing(f"fault3: A started again (the operator's power cycle) and back on SSH in {_start_again(host_a):.0f} s")
    # GRUB used up the one-shot entry on the killed boot: the power cycle lands on the old default.
    assert host_a.cmdline() == original[A]["cmdline"]


def test_fault2_panicking_trial_kernel_comes_back_on_the_old_command_line_by_itself(
    lab: Lab, original: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial entry's kernel panics for real (rdinit= names no file: no root can be mounted), and
    panic=N reboots it; GRUB has cleared its one-shot entry, so the host boots the old default."""
    host_a = lab.hosts[A]
    serial_log = Path(host_a.record.serial_log)
    log_before = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, "rdinit=/gpuhost-fault-injection")
    code, report, _ = apply(lab, lab.inventory("fault2-panic"), "fault2-panic")
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "came back without the trial entry" in entry["message"], entry
    with serial_log.open("rb") as log:
        log.seek(log_before)
        console = log.read().decode(errors="replace")
    assert "Kernel panic - not syncing" in console, console[-3000:]
    assert "Rebooting in 10 seconds" in console, console[-3000:]
    assert host_a.cmdline() == original[A]["cmdline"]
    state = host_a.sh("ls /etc/default/gpuhost-trial.cfg 2>&1; grep -c gpuhost-trial /boot/grub/grub.cfg || true")
    assert "No such file" in state and state.strip().endswith("0"), state
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
        code, report, seconds = apply(lab, inventory, "fault6")
    finally:
        known_hosts.write_text(saved)
        files_a = host_a.sh("ls /etc/default/grub.d/ /etc/default/gpuhost-trial.cfg 2>&1; cat /proc/cmdline")
    entry_a, entry_b = report["hosts"][A], report["hosts"][B]
    assert entry_a["status"] == "unreachable" and "host key" in entry_a["message"].lower(), entry_a
    assert "gpuhost.cfg" not in files_a and "vfio-pci.ids" not in files_a  # A was not touched
    assert code != 0 and entry_b["status"] == "ready", entry_b
    assert entry_b["rebooted"] is True
    reboot = entry_b["reboot_seconds"] or 0
    timing(f"fault6: B's apply {seconds:.0f} s in all, trial reboot {reboot} s, the rest {seconds - reboot:.0f} s")
    # B, the host made to look like an NVIDIA host, is now a passthrough host.
    drivers = lab.hosts[B].sh(
        "for d in " + " ".join(GPU_FUNCTIONS) + '; do basename "$(readlink /sys/bus/pci/devices/$d/driver)"; done; '
        "grep HugePages_Total /proc/meminfo; dpkg -l 'nvidia-*' 2>/dev/null | grep -c '^ii' || true; "
        f"cat {fake_nvidia.CALLS_FILE}"
    )
    assert drivers.splitlines()[:2] == ["vfio-pci", "vfio-pci"], drivers
    assert "HugePages_Total:       1" in drivers
    assert drivers.splitlines()[3] == "0"  # the driver package is purged
    assert "nvidia-uninstall -s" in drivers  # the .run install was uninstalled silently
    # The audit's own verdict, independently of the playbook's verification.
    (target_b,) = inventory_targets(inventory, B, ConnectionDefaults())
    assert audit_target(target_b).status is AuditStatus.READY
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
    code, report, _ = apply(lab, lab.inventory("fault8-second"), "fault8-second", "--limit", B)
    entry = report["hosts"][B]
    assert code == 0 and report["ansible_rc"] == 0 and entry["status"] == "ready", entry
    assert list(report["hosts"]) == [B]  # --limit: A is not part of this run's report
    assert entry["reboot_needed"] is False and entry["rebooted"] is False
    assert report["ansible_stats"]["changed"].get(B, 0) == 0, report["ansible_stats"]
    assert host_b.hashes() == before


def test_a_rendered_domain_gets_the_gpu_on_the_applied_host(lab: Lab, tmp_path: Path) -> None:
    """After apply, libvirtd on B starts `gpuhost render`'s XML unchanged; the guest sees the GPU."""
    host_b, vm = lab.hosts[B], PROOF_VM["name"]
    inventory = lab.inventory("proof")
    started = time.monotonic()
    xml_path = tmp_path / f"{vm}.xml"
    assert main(["render", "-i", str(inventory), "--host", B, "--vm", vm, "-o", str(xml_path)]) == 0
    xml = xml_path.read_text()
    timing(f"render (audit of the host + libvirt schema check): {time.monotonic() - started:.0f} s")
    # What the proof rests on: both functions as managed hostdevs, the 1 GiB page backing the guest.
    assert xml.count("<hostdev mode='subsystem' type='pci' managed='yes'>") == 2
    assert "<page size='1048576' unit='KiB'/>" in xml
    serial_log = f"/var/log/libvirt/qemu/{vm}-serial.log"
    assert serial_log in xml
    started = time.monotonic()
    host_b.sh(f"cat > /root/{vm}.xml <<'GPUHOST_XML'\n{xml}\nGPUHOST_XML\nvirsh define /root/{vm}.xml")
    host_b.sh(f"virsh start {vm}", timeout=600)
    # The guest powers off after listing its PCI functions; its serial log then holds the list.
    log, deadline = "", time.monotonic() + 1200
    while PCI_END not in log and time.monotonic() < deadline:
        time.sleep(10)
        log = host_b.sh(f"cat {serial_log} 2>/dev/null || true", timeout=120)
    timing(f"domain defined, booted at two levels of TCG, PCI listed: {time.monotonic() - started:.0f} s")
    assert PCI_BEGIN in log and PCI_END in log, f"no PCI listing on the guest's serial console:\n{log[-3000:]}"
    listing = log.split(PCI_BEGIN, 1)[1].split(PCI_END, 1)[0]
    for function in GUEST_SEES:
        assert function in listing, f"the guest did not see {function}:\n{listing}"
    # libvirt handed the host's functions over and back: still on vfio-pci, nothing else bound them.
    drivers = host_b.sh(
        "for d in " + " ".join(GPU_FUNCTIONS) + '; do basename "$(readlink /sys/bus/pci/devices/$d/driver)"; done'
    )
    assert drivers.split() == ["vfio-pci", "vfio-pci"], drivers
    host_b.sh(f"virsh destroy {vm} >/dev/null 2>&1 || true; virsh undefine {vm}")
