"""docs/reference/thresholds.md is the rules' table (gpuhost.bench.rules): one GPU's lines and the
node's, each against its reference and against a baseline, with the reason. Regenerate the page
with GPUHOST_REGEN_GOLDEN=1 after changing a rule; the verdict.py docstring points here."""

from __future__ import annotations

import os
from pathlib import Path

from gpuhost.bench.rules import NODE_RULES, P2P_RULE, RULES, Rule

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "thresholds.md"
REGENERATE = os.environ.get("GPUHOST_REGEN_GOLDEN") == "1"

INTRO = """# Smoke-test thresholds

Each figure the smoke-test judges, the reference it is compared with, its PASS and FAIL lines (WARN
between; no FAIL line: it never fails), and its lines against a baseline run (`--baseline`: a
fraction of the same figure in the earlier run). A fraction is of the
reference; an absolute line is in the figure's own unit (a launch in microseconds: lower is
better, and against a baseline the fraction is the baseline's time over this run's). This page is
generated from `gpuhost.bench.rules` (a test fails when they differ).
"""


def _line(value: float | None, rule: Rule, *, fail: bool) -> str:
    if value is None:
        return "-"
    if rule.reference is None and rule.lower_is_better:
        return f"> {value:g}" if fail else f"<= {value:g}"
    shown = f"{value:g}x" if rule.reference is None else f"{value:.0%}"
    return f"< {shown}" if fail else f">= {shown}"


def _rows(rules: tuple[Rule, ...]) -> list[str]:
    rows = [
        "| figure | what | compared with | PASS | FAIL | against a baseline: PASS | FAIL | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rule in rules:
        judged = rule.pass_at is not None
        reference = rule.reference or ("absolute" if judged else "not judged (INFO)")
        cells = [
            f"`{rule.metric}`",
            rule.label,
            reference,
            _line(rule.pass_at, rule, fail=False),
            _line(rule.fail_below, rule, fail=True),
            "-" if rule.metric.endswith("_median") else f">= {rule.baseline_pass:.0%}",
            "-" if rule.metric.endswith("_median") else f"< {rule.baseline_fail:.0%}",
            rule.why
            + (f"; against a baseline: {rule.baseline_why}" if rule.baseline_why != RULES[0].baseline_why else ""),
        ]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return rows


def expected_page() -> str:
    parts = [
        INTRO,
        "## One GPU (`smoke-test`, and each GPU of `--all`)\n",
        *_rows((*RULES, P2P_RULE)),
        "",
        "## The node (`smoke-test --all`)\n",
        *_rows(NODE_RULES),
        "",
    ]
    return "\n".join(parts)


def test_the_thresholds_page_is_the_rules_table() -> None:
    expected = expected_page()
    if REGENERATE:
        PAGE.write_text(expected)
    assert PAGE.read_text() == expected, "docs/reference/thresholds.md differs from gpuhost.bench.rules: regenerate it"


def test_every_judged_metric_of_a_run_has_its_row() -> None:
    text = PAGE.read_text()
    for rule in (*RULES, P2P_RULE, *NODE_RULES):
        assert f"| `{rule.metric}` |" in text
