"""CI's flake guard (.ci/flake.py, .ci/stage_table.py): which failed modules are re-run, and how
the stage table reports them. The timings are the shape tests/conftest.py writes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

CI = Path(__file__).resolve().parents[2] / ".ci"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, CI / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flake = _load("flake")
stage_table = _load("stage_table")


def _span(
    start: float, stop: float, passed: int = 1, failed: int = 0, failures: list[str] | None = None
) -> dict[str, Any]:
    return {
        "start": start,
        "stop": stop,
        "seconds": stop - start,
        "passed": passed,
        "failed": failed,
        "skipped": 0,
        "failures": failures or [],
    }


MOLECULE = "tests/lab/test_molecule.py"
FAILED_MOLECULE = _span(
    100, 1100, passed=0, failed=1, failures=[f"{MOLECULE}::test_molecule_scenario_passes_every_step"]
)


def test_a_failed_lab_module_is_rerun_when_time_allows() -> None:
    timings = {MOLECULE: FAILED_MOLECULE, "tests/plan/test_planner.py": _span(1, 2, passed=40)}
    modules, why = flake.modules_to_rerun(timings, elapsed=2400)
    assert modules == [MOLECULE] and "re-running" in why


def test_a_failed_fast_test_is_never_rerun() -> None:
    timings = {MOLECULE: FAILED_MOLECULE, "tests/plan/test_planner.py": _span(1, 2, passed=39, failed=1)}
    modules, why = flake.modules_to_rerun(timings, elapsed=2400)
    assert modules == [] and "tests/plan/test_planner.py" in why


def test_no_rerun_past_the_ci_limit() -> None:
    # 1000 s of module x 1.5 after 4000 s spent would end past 5400 - 300 s.
    modules, why = flake.modules_to_rerun({MOLECULE: FAILED_MOLECULE}, elapsed=4000)
    assert modules == [] and "no time" in why


def test_no_failure_recorded_no_rerun() -> None:
    assert flake.modules_to_rerun({MOLECULE: _span(1, 2)}, elapsed=10)[0] == []


def test_the_stage_table_names_a_flaky_module_and_a_twice_failed_one(tmp_path: Path) -> None:
    stages = tmp_path / "stages"
    stages.write_text("start 0\nsetup 30\nlint 50\ntests 2000\nrerun 3000\n")
    faults = "tests/lab/test_faults_lab.py"
    first = {
        MOLECULE: FAILED_MOLECULE,
        faults: _span(60, 1900, passed=7, failed=1, failures=[f"{faults}::test_rollback"]),
        "tests/plan/test_planner.py": _span(1900, 1910, passed=40),
    }
    again = {MOLECULE: _span(2000, 2900, passed=1), faults: _span(2000, 2990, passed=7, failed=1)}
    (tmp_path / "first.json").write_text(json.dumps(first))
    (tmp_path / "again.json").write_text(json.dumps(again))
    printed = subprocess.run(
        [
            sys.executable,
            str(CI / "stage_table.py"),
            str(stages),
            str(tmp_path / "first.json"),
            str(tmp_path / "again.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    molecule_row = next(line for line in printed.splitlines() if line.strip().startswith("test_molecule.py"))
    assert "FLAKY" in molecule_row and "test_molecule_scenario_passes_every_step" in molecule_row
    faults_row = next(line for line in printed.splitlines() if line.strip().startswith("test_faults_lab.py"))
    assert "FAILED twice" in faults_row
    assert f"ci: FLAKY: {MOLECULE}" in printed and "re-run: test_molecule.py" in printed


def test_a_module_that_passed_shows_its_counts() -> None:
    assert stage_table.outcome(_span(0, 1, passed=5)) == "5 passed"
    assert stage_table.rerun_verdict(FAILED_MOLECULE, None) == "FAILED (not re-run)"


def _rerun_arguments(timings: dict[str, Any], tmp_path: Path) -> list[str]:
    """The arguments .ci/run hands the re-run's pytest: flake.py's output, read as .ci/run reads it."""
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    script = (CI / "run").read_text()
    read = next(line.strip() for line in script.splitlines() if "mapfile -t rerun" in line)
    printed = subprocess.run(
        [
            "bash",
            "-c",
            f'{read.replace(".venv/bin/python", sys.executable)}; printf "%s\\n" "${{#rerun[@]}}" "${{rerun[@]}}"',
        ],
        cwd=CI.parent,
        env={"timings": str(tmp_path / "timings.json"), "started": str(int(time.time())), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    count, arguments = int(printed[0]), printed[1:]
    assert count == len(arguments)
    return arguments


def test_after_a_failed_fast_test_ci_re_runs_nothing_not_everything(tmp_path: Path) -> None:
    # flake.py once printed an empty line here; .ci/run read it as one empty argument, and `pytest ""`
    # ran all 1490 tests again, past CI's 90 minutes.
    timings = {MOLECULE: FAILED_MOLECULE, "tests/plan/test_planner.py": _span(1, 2, passed=39, failed=1)}
    assert _rerun_arguments(timings, tmp_path) == []


def test_ci_re_runs_exactly_the_failed_lab_module(tmp_path: Path) -> None:
    assert _rerun_arguments({MOLECULE: FAILED_MOLECULE}, tmp_path) == [MOLECULE]
