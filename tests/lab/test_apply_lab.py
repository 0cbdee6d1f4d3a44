"""`gpuhost apply` on real kernels under QEMU: converge, reboot, verify, idempotence, check mode, refusal.

One gpu-pair host made to look like an NVIDIA host (the lab's stand-in driver: a package and a
.run install) and one shared-group host, booted once for the module and configured by one
inventory, as an operator would. The pair host boots the nested image variant (libvirtd, QEMU
and a tiny busybox guest inside), so that after apply the last test proves the point of it all:
a domain rendered by `gpuhost render`, defined and started by libvirtd on that host, gets the
GPU's functions. Run alone: `pytest -m lab tests/lab/test_apply_lab.py`.
Budget: 15 minutes on 2 cores (the times are printed as [apply timing] lines, run with -s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.audit import READY, audit_target
from gpuhost.cli.main import main
from gpuhost.lab import fake_nvidia, fleet
from gpuhost.lab import image as lab_image
from gpuhost.lab.image import Image
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.recipe import NESTED_GUEST_DIR
from gpuhost.lab.state import VmRecord
from gpuhost.targets import ConnectionDefaults, inventory_targets

# Generous: the module fixture (image, two boots, the stand-in driver) counts against the first test.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(2400)]

PAIR, SHARED = "pair-1", "shared-1"
GPU_FUNCTIONS = ("0000:01:00.0", "0000:01:00.1")
# Everything apply may write, and the boot_id: what it must leave alone on a refused host or in
# check mode. The Molecule scenario checks the same list.
HASH_SCRIPT = (Path(__file__).resolve().parents[2] / "playbooks/molecule/default/files/state-hashes.sh").read_text()


# The VM of the passthrough proof: TCG (the lab host has no KVM), direct kernel boot of the
# busybox guest that lists the PCI functions it sees on its serial console, then powers off.
PROOF_VM: dict[str, Any] = {
    "name": "proof",
    "vcpus": 1,
    "memory": "1G",  # backed by the 1 GiB huge page apply reserves
    "gpus": "all",
    "domain_type": "qemu",
    "firmware": "bios",
    "network": "none",
    "kernel": f"{NESTED_GUEST_DIR}/vmlinuz",
    "initrd": f"{NESTED_GUEST_DIR}/initrd.gz",
    "cmdline": "console=ttyS0 quiet panic=-1",
}
GUEST_SEES = ("1234:1111 class 0x030000", "8086:293e class 0x040300")
PCI_BEGIN, PCI_END = "GPUHOST-GUEST-PCI-BEGIN", "GPUHOST-GUEST-PCI-END"


def _timing(message: str) -> None:
    print(f"[apply timing] {message}", flush=True)


@dataclass(frozen=True)
class Host:
    paths: LabPaths
    record: VmRecord

    def sh(self, script: str, timeout: float = 120) -> str:
        result = fleet.run_on(self.paths, self.record, ["sh", "-s"], stdin=script, timeout=timeout)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def hashes(self) -> str:
        return self.sh(HASH_SCRIPT)

    def boot_id(self) -> str:
        return fleet.boot_id(self.paths, self.record)


@dataclass(frozen=True)
class Lab:
    hosts: dict[str, Host]
    inventory: Path
    reports: Path


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("apply-lab")
    layout = {PAIR: ("gpu-pair", 4096, "nested"), SHARED: ("shared-group", 2048, "base")}
    labs = {name: LabPaths(root=root / name, images=image_dir) for name in layout}
    started = time.monotonic()
    nested = lab_image.ensure_image(labs[PAIR], "nested")
    _timing(f"nested image {'reused' if nested.reused else 'built'} in {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    try:
        for name, (topology, memory, variant) in layout.items():
            fleet.up(labs[name], hosts=1, topology=topology, variant=variant, memory_mib=memory, cpus=2, wait=False)
        with ThreadPoolExecutor(len(labs)) as pool:
            for future in [pool.submit(fleet.wait_for_ssh, p, fleet.status(p)[0].hosts, 600) for p in labs.values()]:
                future.result()
        hosts = {name: Host(paths, fleet.status(paths)[0].hosts[0]) for name, paths in labs.items()}
        fake_nvidia.install(labs[PAIR], hosts[PAIR].record.name)
        _timing(f"2 hosts up and the stand-in NVIDIA driver installed in {time.monotonic() - started:.0f} s")
        # One inventory for both, as an operator would have it, with the lab's variables.
        entries: dict[str, Any] = {}
        for name, paths in labs.items():
            data = yaml.safe_load(paths.inventory.read_text())
            (variables,) = data["all"]["hosts"].values()
            # 1 GiB page on the 4 GiB host; the 2 GiB shared-group host can spare none.
            entries[name] = {**variables, "gpuhost_hugepages": 1 if name == PAIR else 0}
        entries[PAIR]["gpuhost_vms"] = [PROOF_VM]
        inventory = root / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": entries}}))
        yield Lab(hosts=hosts, inventory=inventory, reports=root)
    finally:
        for paths in labs.values():
            fleet.down(paths)


def apply(lab: Lab, name: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    report = lab.reports / f"{name}.json"
    started = time.monotonic()
    code = main(["apply", "-i", str(lab.inventory), "--yes", "--report", str(report), *extra])
    seconds = time.monotonic() - started
    return code, json.loads(report.read_text()), seconds


@pytest.fixture(scope="module")
def before(lab: Lab) -> dict[str, str]:
    return {name: host.hashes() for name, host in lab.hosts.items()}


def test_check_mode_changes_nothing_and_shows_the_plan(lab: Lab, before: dict[str, str]) -> None:
    code, report, seconds = apply(lab, "check", "--check")
    _timing(f"check mode (both hosts): {seconds:.0f} s")
    pair, shared = report["hosts"][PAIR], report["hosts"][SHARED]
    assert report["check_mode"] is True
    assert pair["reboot_needed"] is True and "vfio-pci.ids=1234:1111,8086:293e" in pair["kernel_options"]
    assert shared["status"] == "refused" and [r["code"] for r in shared["refusals"]] == ["group.shared"]
    assert code != 0  # the refused host is a failed host
    for name, host in lab.hosts.items():
        assert host.hashes() == before[name], f"check mode changed files (or rebooted) on {name}"


def test_apply_converges_reboots_and_the_audit_reports_ready(lab: Lab, before: dict[str, str]) -> None:
    pair_host = lab.hosts[PAIR]
    boot_before = pair_host.boot_id()
    code, report, seconds = apply(lab, "first")
    pair, shared = report["hosts"][PAIR], report["hosts"][SHARED]
    reboot = pair["reboot_seconds"] or 0
    _timing(f"first apply: {seconds:.0f} s in all, reboot {reboot} s, converge without reboot {seconds - reboot:.0f} s")
    assert pair["status"] == "ready", pair
    assert pair["rebooted"] is True and pair_host.boot_id() != boot_before
    drivers = pair_host.sh(
        "for d in " + " ".join(GPU_FUNCTIONS) + '; do basename "$(readlink /sys/bus/pci/devices/$d/driver)"; done; '
        "grep HugePages_Total /proc/meminfo; dpkg -l 'nvidia-*' 2>/dev/null | grep -c '^ii' || true; "
        f"cat {fake_nvidia.CALLS_FILE}"
    )
    assert drivers.splitlines()[:2] == ["vfio-pci", "vfio-pci"], drivers
    assert "HugePages_Total:       1" in drivers
    assert drivers.splitlines()[3] == "0"  # the driver package is purged
    assert "nvidia-uninstall -s" in drivers  # the .run install was uninstalled silently
    # The audit's own verdict, independently of the playbook's verification.
    (target,) = inventory_targets(lab.inventory, PAIR, ConnectionDefaults())
    assert audit_target(target).status == READY
    # The shared-group host was refused before anything was written.
    assert shared["status"] == "refused" and [r["code"] for r in shared["refusals"]] == ["group.shared"]
    assert "shares IOMMU group" in shared["refusals"][0]["message"]
    assert lab.hosts[SHARED].hashes() == before[SHARED]
    assert code != 0


def test_second_apply_changes_nothing_and_does_not_reboot(lab: Lab) -> None:
    pair_host = lab.hosts[PAIR]
    boot_before = pair_host.boot_id()
    files_before = pair_host.hashes()
    _, report, seconds = apply(lab, "second", "--limit", PAIR)
    _timing(f"second apply: {seconds:.0f} s")
    pair = report["hosts"][PAIR]
    assert report["ansible_rc"] == 0 and pair["status"] == "ready"
    assert pair["reboot_needed"] is False and pair["rebooted"] is False
    assert report["ansible_stats"]["changed"].get(PAIR, 0) == 0, report["ansible_stats"]
    assert pair_host.boot_id() == boot_before and pair_host.hashes() == files_before


def test_a_rendered_domain_gets_the_gpu_on_the_applied_host(lab: Lab, tmp_path: Path) -> None:
    """After apply, libvirtd on the host starts `gpuhost render`'s XML unchanged; the guest sees the GPU."""
    pair_host, vm = lab.hosts[PAIR], PROOF_VM["name"]
    started = time.monotonic()
    xml_path = tmp_path / f"{vm}.xml"
    assert main(["render", "-i", str(lab.inventory), "--host", PAIR, "--vm", vm, "-o", str(xml_path)]) == 0
    xml = xml_path.read_text()
    _timing(f"render (audit of the host + libvirt schema check): {time.monotonic() - started:.0f} s")
    # What the proof rests on: both functions as managed hostdevs, the 1 GiB page backing the guest.
    assert xml.count("<hostdev mode='subsystem' type='pci' managed='yes'>") == 2
    assert "<page size='1048576' unit='KiB'/>" in xml
    serial_log = f"/var/log/libvirt/qemu/{vm}-serial.log"
    assert serial_log in xml
    started = time.monotonic()
    result = fleet.run_on(
        pair_host.paths,
        pair_host.record,
        ["sh", "-c", f"cat > /root/{vm}.xml && virsh define /root/{vm}.xml"],
        stdin=xml,
    )
    assert result.returncode == 0, result.stderr
    result = fleet.run_on(pair_host.paths, pair_host.record, ["virsh", "start", vm], timeout=600)
    assert result.returncode == 0, result.stderr
    # The guest powers off after listing its PCI functions; its serial log then holds the list.
    log, deadline = "", time.monotonic() + 1200
    while PCI_END not in log and time.monotonic() < deadline:
        time.sleep(10)
        log = pair_host.sh(f"cat {serial_log} 2>/dev/null || true", timeout=120)
    _timing(f"domain defined, booted at two levels of TCG, PCI listed: {time.monotonic() - started:.0f} s")
    assert PCI_BEGIN in log and PCI_END in log, f"no PCI listing on the guest's serial console:\n{log[-3000:]}"
    listing = log.split(PCI_BEGIN, 1)[1].split(PCI_END, 1)[0]
    for function in GUEST_SEES:
        assert function in listing, f"the guest did not see {function}:\n{listing}"
    # libvirt handed the host's functions over and back: still on vfio-pci, nothing else bound them.
    drivers = pair_host.sh(
        "for d in " + " ".join(GPU_FUNCTIONS) + '; do basename "$(readlink /sys/bus/pci/devices/$d/driver)"; done'
    )
    assert drivers.split() == ["vfio-pci", "vfio-pci"], drivers
    pair_host.sh(f"virsh destroy {vm} >/dev/null 2>&1 || true; virsh undefine {vm}")
