"""Audit and plan cases as data: tests/fixtures/audit-cases/<case>/case.json, walked by one test.

A case is a real capture (tests/fixtures/snapshots/<base>) with the few files a real host would
have different removed or edited, the audit policy, the codes the audit must (and must not) find,
and optionally the planner's variables with the exact refusals it must give. Adding a case adds
no code. The keys:

    base          the snapshot it derives from
    why           what real host it stands for, and what was changed (required: a reader must see it)
    gpus, role, allow_shared_group    the audit policy (gpuhost_gpus, gpuhost_role, ...)
    vms           gpuhost_vms: the VMs declared for the host (the audit policy's, and the plan's variable)
    remove        paths (files or directories) a host would not have, or the audit could not read
    edit          {path: {"write": text} | {"append": text} | {"replace": [old, new]}}
    audit         codes the audit must report;  not_in_audit: codes it must not
    severity      {code: severity} where a code's severity is the point of the case
    plan          {"variables": {...}, "refusals": [codes, in order]}
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.policy import Role
from gpuhost.inventory.spec import parse_vms
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.selection import GpuSelector
from tests.helpers import FIXTURES, SNAPSHOTS

CASES = FIXTURES / "audit-cases"
CASE_KEYS = {"base", "why", "gpus", "role", "allow_shared_group", "remove", "edit", "audit", "not_in_audit"}
CASE_KEYS |= {"severity", "plan", "vms"}


def load_case(directory: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads((directory / "case.json").read_text())
    unknown = set(case) - CASE_KEYS
    assert not unknown, f"{directory.name}: unknown keys {sorted(unknown)}"
    assert case.get("why"), f"{directory.name}: say what real host the case stands for and what was changed"
    return case


def derive_snapshot(case: dict[str, Any], into: Path) -> Path:
    """Copy the real capture and apply the case's changes; every change must hit an existing file."""
    root = into / "snapshot"
    shutil.copytree(SNAPSHOTS / case["base"], root, symlinks=True)
    for relative in case.get("remove", []):
        path = root / relative
        assert path.exists(), f"{relative} is not in {case['base']}: nothing to remove"
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for relative, change in case.get("edit", {}).items():
        path = root / relative
        ((kind, value),) = change.items()
        if kind == "write":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)
            continue
        assert path.is_file(), f"{relative} is not in {case['base']}: nothing to {kind}"
        text = path.read_text()
        if kind == "append":
            path.write_text(text + value)
        else:
            old, new = value
            assert old in text, f"{relative} of {case['base']} does not contain {old!r}"
            path.write_text(text.replace(old, new))
    return root


@pytest.mark.parametrize("directory", sorted(p for p in CASES.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_audit_case(directory: Path, tmp_path: Path) -> None:
    case = load_case(directory)
    facts = build_facts(SnapshotTree(derive_snapshot(case, tmp_path)))
    policy = AuditPolicy(
        gpus=GpuSelector.parse(case.get("gpus", "all"), directory.name),
        role=Role(case.get("role", "auto")),
        allow_shared_group=tuple(case.get("allow_shared_group", ())),
        vms=parse_vms(case.get("vms"), directory.name),
    )
    _, _, findings = run_checks(directory.name, facts, policy)
    found = {finding.code for finding in findings}
    assert set(case["audit"]) <= found, f"missing {sorted(set(case['audit']) - found)}; found {sorted(found)}"
    assert not set(case.get("not_in_audit", [])) & found, f"found {sorted(found)}"
    for code, severity in case.get("severity", {}).items():
        assert {f.severity.value for f in findings if f.code == code} == {severity}, code
    for finding in findings:
        assert finding.message.startswith(f"{directory.name}: "), finding  # every message names the host
    if "plan" in case:
        variables = {"gpuhost_gpus": case.get("gpus", "all"), **case["plan"].get("variables", {})}
        if "vms" in case:
            variables["gpuhost_vms"] = case["vms"]
        plan = plan_host(directory.name, facts, PlanSettings.from_variables(variables, f"case {directory.name}"))
        assert [r.code for r in plan.refusals] == case["plan"]["refusals"]
        assert all(r.remedy for r in plan.refusals), "every refusal names its fix"
