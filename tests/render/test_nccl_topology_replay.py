"""Replays of tests/fixtures/nccl-topology-h200x2 and nccl-topology-h200x4: the topology file gpuhost
built from a two- and a four-H200 guest's own snapshot is the one NCCL read there, and NCCL's
all_reduce was no slower with it."""

from __future__ import annotations

import dataclasses
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhost.checks import AuditPolicy, Severity, run_checks
from gpuhost.facts.build import build_facts
from gpuhost.facts.model import NcclTopologyFile
from gpuhost.facts.nccl import parse_nccl_topology
from gpuhost.facts.snapshot import open_snapshot
from gpuhost.render.nccl_topology import topology_for_guest, topology_xml
from gpuhost.selection import GpuSelector
from tests.helpers import FIXTURES


@dataclass(frozen=True)
class TopologyCapture:
    folder: str
    file_on_device: str  # where its capture.sh wrote the file there
    gpus: tuple[str, ...]  # the guest's GPUs, at its own bus IDs
    affinity: str  # the guest's CPUs as NCCL writes them (32 and 64 CPUs)

    @property
    def path(self) -> Path:
        return FIXTURES / self.folder

    def log(self, name: str) -> str:
        return (self.path / f"{name}.txt").read_text()

    def busbw(self, mode: str) -> dict[int, list[float]]:
        result = re.compile(
            rf"^RESULT size_mib=(\d+) world={len(self.gpus)} time_us=\S+ algbw=\S+ busbw=([\d.]+) correct=(\w+)$", re.M
        )
        found: dict[int, list[float]] = {}
        for run in (1, 2, 3):
            for size, value, correct in result.findall(self.log(f"{mode}-{run}")):
                assert correct == "True"
                found.setdefault(int(size), []).append(float(value))
        return found


CAPTURES = [
    TopologyCapture(
        "nccl-topology-h200x2",
        "/tmp/nccl-topology-h100x2/nccl-topology.xml",  # the kind asked for was nvidia-h100-x2
        ("0000:00:06.0", "0000:00:07.0"),
        "ffffffff",
    ),
    TopologyCapture(
        "nccl-topology-h200x4",
        "/tmp/nccl-topology-h200x4/nccl-topology.xml",
        ("0000:00:06.0", "0000:00:07.0", "0000:00:08.0", "0000:00:09.0"),
        "ffffffff,ffffffff",
    ),
]
each_capture = pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.folder)


@each_capture
def test_the_file_gpuhost_builds_from_the_guests_snapshot_is_the_one_nccl_read(capture: TopologyCapture) -> None:
    facts = build_facts(open_snapshot(capture.path / "snapshot"))
    assert topology_xml(topology_for_guest(facts)) == (capture.path / "nccl-topology.xml").read_text()
    # Every GPU of the guest, at the guest's own bus IDs.
    gpus = sorted(f.address for f in facts.pci if f.is_gpu)
    assert gpus == list(capture.gpus)
    assert parse_nccl_topology((capture.path / "nccl-topology.xml").read_text()) == dict.fromkeys(gpus, 0)


@each_capture
def test_nccl_says_it_loaded_the_file_only_when_named(capture: TopologyCapture) -> None:
    file = re.escape(capture.file_on_device)
    for run in (1, 2, 3):
        with_file, without = capture.log(f"with-{run}"), capture.log(f"without-{run}")
        for rank in range(len(capture.gpus)):
            assert re.search(rf"\[{rank}\] NCCL INFO NCCL_TOPO_FILE set by environment to {file}$", with_file, re.M)
            assert re.search(rf"\[{rank}\] NCCL INFO Loading topology file {file}$", with_file, re.M)
        assert "Loading topology file" not in without and " WARN " not in with_file + without
        assert "NCCL version 2.28.9" in with_file


@each_capture
def test_nccls_own_dump_lists_the_files_gpus_with_the_files_attributes(capture: TopologyCapture) -> None:
    ours = (capture.path / "nccl-topology.xml").read_text()
    for run in (1, 2, 3):
        # NCCL writes an attribute with no name (=""), which no XML parser takes: dropped to read the rest.
        dump = (capture.path / f"dump-with-{run}.xml").read_text().replace(' =""', "")
        assert parse_nccl_topology(dump) == parse_nccl_topology(ours)
        for gpu in capture.gpus:
            line = next(line for line in dump.splitlines() if f'busid="{gpu}"' in line)
            assert 'link_speed="32.0 GT/s PCIe" link_width="16"' in line and 'device="0x2335"' in line
        cpu = f'numaid="0" affinity="{capture.affinity}" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="207"'
        assert cpu in dump
        # NVML's NVLinks to the NVSwitch, one line a GPU, kept.
        assert dump.count('<nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/>') == len(capture.gpus)


@each_capture
def test_the_file_gives_the_gpus_their_node_and_busbw_is_not_lower_with_it(capture: TopologyCapture) -> None:
    def paths(text: str) -> list[str]:
        # NCCL's path lines of rank 0 ('GPU/0-60 :GPU/0-60 (0/5000.0/LOC) ...'), without the process prefix.
        return [line.split("] ", 1)[1] for line in text.splitlines() if "[0] NCCL INFO GPU/" in line]

    # The guest's sysfs gives the GPUs no NUMA node (numa_node -1): without the file NCCL hangs them
    # off an unknown CPU (CPU/0-ffffffffffffff, node -1); with it, off node 0, the guest's one node.
    # Nothing else of the graph moves: the NVLinks through the NVSwitch, the Gen5 x16 link (48 GB/s).
    for run in (1, 2, 3):
        with_paths, without_paths = paths(capture.log(f"with-{run}")), paths(capture.log(f"without-{run}"))
        assert len(with_paths) >= len(capture.gpus)
        assert all("CPU/0-0 " in p and "ffffffff" not in p for p in with_paths)
        assert all("CPU/0-ffffffffffffff " in p for p in without_paths)
        assert [p.replace("CPU/0-ffffffffffffff ", "CPU/0-0 ") for p in without_paths] == with_paths
    with_file, without = capture.busbw("with"), capture.busbw("without")
    assert sorted(with_file) == sorted(without) == [1024, 4096]
    for size in (1024, 4096):
        assert len(with_file[size]) == len(without[size]) == 3
        # Not lower beyond the baseline's own run-to-run spread (0.8% at 4 GiB on two GPUs): 1%.
        assert statistics.median(with_file[size]) >= 0.99 * statistics.median(without[size]), size


@each_capture
def test_the_audit_of_that_guest_with_the_file_installed_warns_no_more(capture: TopologyCapture) -> None:
    facts = build_facts(open_snapshot(capture.path / "snapshot"))
    policy = AuditPolicy(gpus=GpuSelector(select_all_nvidia=True))
    _, _, bare = run_checks(capture.folder, facts, policy)
    flat = sorted(f.subject for f in bare if f.code == "guest.topology.flat" and f.severity == Severity.WARNING)
    assert flat == list(capture.gpus)
    listed = parse_nccl_topology((capture.path / "nccl-topology.xml").read_text())
    installed = NcclTopologyFile("/etc/gpuhost/nccl-topology.xml", "/etc/nccl.conf", listed, None)
    _, _, findings = run_checks(capture.folder, dataclasses.replace(facts, nccl_topology=installed), policy)
    assert [f.code for f in findings if f.severity != Severity.INFO] == []
    (told,) = (f for f in findings if f.code == "guest.nccl.topology")
    assert f"lists all {len(capture.gpus)} GPU(s)" in told.message
