"""Every registered problem code is produced by some test, and the docs' code tables are the registry's.

tests/conftest.py records the code of every `Problem` built during the session (in every
pytest-xdist worker) and, at the end of a run of the whole fast suite (every test module but the
lab's tests/lab/, no -k or --deselect: the README's test command and CI), fails the session naming each
registered code that no test produced (`unproduced` below). A partial run has not built every
module's problems, so it is not judged.

The tables of docs/reference/problem-codes.md (audit findings, planner refusals, verification,
render conflicts, smoke-test findings) are generated from the registry: regenerate them with
GPUHOST_REGEN_GOLDEN=1 after registering a code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import gpuhost.audit
import gpuhost.bench.health  # registers the smoke-test's health codes; verdict's come with it
import gpuhost.bench.node  # registers the node measurements' codes (smoke-test --all)
import gpuhost.plan.planner
import gpuhost.plan.verify
import gpuhost.render.domain  # noqa: F401  (registers render's conflicts)
from gpuhost.problems import REGISTRY, Severity, Stage, codes_of, register

ROOT = Path(__file__).resolve().parent.parent
CODES_PAGE = ROOT / "docs" / "reference" / "problem-codes.md"
REGENERATE = os.environ.get("GPUHOST_REGEN_GOLDEN") == "1"
TABLE_STAGES = (Stage.AUDIT, Stage.PLAN, Stage.RENDER, Stage.VERIFY, Stage.SMOKE_TEST)


def unproduced(produced: set[str]) -> list[str]:
    """Registered codes of the stages with code tables that no test produced."""
    return sorted(code for code, entry in REGISTRY.items() if entry.stage in TABLE_STAGES and code not in produced)


def test_the_check_fails_for_a_code_nobody_produces() -> None:
    """The check (tests/conftest.py) can fail: with nothing produced, every registered code is reported."""
    assert unproduced(set()) == sorted(code for code, e in REGISTRY.items() if e.stage in TABLE_STAGES)
    assert "gpu.group.unknown" in unproduced({"gpu.group.clean"})


@pytest.mark.parametrize(
    ("code", "stage", "says"),
    [
        ("group.intruder", Stage.PLAN, "must start with 'plan.'"),  # the plan's code before issue 29
        ("gpu.group.intruder", Stage.RENDER, "must start with 'render.'"),
        ("node.nccl.missing", Stage.SMOKE_TEST, "must start with 'smoke.'"),
        ("verify.cmdline.missing", Stage.PLAN, "must start with 'plan.'"),
        ("plan.group.intruder", Stage.AUDIT, "in another stage's namespace 'plan.'"),
    ],
)
def test_register_refuses_a_code_outside_its_stages_namespace(code: str, stage: Stage, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        register(code, stage, Severity.ERROR, "refused")
    assert REGISTRY.get(code) is None or REGISTRY[code].stage is not stage


def test_every_registered_code_is_in_its_stages_namespace() -> None:
    namespaces = {stage.namespace for stage in Stage if stage.namespace is not None}
    for code, entry in REGISTRY.items():
        if entry.stage.namespace is not None:
            assert code.startswith(entry.stage.namespace), code
        else:
            assert not any(code.startswith(namespace) for namespace in namespaces), code


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
def test_problem_code_page_table_is_the_registry(stage: Stage) -> None:
    text = CODES_PAGE.read_text()
    pattern = _marked(stage)
    match = pattern.search(text)
    assert match, f"{CODES_PAGE} has no <!-- problem-codes:{stage.value} --> table"
    expected = markdown_table(stage) + "\n"
    if REGENERATE and match.group(2) != expected:
        CODES_PAGE.write_text(pattern.sub(lambda m: m.group(1) + expected + m.group(3), text))
        return
    readme_codes = re.findall(r"^\| `([^`]+)` \|", match.group(2), flags=re.M)
    assert readme_codes == [entry.code for entry in codes_of(stage)], "regenerate with GPUHOST_REGEN_GOLDEN=1"
    assert match.group(2) == expected, (
        "the problem-code page's table differs from the registry: regenerate with GPUHOST_REGEN_GOLDEN=1"
    )


def test_the_unknowns_table_names_every_audit_unknown_with_its_severity() -> None:
    """docs/audit.md's "Unknown facts and READY": which unknowns a READY host can have (issue 28.4)."""
    text = (ROOT / "docs" / "audit.md").read_text()
    table = text.split("### Unknown facts and READY", 1)[1].split("\n\n", 3)[2]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for code, entry in REGISTRY.items():
        if entry.stage is not Stage.AUDIT or not code.endswith("unknown"):
            continue
        (row,) = [row for row in rows if f"`{code}`" in row.split(" | ")[0]]
        assert f"| {entry.severity.value} |" in row, (code, entry.severity, row)
        # An error can never leave the host READY; the others say why they can.
        verdict = row.rstrip(" |").split(" | ")[-1]
        assert verdict.startswith("no" if entry.severity.value == "error" else ("yes", "in practice no")), row
