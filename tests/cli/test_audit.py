"""`gpuhost audit` and `gpuhost snapshot` through the CLI: exit codes, JSON, snapshots, bad input."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from gpuhost.cli.main import main
from gpuhost.facts.gather import capture
from gpuhost.facts.snapshot import GatherFormatError, unpack_gathered
from gpuhost.transport import CommandResult
from tests.helpers import SNAPSHOTS

H100 = str(SNAPSHOTS / "h100-guest")
DEV_VM = str(SNAPSHOTS / "dev-vm")
KEYS = {"schema", "host", "status", "reachable", "ready", "error", "role", "round_trips", "counts", "system", "gpus"}


def audit_json(capsys, *args):
    status = main(["audit", "--json", *args])
    lines = capsys.readouterr().out.strip().splitlines()
    return status, [json.loads(line) for line in lines]


def test_h100_snapshot_is_ready_as_a_guest(capsys):
    status, (host,) = audit_json(capsys, "--from-snapshot", H100)
    assert status == 0
    assert host.keys() >= KEYS and host["schema"] == "gpuhost.audit/1"
    assert host["host"] == "h100-passthrough-guest" and host["role"] == "guest" and host["ready"] is True
    (gpu,) = host["gpus"]
    assert gpu["vendor_device"] == "10de:2330" and gpu["driver"] == "nvidia"
    assert gpu["link"] == {"current_gen": 5, "current_width": 16, "max_gen": 5, "max_width": 16}
    assert host["system"]["iommu_active"] is False


def test_human_report_says_what_the_h100_is(capsys):
    assert main(["audit", "--from-snapshot", H100]) == 0
    out = capsys.readouterr().out
    assert "READY" in out and "passthrough guest, 1 GPU [10de:2330] on Gen5 x16, driver nvidia, no IOMMU" in out


def test_fleet_of_snapshots_exits_with_the_worst_status(capsys):
    status = main(["audit", "--from-snapshot", H100, "--from-snapshot", DEV_VM])
    out = capsys.readouterr().out
    assert status == 1
    assert "1 of 2 hosts ready" in out and "gpu.none" in out


def test_local_audit_is_the_snapshot_audit_of_the_same_machine(capsys, tmp_path):
    status, (live,) = audit_json(capsys)
    assert live["reachable"] and live["source"] == "local" and live["round_trips"] == 1
    assert status == (1 if live["counts"]["error"] else 0)
    assert main(["snapshot", "-o", str(tmp_path / "snap")]) == 0
    capsys.readouterr()
    assert (tmp_path / "snap/proc/cmdline").is_file() and (tmp_path / "snap/snapshot.json").is_file()
    _, (offline,) = audit_json(capsys, "--from-snapshot", str(tmp_path / "snap"))
    assert [(f["code"], f["severity"], f["subject"]) for f in offline["findings"]] == [
        (f["code"], f["severity"], f["subject"]) for f in live["findings"]
    ]


def test_snapshot_refuses_to_overwrite(capsys, tmp_path):
    (tmp_path / "existing").mkdir()
    assert main(["snapshot", "-o", str(tmp_path / "existing")]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--from-snapshot", "/nonexistent/snap"], "no such directory"),
        (["--gpus", "10de:2330;reboot", "--from-snapshot", H100], "neither a PCI address"),
        (["root@bad host"], "not a valid host name"),
        (["root@gpu01:99999"], "not a number from 1 to 65535"),
        (["$(id)@gpu01"], "not a valid login name"),
        (["--limit", "gpu01"], "--limit needs an inventory"),
        (["-i", "/nonexistent/inventory.yml"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_the_value_named(capsys, args, expected):
    assert main(["audit", *args]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err + captured.out


def test_snapshot_directory_without_a_snapshot_is_bad_input(capsys, tmp_path):
    status, (host,) = audit_json(capsys, "--from-snapshot", str(tmp_path))
    assert status == 2 and host["reachable"] is False and "not a gpuhost snapshot" in host["error"]


def _archive(add) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        add(tar)
    return buffer.getvalue()


def _file(tar, name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_unpacking_a_hostile_capture_is_refused(tmp_path):
    # A host we audit may be compromised: its answer must not write outside the snapshot.
    def escape(tar):
        _file(tar, "../../etc/evil")

    with pytest.raises(GatherFormatError):
        unpack_gathered(_archive(escape), tmp_path / "a")
    assert not (tmp_path / "etc").exists()

    def link(tar):
        info = tarfile.TarInfo("proc/cmdline")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/shadow"
        tar.addfile(info)
        _file(tar, "proc/version", b"Linux")

    unpack_gathered(_archive(link), tmp_path / "b")
    assert not (tmp_path / "b/proc/cmdline").exists()  # links are dropped, plain files kept
    assert (tmp_path / "b/proc/version").read_text() == "Linux"
    with pytest.raises(GatherFormatError):
        unpack_gathered(b"not a tar archive", tmp_path / "c")


def test_json_gives_the_numa_nodes_and_each_functions_memory_bars(capsys):
    """Real capture of the numa-gpus lab host: two nodes, and the second card's 1 TiB BAR."""
    _, (host,) = audit_json(capsys, "--from-snapshot", str(SNAPSHOTS / "lab-numa-gpus-vfio"))
    nodes = host["system"]["numa_nodes"]
    assert [(n["node"], n["cpus"], n["hugepages_1g"]) for n in nodes] == [(0, "0-1", 0), (1, "2-3", 0)]
    assert all(n["memory_kib"] > 2 << 20 for n in nodes)
    functions = {f["address"]: f for gpu in host["gpus"] for f in gpu["functions"]}
    # pci-testdev (class ff00) shares the virtio GPU's slot and group but is no GPU function: an intruder,
    # listed apart from the card's functions (issue 27.4).
    (intruder,) = next(gpu["intruders"] for gpu in host["gpus"] if gpu["address"] == "0000:82:00.0")
    assert "0000:82:00.1" not in functions
    functions[intruder["address"]] = intruder
    # pci-testdev's BAR 1 is I/O ports (0xc000-0xc0ff in the capture): not listed.
    assert functions["0000:82:00.1"]["bars"] == [
        {"index": 0, "size": 4096, "is_64bit": False, "prefetchable": False},
        {"index": 2, "size": 1 << 40, "is_64bit": True, "prefetchable": True},
    ]
    assert [(bar["index"], bar["size"]) for bar in functions["0000:81:00.0"]["bars"]] == [(0, 16 << 20), (2, 4096)]


def test_json_bars_of_the_h100_guest(capsys):
    _, (host,) = audit_json(capsys, "--from-snapshot", H100)
    (gpu,) = host["gpus"]
    (function,) = gpu["functions"]
    assert [(bar["index"], bar["size"]) for bar in function["bars"]] == [(0, 16 << 20), (2, 128 << 30), (4, 32 << 20)]
    assert host["system"]["numa_nodes"] == []


class _HostAnswering:
    """A host whose gather answers with `archive` (the hostile host: a clash cannot be caused by a
    real gather, whose tree is built by one script)."""

    description = "ssh://root@clash.example:22"
    round_trips = 1

    def __init__(self, archive: bytes) -> None:
        self.archive = archive

    def run(self, argv, stdin=b"", timeout=120.0):
        return CommandResult(0, self.archive, b"")

    def close(self) -> None:
        pass


def test_an_archive_that_contradicts_itself_is_the_hosts_fault_not_the_output_paths(tmp_path):
    def clash(tar):
        _file(tar, "proc/cmdline", b"root=/dev/sda1")
        _file(tar, "proc/cmdline/nested", b"x")  # proc/cmdline is a file and a directory

    with pytest.raises(GatherFormatError, match="'proc/cmdline/nested' clashes with another member"):
        capture(_HostAnswering(_archive(clash)), tmp_path / "snap", "clash")
    assert list(tmp_path.iterdir()) == []  # nothing half-written: the staging directory is gone
