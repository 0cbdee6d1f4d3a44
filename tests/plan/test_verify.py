"""The verification after apply's reboot, as data: real captures against the plan made for them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.model import GIB_KIB, HugePagePool
from gpuhost.facts.parsers import parse_cmdline
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.verify import verify_host
from tests.helpers import snapshot_facts
from tests.render.test_domain import _with_1g_pages
from tests.test_audit_cases import CASES, derive_snapshot, load_case

VARIABLES = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}
SETTINGS = PlanSettings.from_variables(VARIABLES, "inventory host lab-1")


def lab_plan() -> dict:
    return plan_host("lab-1", snapshot_facts("lab-gpu-pair-fresh"), SETTINGS).require_applicable().to_json()


def codes(verification) -> list[str]:
    return [problem.code for problem in verification.problems]


def test_the_fresh_lab_host_is_not_as_planned_and_each_failure_is_a_problem():
    """The lab host as captured before apply, verified against its own plan: nothing applied yet."""
    verification = verify_host("lab-1", snapshot_facts("lab-gpu-pair-fresh"), SETTINGS, lab_plan())
    assert codes(verification) == [
        "verify.cmdline.missing",
        "verify.function.not_vfio",
        "verify.function.not_vfio",
        "verify.hugepages.count",
        "verify.audit.errors",
    ]
    assert not verification.ok and verification.summary.startswith("lab-1: not as planned: cmdline (missing [")
    data = verification.to_json()
    assert json.loads(json.dumps(data)) == data  # plain data for Ansible
    assert set(data) == {"ok", "status", "summary", "checks", "audit_errors", "cmdline", "problems"}
    assert data["status"] == "not-ready" and data["checks"][1] == {
        "name": "vfio-pci 0000:01:00.0",
        "ok": False,
        "detail": "driver bochs-drm",
    }
    assert all(problem["message"].startswith("lab-1: ") and problem["remedy"] for problem in data["problems"])


def test_the_lab_host_as_apply_leaves_it_is_ready():
    """The same capture with what apply and the reboot change: the planned options on the running
    command line, both functions on vfio-pci, the one 1 GiB page allocated."""
    plan = lab_plan()
    fresh = snapshot_facts("lab-gpu-pair-fresh")
    pci = tuple(
        dataclasses.replace(f, driver="vfio-pci") if f.address.startswith("0000:01:00.") else f for f in fresh.pci
    )
    cmdline = parse_cmdline(f"{fresh.cmdline} {' '.join(plan['kernel_options'])}")
    applied = _with_1g_pages(dataclasses.replace(fresh, pci=pci, cmdline=cmdline), 1)
    verification = verify_host("lab-1", applied, SETTINGS, plan)
    assert verification.ok, verification.summary
    assert verification.to_json()["problems"] == [] and verification.summary == "lab-1: ready for passthrough"


def test_a_loaded_host_driver_fails_the_verification(tmp_path: Path):
    """The case h100-guest-audited-as-host (nvidia and nvidia_uvm loaded) against the lab plan."""
    case = load_case(CASES / "h100-guest-audited-as-host")
    facts = build_facts(SnapshotTree(derive_snapshot(case, tmp_path)))
    verification = verify_host("h100", facts, SETTINGS, lab_plan())
    assert "verify.host_driver.loaded" in codes(verification)
    assert "loaded: nvidia, nvidia_uvm" in verification.summary


def test_per_node_pages_are_verified_where_the_plan_names_the_nodes(tmp_path: Path):
    """The case lab-two-nodes-vm-pages-on-the-other-node (the GPU on node 1): the plan says
    hugepages=1:1. Booted with the page on node 0 (as the capture has it) the host is not as
    planned although the total is; with the page on node 1 it is ready."""
    case = load_case(CASES / "lab-two-nodes-vm-pages-on-the-other-node")
    facts = build_facts(SnapshotTree(derive_snapshot(case, tmp_path)))
    settings = PlanSettings.from_variables({**VARIABLES, "gpuhost_vms": case["vms"]}, "inventory host lab-1")
    plan = plan_host("lab-1", facts, settings).require_applicable().to_json()
    assert "hugepages=1:1" in plan["kernel_options"]
    pci = tuple(
        dataclasses.replace(f, driver="vfio-pci") if f.address.startswith("0000:01:00.") else f for f in facts.pci
    )
    cmdline = parse_cmdline(f"{facts.cmdline} {' '.join(plan['kernel_options'])}")
    booted = dataclasses.replace(facts, pci=pci, cmdline=cmdline)
    on_node_0 = verify_host("lab-1", booted, settings, plan)
    assert codes(on_node_0) == ["verify.hugepages.node_count", "verify.hugepages.node_count", "verify.audit.errors"]
    assert "hugepages 1G node 0 (1 allocated, plan 0); hugepages 1G node 1 (0 allocated, plan 1)" in on_node_0.summary
    assert "hugepages.node_allocation" in on_node_0.summary and "hugepages.node_short" in on_node_0.summary
    moved = tuple(
        dataclasses.replace(
            node,
            hugepages=tuple(
                HugePagePool(p.size_kib, node.node_id, node.node_id) if p.size_kib == GIB_KIB else p
                for p in node.hugepages
            ),
        )
        for node in booted.numa_nodes
    )
    on_node_1 = verify_host("lab-1", dataclasses.replace(booted, numa_nodes=moved), settings, plan)
    assert on_node_1.ok, on_node_1.summary
