"""The gather script run for real on this machine, privileged and not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.gather import gather_script
from gpuhost.facts.model import NcclTopologyFile
from gpuhost.facts.parsers import parse_cpulist
from gpuhost.facts.snapshot import MemoryTree, SnapshotTree, unpack_gathered
from gpuhost.render.nccl_topology import topology_for_guest, topology_xml
from tests.helpers import snapshot_facts

ESSENTIAL = ("proc/cmdline", "proc/cpuinfo", "proc/meminfo", "commands/status.txt", "commands/pci-device-paths.txt")


def gather_as(argv_prefix: list[str], tmp_path, name: str) -> SnapshotTree:
    result = subprocess.run([*argv_prefix, "sh", "-s"], input=gather_script(), capture_output=True, check=True)
    unpack_gathered(result.stdout, tmp_path / name)
    return SnapshotTree(tmp_path / name)


def test_an_unprivileged_user_gets_the_same_world_readable_files(tmp_path):
    # cp --parents used to give the mirrored directories the modes of /proc and /sys (0555), so
    # a non-root user could copy only the first file of each directory.
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    tree = gather_as(unprivileged, tmp_path, "user")
    for path in ESSENTIAL:
        assert (tmp_path / "user" / path).is_file(), path
    devices = tree.list("/sys/bus/pci/devices")
    assert devices and all(tree.read(f"/sys/bus/pci/devices/{d}/class") for d in devices)
    facts = build_facts(tree)
    assert facts.cpu is not None and facts.memory is not None and facts.cmdline is not None
    assert facts.running_as_root is (not unprivileged and os.geteuid() == 0)


def test_gathered_functions_match_the_kernels(tmp_path):
    facts = build_facts(gather_as([], tmp_path, "self"))
    cpus = Path("/sys/devices/system/cpu")
    assert facts.thread_siblings and facts.thread_siblings == {
        int(entry.name[3:]): parse_cpulist((entry / "topology" / "thread_siblings_list").read_text())
        for entry in cpus.glob("cpu[0-9]*")
        if (entry / "topology" / "thread_siblings_list").is_file()
    }
    devices = Path("/sys/bus/pci/devices")
    assert sorted(f.address for f in facts.pci) == sorted(entry.name for entry in devices.iterdir())
    for function in facts.pci:
        assert function.vendor == int((devices / function.address / "vendor").read_text(), 16)


def test_the_in_memory_tree_reads_as_the_snapshot_directory(tmp_path):
    archive = subprocess.run(["sh", "-s"], input=gather_script(), capture_output=True, check=True).stdout
    unpack_gathered(archive, tmp_path / "snap")
    assert build_facts(MemoryTree.from_archive(archive)) == build_facts(SnapshotTree(tmp_path / "snap"))


def gather_with_etc(tmp_path, etc: Path, name: str) -> SnapshotTree:
    """The gather with `etc` mounted over /etc, in a user and mount namespace of its own."""
    return gather_as(["unshare", "-rm", "sh", "-c", 'mount --bind "$0" /etc && exec "$@"', str(etc)], tmp_path, name)


def test_the_topology_file_nccl_conf_names_is_gathered_and_nothing_else_it_names(tmp_path):
    # The file gpuhost builds from the recorded H100 guest's snapshot.
    topology = tmp_path / "nccl-topology.xml"
    topology.write_text(topology_xml(topology_for_guest(snapshot_facts("h100-guest"))))
    etc = tmp_path / "etc"
    etc.mkdir()
    # NCCL takes the first setting of a key; a comment is no setting.
    (etc / "nccl.conf").write_text(f"#NCCL_TOPO_FILE=/x.xml\nNCCL_TOPO_FILE={topology}\nNCCL_TOPO_FILE=/y.xml\n")
    facts = build_facts(gather_with_etc(tmp_path, etc, "named"))
    assert facts.nccl_topology == NcclTopologyFile(
        str(topology), "/etc/nccl.conf", {"0000:00:06.0": 0}, None
    )
    # A path that is not an absolute .xml path is not read: nccl.conf cannot make the gather copy a secret.
    secret = tmp_path / "secret"
    secret.write_text("not for the snapshot\n")
    (etc / "nccl.conf").write_text(f"NCCL_TOPO_FILE={secret}\n")
    tree = gather_with_etc(tmp_path, etc, "not-named")
    assert tree.command("nccl-topology") is None and "not for the snapshot" not in str(tree.read(str(secret)))
    found = build_facts(tree).nccl_topology
    assert found is not None and found.path == str(secret) and found.gpus is None and found.error
