"""Every registered problem code is produced by some test, and README's tables are the registry's.

tests/conftest.py records the code of every `Problem` built during the session and runs this module
last. When the whole fast suite ran (every tests/test_*.py collected, no -k), the codes it produced
are checked directly; in a partial run (one file, -k) this test runs the fast suite in a child
pytest first, so it gives the same answer whatever was selected (and takes that suite's time).

README's tables of audit findings, planner refusals and render conflicts are generated from the
registry: regenerate them with GPUHOST_REGEN_GOLDEN=1 after registering a code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpuhost.audit
import gpuhost.plan.planner
import gpuhost.plan.verify
import gpuhost.render.domain  # noqa: F401  (registers render's conflicts)
from gpuhost.problems import REGISTRY, Stage, codes_of

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PRODUCED_CODES_FILE_ENV = "GPUHOST_PRODUCED_CODES_FILE"  # tests/conftest.py writes the session's codes there
REGENERATE = os.environ.get("GPUHOST_REGEN_GOLDEN") == "1"
TABLE_STAGES = (Stage.AUDIT, Stage.PLAN, Stage.RENDER, Stage.VERIFY)


def _produced_by_the_fast_suite(tmp_path: Path) -> set[str]:
    out = tmp_path / "codes.txt"
    command = [sys.executable, "-m", "pytest", "-m", "not lab", "-q", "-p", "no:cacheprovider", "tests"]
    command += ["--deselect", f"tests/{Path(__file__).name}"]
    env = {**os.environ, PRODUCED_CODES_FILE_ENV: str(out)}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert out.exists(), f"the fast suite did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return set(out.read_text().split())


def unproduced(produced: set[str]) -> list[str]:
    """Registered codes of the stages this branch owns that no test produced."""
    return sorted(code for code, entry in REGISTRY.items() if entry.stage in TABLE_STAGES and code not in produced)


def test_every_registered_code_is_produced_by_a_test(
    produced_codes: tuple[frozenset[str], bool], tmp_path: Path
) -> None:
    so_far, whole_suite = produced_codes
    produced = set(so_far) if whole_suite else _produced_by_the_fast_suite(tmp_path)
    missing = unproduced(produced)
    assert not missing, (
        f"{len(missing)} registered problem code(s) are produced by no test: {', '.join(missing)}. "
        "Add a case (tests/fixtures/audit-cases/ for the audit and the planner) that produces each."
    )


def test_the_check_fails_for_a_code_nobody_produces() -> None:
    """The check above can fail: with nothing produced, every registered code is reported."""
    assert unproduced(set()) == sorted(code for code, e in REGISTRY.items() if e.stage in TABLE_STAGES)
    assert "gpu.group.unknown" in unproduced({"gpu.group.clean"})


def markdown_table(stage: Stage) -> str:
    rows = ["| code | severity | what |", "| --- | --- | --- |"]
    for entry in codes_of(stage):
        severity = entry.severity.value if entry.severity is not None else "varies"
        rows.append(f"| `{entry.code}` | {severity} | {entry.summary.replace('|', '/')} |")
    return "\n".join(rows)


def _marked(stage: Stage) -> re.Pattern[str]:
    name = re.escape(stage.value)
    return re.compile(rf"(<!-- problem-codes:{name} -->\n)(.*?)(<!-- /problem-codes:{name} -->)", re.S)


@pytest.mark.parametrize("stage", TABLE_STAGES, ids=lambda stage: stage.value)
def test_readme_table_is_the_registry(stage: Stage) -> None:
    text = README.read_text()
    pattern = _marked(stage)
    match = pattern.search(text)
    assert match, f"README.md has no <!-- problem-codes:{stage.value} --> table"
    expected = markdown_table(stage) + "\n"
    if REGENERATE and match.group(2) != expected:
        README.write_text(pattern.sub(lambda m: m.group(1) + expected + m.group(3), text))
        return
    readme_codes = re.findall(r"^\| `([^`]+)` \|", match.group(2), flags=re.M)
    assert readme_codes == [entry.code for entry in codes_of(stage)], "regenerate with GPUHOST_REGEN_GOLDEN=1"
    assert match.group(2) == expected, (
        "README's table differs from the registry: regenerate with GPUHOST_REGEN_GOLDEN=1"
    )
