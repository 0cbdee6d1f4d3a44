"""`gpuhost rollback`'s check of the old command line (what it undoes: tests/plan/test_rollback_plan.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan.verify import verify_rollback
from tests.helpers import SNAPSHOTS


def _lab(tmp_path: Path, cmdline: str | None = None, dropin: bool = False) -> SnapshotTree:
    root = tmp_path / "snapshot"
    shutil.copytree(SNAPSHOTS / "lab-gpu-pair-fresh", root)
    if cmdline is not None:
        (root / "proc/cmdline").write_text(cmdline + "\n")
    if dropin:
        (root / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/default/grub.d/gpuhost.cfg").write_text("# Managed by gpuhost\n")
    return SnapshotTree(root)


def test_a_host_on_its_grub_line_is_rolled_back(tmp_path: Path) -> None:
    result = verify_rollback("lab-1", build_facts(_lab(tmp_path)))
    assert result["ok"], result
    assert result["expected"] == "console=tty0 console=ttyS0,115200n8"


def test_gpuhost_options_or_the_trial_entry_left_on_the_command_line_are_not_rolled_back(tmp_path: Path) -> None:
    fresh = (SNAPSHOTS / "lab-gpu-pair-fresh/proc/cmdline").read_text().strip()
    still = verify_rollback("lab-1", build_facts(_lab(tmp_path / "a", fresh + " vfio-pci.ids=1234:1111 iommu=pt")))
    assert not still["ok"] and "does not end with the GRUB line" in still["summary"]
    trial = verify_rollback("lab-1", build_facts(_lab(tmp_path / "b", fresh + " panic=10 gpuhost.trial=1")))
    assert not trial["ok"] and "trial entry" in trial["summary"]
    dropin = verify_rollback("lab-1", build_facts(_lab(tmp_path / "c", dropin=True)))
    assert not dropin["ok"] and "/etc/default/grub.d/gpuhost.cfg is still there" in dropin["summary"]


def test_options_before_the_grub_line_or_an_unknown_grub_line_are_not_rolled_back(tmp_path: Path) -> None:
    fresh = (SNAPSHOTS / "lab-gpu-pair-fresh/proc/cmdline").read_text().strip()
    extra = fresh.replace(" ro ", " ro iommu=pt ")
    result = verify_rollback("lab-1", build_facts(_lab(tmp_path / "a", extra)))
    assert not result["ok"] and "options beyond the GRUB line: iommu=pt" in result["summary"]
    assert [problem["code"] for problem in result["problems"]] == ["verify.rollback.extra_options"]
    unknown = _lab(tmp_path / "b")
    (unknown.root / "commands/grub-effective.txt").unlink()
    result = verify_rollback("lab-1", build_facts(unknown))
    assert [problem["code"] for problem in result["problems"]] == ["verify.rollback.grub_unknown"]
