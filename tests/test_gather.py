"""The gather script run for real on this machine, privileged and not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.gather import gather_script
from gpuhost.facts.parsers import parse_cpulist
from gpuhost.facts.snapshot import MemoryTree, SnapshotTree, unpack_gathered

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
