"""The extended lab set's rotation (tests/lab/rotation.py): one module per CI run, chosen from the
commit alone, the whole set over consecutive landings, and collected as chosen."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lab import rotation

LAB = Path(__file__).resolve().parents[1] / "lab"


def test_consecutive_commits_cover_the_whole_set_and_a_commit_always_chooses_the_same_module() -> None:
    chosen = [rotation.choose(None, count).chosen for count in range(600, 600 + len(rotation.EXTENDED))]
    assert all(len(modules) == 1 for modules in chosen)
    assert sorted(module for (module,) in chosen) == sorted(rotation.EXTENDED)
    assert rotation.choose(None, 612) == rotation.choose(None, 612)
    size = len(rotation.EXTENDED)
    assert f"commit count 612, 612 mod {size} = {612 % size}: " in rotation.choose(None, 612).why


def test_the_variable_runs_all_none_or_the_named_modules_and_refuses_a_name_outside_the_set() -> None:
    assert rotation.choose("all", 3).chosen == rotation.EXTENDED
    assert rotation.choose("none", 3).chosen == ()
    named = f"{rotation.EXTENDED[3]}, {rotation.EXTENDED[1]}"
    assert rotation.choose(named, 3).chosen == (rotation.EXTENDED[1], rotation.EXTENDED[3])
    for bad in ("test_faults_lab.py", ",", "all,none"):
        with pytest.raises(rotation.RotationError, match="names no module of the extended set"):
            rotation.choose(bad, 3)


def test_without_a_commit_count_no_module_runs_and_the_reason_says_why() -> None:
    outcome = rotation.choose(None, None)
    assert outcome.chosen == () and outcome.left_out == rotation.EXTENDED
    assert "not a git checkout" in outcome.why
    assert rotation.commit_count(Path("/")) is None


def _group_of(module: Path) -> str:
    """The xdist_group a lab module's pytestmark names."""
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "xdist_group":
            return str(ast.literal_eval(node.args[0]))
    raise AssertionError(f"{module.name} names no xdist_group")


def test_every_extended_module_exists_and_runs_in_the_lighter_lab_group() -> None:
    for name in rotation.EXTENDED:
        assert (LAB / name).is_file(), name
        assert _group_of(LAB / name) == "lab-rest", name


def test_the_lab_collects_only_the_chosen_modules_of_the_set() -> None:
    chosen = rotation.EXTENDED[2]
    environment = {**os.environ, rotation.EXTENDED_ENV: chosen}
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-n", "0", "-p", "no:cacheprovider", str(LAB)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=LAB.parents[1],
        timeout=300,
        check=False,
    )
    collected = set(re.findall(r"<Module (\S+)>", listed.stdout))
    assert chosen in collected, listed.stdout[-2000:]
    assert not collected & (set(rotation.EXTENDED) - {chosen}), collected
    assert "test_faults_lab.py" in collected  # the per-landing modules are always collected
    assert f"extended lab set: {rotation.EXTENDED_ENV}={chosen}" in listed.stdout
