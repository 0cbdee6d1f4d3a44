"""Issue 13 class 13: the audit's text report grows linearly with the GPUs of one IOMMU group.

The host is the real lab capture (tests/fixtures/snapshots/lab-gpu-pair-fresh) with its GPU's
function directory cloned to N more addresses in the same IOMMU group (as a switch without ACS
puts every card behind it in one group). The report once named every function of the group for
every GPU, in its table and in two findings per function per GPU: 300 GPUs took over 60 s. Time is
not asserted (no timed unit tests); size and content are.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from gpuhost.errors import InputError
from gpuhost.problems import LISTED_LIMIT
from tests.helpers import SNAPSHOTS

pytestmark = pytest.mark.hostile  # issue 13's corpus: pytest -m hostile

BASE = SNAPSHOTS / "lab-gpu-pair-fresh"
GPU = "0000:01:00.0"  # the capture's GPU (1234:1111, with its audio function 01:00.1), IOMMU group 6
GROUP = 6


def one_group_of(count: int, into: Path) -> Path:
    """The capture with `count` more GPUs like its own, every one in the GPU's IOMMU group."""
    root = into / f"gpus-{count}"
    shutil.copytree(BASE, root, symlinks=True)
    devices = root / "sys/bus/pci/devices"
    group = root / f"sys/kernel/iommu_groups/{GROUP}/devices"
    paths = root / "commands/pci-device-paths.txt"
    lines = [paths.read_text()]
    for number in range(count):
        address = f"0000:{0x10 + number // 32:02x}:{number % 32:02x}.0"
        shutil.copytree(devices / GPU, devices / address, symlinks=True)
        (group / address).write_text(f"../../../../devices/pci0000:00/0000:00:03.0/{address}\n")
        lines.append(f"{address} ../../../devices/pci0000:00/0000:00:03.0/{address}\n")
    paths.write_text("".join(lines))
    return root


def report(snapshot: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["audit", "--gpus", "1234:1111", "--from-snapshot", str(snapshot)]) == 1
    out: str = capsys.readouterr().out
    return out


def test_the_text_report_grows_linearly_with_the_gpus_of_one_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = report(one_group_of(100, tmp_path), capsys)
    large = report(one_group_of(300, tmp_path), capsys)
    per_gpu_small, per_gpu_large = len(small) / 101, len(large) / 301
    assert per_gpu_large < 1.15 * per_gpu_small, (per_gpu_small, per_gpu_large)  # quadratic: 3x
    assert len(large) < 4000 * 301, "a few lines per GPU"

    lines = large.splitlines()
    gpus = [f"0000:{0x10 + n // 32:02x}:{n % 32:02x}.0" for n in range(300)]
    functions = 302  # the 301 GPUs and the capture's audio function
    # Each function's binding is judged once, not once per GPU of its group.
    assert sum(" gpu.driver: " in line for line in lines) == functions
    assert sum(" gpu.vfio_ids.missing: " in line for line in lines) == functions
    # Each GPU says how many GPUs share its group and names a bounded number of them.
    shared = [line for line in lines if " gpu.group.shared: " in line]
    assert len(shared) == 301
    assert all(f"group {GROUP} with 300 other GPU(s)" in line for line in shared)
    assert all(line.count("[1234:1111]") == 1 + LISTED_LIMIT for line in shared)
    assert all(line.rstrip().endswith("to one guest") for line in shared)
    assert all(f"and {300 - LISTED_LIMIT} more" in line for line in shared)
    # The table has a row per GPU; the group's members are counted there and named once below it.
    rows = [line for line in lines if line.startswith(tuple(gpus))]
    assert len(rows) == 300 and all(f"+301 in group {GROUP}" in row for row in rows)
    (members,) = [line for line in lines if line.startswith(f"  IOMMU group {GROUP}:")]
    assert f"{functions} functions go to a guest together" in members and "--json lists them all" in members


def test_the_json_still_lists_every_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = one_group_of(20, tmp_path)
    assert main(["audit", "--json", "--gpus", "1234:1111", "--from-snapshot", str(snapshot)]) == 1
    host = json.loads(capsys.readouterr().out)
    assert len(host["gpus"]) == 21 + 1  # and the kept console GPU
    assert all(len(gpu["group_members"]) == 22 for gpu in host["gpus"] if gpu["iommu_group"] == GROUP)


def test_a_hosts_error_quoting_a_huge_value_is_bounded_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host's error is made in one place (audit._failed): JSON, text and plan get it bounded."""

    def refuse(tree: object) -> None:
        raise InputError(f"snapshot value {'x' * 3_000_000!r} is not valid. Fix the snapshot.")

    monkeypatch.setattr("gpuhost.audit.build_facts", refuse)
    for argv in (["audit", "--json"], ["audit"], ["plan", "--json"], ["plan"]):
        assert main([*argv, "--from-snapshot", str(BASE)]) == 2
        out = capsys.readouterr().out
        assert len(out) < 5000 and "characters left out" in out and "Fix the snapshot." in out, argv


def test_a_failed_tasks_huge_stderr_is_bounded_in_the_rollout_report() -> None:
    from gpuhost.rollout.engine import stop_outcome
    from gpuhost.rollout.report import HostStatus

    stderr = "E: " + "dpkg: error processing package nvidia-dkms\n" * 100_000 + "E: Sub-process returned 1"
    outcome = stop_outcome("runner_on_failed", "Install packages", {"stderr": stderr})
    assert outcome.status is HostStatus.FAILED
    assert len(outcome.message) < 2500 and outcome.message.endswith("Sub-process returned 1")
    assert "characters left out" in outcome.message
