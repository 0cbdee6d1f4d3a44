"""Real kernels under QEMU: IOMMU groups per topology, the audit's and the planner's judgement, down.

A reboot through update-grub's generated grub.cfg is not repeated here: every trial boot of the
fault suite and Molecule's converge is one, and each ends with the audit's
READY (the GPU's group unchanged, its functions on vfio-pci).

Slow (an image build on a fresh machine, two hosts booting under TCG): run alone with
`pytest -m lab tests/lab`. Needs qemu-system-x86, qemu-utils, openssh-client, and root plus
debootstrap when no cached image exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhost.cli.main import main
from gpuhost.lab import fake_nvidia, resume
from gpuhost.lab.builder import ensure_image
from gpuhost.lab.image import Image
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.state import is_our_process, process_start_ticks
from gpuhost.lab.topology import INTRUDER_NIC_ID, TOPOLOGIES
from gpuhost.rollout import engine
from gpuhost.rollout.environment import AUDIT_PLAYBOOK
from gpuhost.targets import ConnectionDefaults, inventory_targets

from .conftest import LabHost, qemu_processes_under

# Shares a worker with the guest lifecycle module; the fault suite and Molecule each have their own.
pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab-rest")]

GROUPS_SCRIPT = r"""
for g in /sys/kernel/iommu_groups/*; do
  printf '%s' "${g##*/}"
  for d in "$g"/devices/*; do printf ' %s' "${d##*/}"; done
  echo
done
"""

DEVICES_SCRIPT = r"""
for d in /sys/bus/pci/devices/*; do
  echo "${d##*/} $(cat $d/vendor):$(cat $d/device) $(cat $d/class) $(cat $d/boot_vga 2>/dev/null || echo -)"
done
"""


def iommu_groups(host: LabHost) -> dict[str, set[str]]:
    """PCI address -> every address in its IOMMU group, as the guest kernel shows it."""
    groups: dict[str, set[str]] = {}
    for line in host.run("sh", "-c", GROUPS_SCRIPT).splitlines():
        _, *members = line.split()
        for member in members:
            groups[member] = set(members)
    return groups


def pci_devices(host: LabHost) -> dict[str, tuple[str, str, str]]:
    """PCI address -> (vendor:device, class, boot_vga)."""
    found = {}
    for line in host.run("sh", "-c", DEVICES_SCRIPT).splitlines():
        address, ids, klass, boot_vga = line.split()
        found[address] = (ids.replace("0x", ""), klass, boot_vga)
    return found


def gpuhost_json(verb: str, host: LabHost) -> subprocess.CompletedProcess[str]:
    """`gpuhost VERB -i <the host's lab inventory> --json`, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gpuhost", verb, "-i", str(host.paths.inventory), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def audit(host: LabHost) -> tuple[int, list[dict[str, Any]]]:
    result = gpuhost_json("audit", host)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert lines, f"audit printed nothing (exit {result.returncode}): {result.stderr}"
    return result.returncode, lines


def test_cached_image_is_reused_without_rebuilding(base_image: Image) -> None:
    paths = LabPaths(root=base_image.disk.parent, images=base_image.disk.parent.parent)
    started = time.monotonic()
    again = ensure_image(paths, "base")
    assert again.reused and again.disk == base_image.disk
    assert time.monotonic() - started < 5


def test_each_host_resumed_its_shapes_saved_boot_or_saved_it(lab_hosts: dict[str, LabHost]) -> None:
    """gpuhost.lab.resume: the first host of a shape to answer SSH saves its state; later ones of
    that shape (in this run, often the fault suite's hosts, booted on the other worker) resume from it."""
    for name, host in lab_hosts.items():
        record = host.record
        assert record.resume_key and resume.find_saved(host.paths.images, record.resume_key) is not None, record
        if record.resumed:
            skew = abs(int(host.run("date", "+%s")) - time.time())
            assert skew < 60, f"{name}: the resumed host's clock is {skew:.0f} s off"
        # Either way the disk is the one its memory expects: the root file system takes writes.
        written = host.run("sh", "-c", "echo written > /root/resume-check && sync && cat /root/resume-check")
        assert written == "written\n", written


def test_gpu_pair_is_alone_in_its_group_and_not_the_boot_display(lab_hosts: dict[str, LabHost]) -> None:
    host = lab_hosts["gpu-pair"]
    devices = pci_devices(host)
    assert devices["0000:01:00.0"][:2] == ("1234:1111", "0x030000")
    assert devices["0000:01:00.1"][:2] == ("8086:293e", "0x040300")
    # The emulated BMC display is the console; the stand-in GPU is not (as on a GPU server).
    assert devices["0000:00:02.0"] == ("1013:00b8", "0x030000", "1")
    assert devices["0000:01:00.0"][2] == "0"
    groups = iommu_groups(host)
    assert groups["0000:01:00.0"] == {"0000:01:00.0", "0000:01:00.1"}
    assert set(TOPOLOGIES["gpu-pair"].gpu_functions) == groups["0000:01:00.0"]


def test_host_kernel_sees_the_intel_iommu_and_1g_pages(lab_hosts: dict[str, LabHost]) -> None:
    host = lab_hosts["gpu-pair"]
    assert "GenuineIntel" in host.run("grep", "-m1", "vendor_id", "/proc/cpuinfo")
    assert "pdpe1gb" in host.run("grep", "-m1", "flags", "/proc/cpuinfo")
    assert host.run("ls", "/sys/class/iommu").split() == ["dmar0"]
    assert host.run("hostname").strip() == "lab-1"


def test_shared_group_puts_the_nic_in_the_gpus_group(lab_hosts: dict[str, LabHost]) -> None:
    host = lab_hosts["shared-group"]
    devices = pci_devices(host)
    gpu, audio = TOPOLOGIES["shared-group"].gpu_functions
    (nic,) = TOPOLOGIES["shared-group"].intruders
    assert devices[gpu][:2] == ("1234:1111", "0x030000")
    assert devices[nic][:2] == (INTRUDER_NIC_ID, "0x020000")
    group = iommu_groups(host)[gpu]
    assert {gpu, audio, nic} <= group
    # Besides the GPU's functions and the NIC, only the conventional bridge shares the group.
    assert {devices[a][1] for a in group - {gpu, audio, nic}} == {"0x060400"}


def test_audit_finds_the_gpu_pair_group_clean(lab_hosts: dict[str, LabHost]) -> None:
    code, results = audit(lab_hosts["gpu-pair"])
    (result,) = results
    assert result["host"] == "lab-1" and result["reachable"] is True
    assert code in (0, 1)  # not ready is right: nothing is bound to vfio-pci yet
    assert not [f for f in result["findings"] if f["code"] == "gpu.group.intruder"]
    gpus = {gpu["address"]: gpu for gpu in result["gpus"]}
    assert set(gpus["0000:01:00.0"]["group_members"]) == {"0000:01:00.0", "0000:01:00.1"}


def test_the_audit_playbook_writes_the_clis_json_for_a_lab_host(lab_hosts: dict[str, LabHost], tmp_path: Path) -> None:
    """gpuhost.passthrough.audit (issue 32), run as apply runs playbooks (ansible-runner, Ansible's
    ssh connection), writes for a real lab host the object `gpuhost audit --json` prints for it,
    apart from the audit's duration. Runs before anything below changes the host."""
    host = lab_hosts["gpu-pair"]
    _, (cli,) = audit(host)
    report = tmp_path / "audit.jsonl"
    targets = inventory_targets(host.paths.inventory, None, ConnectionDefaults())
    _, rc, _ = engine.run_playbook(
        AUDIT_PLAYBOOK,
        host.paths.inventory,
        [*(target.name for target in targets), "localhost"],  # the report's play runs on localhost
        {"gpuhost_audit_report_path": str(report)},
        "",
        targets,
        engine.EventTracker(lambda line: None),
    )
    (line,) = report.read_text().splitlines()
    played = json.loads(line)
    assert cli["reachable"] is True and rc == 0, (rc, played)  # not ready is no failed play: only an error is
    assert {k: v for k, v in played.items() if k != "seconds"} == {k: v for k, v in cli.items() if k != "seconds"}


def test_audit_names_the_intruder_in_the_shared_group(lab_hosts: dict[str, LabHost]) -> None:
    code, results = audit(lab_hosts["shared-group"])
    (result,) = results
    assert result["reachable"] is True and result["ready"] is False
    assert code == 1
    intruders = [f for f in result["findings"] if f["code"] == "gpu.group.intruder"]
    assert intruders, result["findings"]
    assert all(f["severity"] == "error" for f in intruders)
    (nic,) = TOPOLOGIES["shared-group"].intruders
    assert any(nic in f["message"] for f in intruders), intruders


def test_fake_nvidia_install_and_uninstaller_record(lab_hosts: dict[str, LabHost]) -> None:
    host = lab_hosts["gpu-pair"]
    done = fake_nvidia.install(host.paths, host.record.name)
    assert host.run("dpkg-query", "-W", "-f", "${Status}", done.package) == "install ok installed"
    host.run("test", "-x", "/usr/bin/nvidia-uninstall")
    host.run("sh", "-c", "ls /etc/modprobe.d/nvidia*.conf")
    host.run("/usr/bin/nvidia-uninstall", "--silent")
    assert "nvidia-uninstall --silent" in host.run("cat", done.uninstall_calls_file)
    assert host.run("sh", "-c", "ls /usr/bin/nvidia-uninstall 2>/dev/null || echo gone").strip() == "gone"
    # The precompiled shape (issue 42): a package per kernel tree and their metapackage, and a module
    # file no package owns; the live gather lists every one, per kernel, for the audit.
    for package in done.modules_packages:
        assert host.run("dpkg-query", "-W", "-f", "${Status}", package) == "install ok installed"
    _, (result,) = audit(host)
    (modules,) = [f for f in result["findings"] if f["code"] == "nvidia.installed.modules"]
    assert f"for {fake_nvidia.OTHER_KERNEL}: nvidia, nvidia_uvm (precompiled" in modules["message"]
    assert "nvidia_peermem" in modules["message"] and "(other," in modules["message"]


def test_plan_refuses_the_shared_group_host_naming_the_intruder(lab_hosts: dict[str, LabHost]) -> None:
    """The planner on the live host's facts (what apply's plan play runs): refused, the NIC named.
    That a refused host is left untouched by the playbook is fault 1 of test_faults_lab.py."""
    result = gpuhost_json("plan", lab_hosts["shared-group"])
    (entry,) = json.loads(result.stdout)
    assert result.returncode == 1 and entry["applicable"] is False, (result.returncode, result.stderr)
    assert [refusal["code"] for refusal in entry["refusals"]] == ["plan.group.intruder"], entry["refusals"]
    (nic,) = TOPOLOGIES["shared-group"].intruders
    assert nic in entry["refusals"][0]["message"] and "shares IOMMU group" in entry["refusals"][0]["message"]


def test_status_reports_a_crashed_vm(lab_hosts: dict[str, LabHost], capsys: pytest.CaptureFixture[str]) -> None:
    host = lab_hosts["shared-group"]
    assert main(["lab", "status", "--lab-dir", str(host.paths.root)]) == 0
    assert "running" in capsys.readouterr().out
    # Crash it for real (by its PID, which the lab recorded) and see status say so.
    os.kill(host.record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_our_process(host.record) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert main(["lab", "status", "--lab-dir", str(host.paths.root)]) == 1
    out = capsys.readouterr().out
    assert "CRASHED" in out and "serial log ends with" in out


def test_down_leaves_no_qemu_process(lab_hosts: dict[str, LabHost], capsys: pytest.CaptureFixture[str]) -> None:
    pids = [host.record.pid for host in lab_hosts.values()]
    for host in lab_hosts.values():
        assert main(["lab", "down", "--lab-dir", str(host.paths.root)]) == 0
        assert qemu_processes_under(host.paths.root) == []
        assert not host.paths.inventory.exists()
        assert list(host.paths.overlays.iterdir()) == []
    out = capsys.readouterr().out
    assert "lab-1: stopped" in out and "was not running" in out
    assert [pid for pid in pids if process_start_ticks(pid) is not None] == []
