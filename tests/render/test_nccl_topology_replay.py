"""Replay of tests/fixtures/nccl-topology-h200x2: the topology file gpuhost built from a two-H200
guest's own snapshot is the one NCCL read there, and NCCL's all_reduce was no slower with it."""

from __future__ import annotations

import dataclasses
import re
import statistics

from gpuhost.checks import AuditPolicy, Severity, run_checks
from gpuhost.facts.build import build_facts
from gpuhost.facts.model import NcclTopologyFile
from gpuhost.facts.nccl import parse_nccl_topology
from gpuhost.facts.snapshot import open_snapshot
from gpuhost.render.nccl_topology import topology_for_guest, topology_xml
from gpuhost.selection import GpuSelector
from tests.helpers import FIXTURES

CAPTURE = FIXTURES / "nccl-topology-h200x2"
FILE_ON_DEVICE = "/tmp/nccl-topology-h100x2/nccl-topology.xml"  # where capture.sh wrote it there
RESULT = re.compile(r"^RESULT size_mib=(\d+) world=2 time_us=\S+ algbw=\S+ busbw=([\d.]+) correct=(\w+)$", re.M)


def log(name: str) -> str:
    return (CAPTURE / f"{name}.txt").read_text()


def busbw(mode: str) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for run in (1, 2, 3):
        for size, value, correct in RESULT.findall(log(f"{mode}-{run}")):
            assert correct == "True"
            found.setdefault(int(size), []).append(float(value))
    return found


def test_the_file_gpuhost_builds_from_the_guests_snapshot_is_the_one_nccl_read():
    facts = build_facts(open_snapshot(CAPTURE / "snapshot"))
    assert topology_xml(topology_for_guest(facts)) == (CAPTURE / "nccl-topology.xml").read_text()
    # Every GPU of the guest, at the guest's own bus IDs.
    gpus = sorted(f.address for f in facts.pci if f.is_gpu)
    assert gpus == ["0000:00:06.0", "0000:00:07.0"]
    assert parse_nccl_topology((CAPTURE / "nccl-topology.xml").read_text()) == dict.fromkeys(gpus, 0)


def test_nccl_says_it_loaded_the_file_only_when_named():
    for run in (1, 2, 3):
        with_file, without = log(f"with-{run}"), log(f"without-{run}")
        for rank in (0, 1):
            assert re.search(
                rf"\[{rank}\] NCCL INFO NCCL_TOPO_FILE set by environment to {FILE_ON_DEVICE}$", with_file, re.M
            )
            assert re.search(rf"\[{rank}\] NCCL INFO Loading topology file {FILE_ON_DEVICE}$", with_file, re.M)
        assert "Loading topology file" not in without and " WARN " not in with_file + without
        assert "NCCL version 2.28.9" in with_file


def test_nccls_own_dump_lists_the_files_gpus_with_the_files_attributes():
    ours = (CAPTURE / "nccl-topology.xml").read_text()
    for run in (1, 2, 3):
        # NCCL writes an attribute with no name (=""), which no XML parser takes: dropped to read the rest.
        dump = (CAPTURE / f"dump-with-{run}.xml").read_text().replace(' =""', "")
        assert parse_nccl_topology(dump) == parse_nccl_topology(ours)
        for gpu in ("0000:00:06.0", "0000:00:07.0"):
            line = next(line for line in dump.splitlines() if f'busid="{gpu}"' in line)
            assert 'link_speed="32.0 GT/s PCIe" link_width="16"' in line and 'device="0x2335"' in line
        assert 'numaid="0" affinity="ffffffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="207"' in dump
        assert dump.count('<nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/>') == 2  # NVML's, kept


def test_the_file_gives_the_gpus_their_node_and_busbw_is_not_lower_with_it():
    def paths(text: str) -> list[str]:
        # NCCL's path lines of rank 0 ('GPU/0-60 :GPU/0-60 (0/5000.0/LOC) ...'), without the process prefix.
        return [line.split("] ", 1)[1] for line in text.splitlines() if "[0] NCCL INFO GPU/" in line]

    # The guest's sysfs gives the GPUs no NUMA node (numa_node -1): without the file NCCL hangs them
    # off an unknown CPU (CPU/0-ffffffffffffff, node -1); with it, off node 0, the guest's one node.
    # Nothing else of the graph moves: the NVLinks through the NVSwitch, the Gen5 x16 link (48 GB/s).
    for run in (1, 2, 3):
        with_paths, without_paths = paths(log(f"with-{run}")), paths(log(f"without-{run}"))
        assert with_paths and all("CPU/0-0 " in p and "ffffffff" not in p for p in with_paths)
        assert all("CPU/0-ffffffffffffff " in p for p in without_paths)
        assert [p.replace("CPU/0-ffffffffffffff ", "CPU/0-0 ") for p in without_paths] == with_paths
    with_file, without = busbw("with"), busbw("without")
    assert sorted(with_file) == sorted(without) == [1024, 4096]
    for size in (1024, 4096):
        assert len(with_file[size]) == len(without[size]) == 3
        # Not lower beyond the baseline's own run-to-run spread (0.8% at 4 GiB): 1%.
        assert statistics.median(with_file[size]) >= 0.99 * statistics.median(without[size]), size


def test_the_audit_of_that_guest_with_the_file_installed_warns_no_more():
    facts = build_facts(open_snapshot(CAPTURE / "snapshot"))
    policy = AuditPolicy(gpus=GpuSelector(select_all_nvidia=True))
    _, _, bare = run_checks("h200x2", facts, policy)
    assert sorted(f.subject for f in bare if f.code == "guest.topology.flat" and f.severity == Severity.WARNING) == [
        "0000:00:06.0",
        "0000:00:07.0",
    ]
    listed = parse_nccl_topology((CAPTURE / "nccl-topology.xml").read_text())
    installed = NcclTopologyFile("/etc/gpuhost/nccl-topology.xml", "/etc/nccl.conf", listed, None)
    _, _, findings = run_checks("h200x2", dataclasses.replace(facts, nccl_topology=installed), policy)
    assert [f.code for f in findings if f.severity != Severity.INFO] == []
    (told,) = (f for f in findings if f.code == "guest.nccl.topology")
    assert "lists all 2 GPU(s)" in told.message
