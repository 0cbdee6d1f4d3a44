"""gpuhost.passthrough: one answer to what vfio-pci owns and whether a group is usable, for audit,
plan, render and the verification after apply's reboot (issue 27.2), on a host whose PCIe switches
lack ACS (4 GPUs per IOMMU group) and the same host with ACS on (tests/switch_host.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.facts.parsers import parse_cmdline
from gpuhost.inventory.policy import Role
from gpuhost.inventory.spec import HostPolicy, parse_vm
from gpuhost.passthrough import analyse_groups, functions_to_bind, gpu_cards
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.verify import verify_host
from gpuhost.problems import Severity
from gpuhost.render.domain import RenderRefused, plan_domain
from gpuhost.selection import GpuSelector
from tests.render.test_domain import _with_1g_pages
from tests.switch_host import epyc_switch_host

ALL = GpuSelector(select_all_nvidia=True)
VARIABLES = {"gpuhost_gpus": "all", "gpuhost_hugepages": 16}


def test_whole_groups_are_bound_and_usable_and_a_group_left_out_is_not():
    facts = epyc_switch_host(acs=False)
    cards = tuple(card for card in gpu_cards(facts) if card.gpu.vendor_device == "10de:2330")
    assert len(cards) == 8
    isolations = analyse_groups(facts, cards)
    assert all(i.usable and len(i.other_cards) == 3 and not i.kept_cards for i in isolations)
    bound = functions_to_bind(facts, cards)
    # The 8 GPUs, never the switch ports that share their groups (vfio accepts bridges on pcieport).
    assert sorted(f.address for f in bound) == sorted(card.gpu.address for card in cards)
    first_half = analyse_groups(facts, cards[:2])
    assert not any(i.usable for i in first_half) and all(len(i.kept_cards) == 2 for i in first_half)


def test_a_shared_group_host_is_planned_and_passes_verification_after_its_trial_boot():
    """Issue 27.2: plan accepted whole groups, then the verification re-ran the audit, which judged
    gpu.group.shared an error: every apply on such a host reverted its trial boot. Through the real
    verify_host, the host as apply leaves it (GPUs on vfio-pci, the planned options booted, the pages)."""
    fresh = epyc_switch_host(acs=False)
    settings = PlanSettings.from_variables(VARIABLES, "inventory host epyc-8gpu")
    plan = plan_host("epyc-8gpu", fresh, settings).require_applicable().to_json()
    assert len(plan["functions"]) == 8
    pci = tuple(dataclasses.replace(f, driver="vfio-pci") if f.is_gpu else f for f in fresh.pci)
    assert fresh.cmdline is not None
    cmdline = parse_cmdline(f"{fresh.cmdline} {' '.join(plan['kernel_options'])}")
    applied = _with_1g_pages(dataclasses.replace(fresh, pci=pci, cmdline=cmdline), 8)
    verification = verify_host("epyc-8gpu", applied, settings, plan)
    assert verification.ok, verification.summary
    _, _, findings = run_checks("epyc-8gpu", applied, AuditPolicy(gpus=ALL, role=Role.HOST))
    shared = [f for f in findings if f.code == "gpu.group.shared"]
    assert len(shared) == 8 and {f.severity for f in shared} == {Severity.WARNING}


def test_keeping_one_gpu_of_a_shared_group_is_an_error_and_a_refusal():
    facts = epyc_switch_host(acs=False)
    three = GpuSelector.parse(["0000:20:00.0", "0000:21:00.0", "0000:22:00.0"], "test")
    _, _, findings = run_checks("epyc-8gpu", facts, AuditPolicy(gpus=three, role=Role.HOST))
    shared = [f for f in findings if f.code == "gpu.group.shared"]
    assert len(shared) == 3 and {f.severity for f in shared} == {Severity.ERROR}
    assert all("0000:23:00.0" in f.message for f in shared)
    variables = {**VARIABLES, "gpuhost_gpus": ["0000:20:00.0", "0000:21:00.0", "0000:22:00.0"]}
    result = plan_host("epyc-8gpu", facts, PlanSettings.from_variables(variables, "inventory"))
    assert [r.code for r in result.refusals] == ["plan.group.kept_gpu"] * 3


@pytest.mark.parametrize(("acs", "refused"), [(False, True), (True, False)])
def test_render_refuses_to_split_a_group_between_vms(acs: bool, refused: bool):
    facts = _with_1g_pages(epyc_switch_host(acs=acs, gpu_driver="vfio-pci"), 64)
    vm = parse_vm({"name": "train0", "gpus": ["gpu0", "gpu1"], "vcpus": 16, "memory": "32G"}, "test")
    policy = HostPolicy(gpus=ALL)
    if not refused:
        assert len(plan_domain(facts, vm, policy, host="epyc-8gpu").gpu_ports) == 2
        return
    with pytest.raises(RenderRefused) as refusal:
        plan_domain(facts, vm, policy, host="epyc-8gpu")
    assert {c.code for c in refusal.value.conflicts} == {"render.group.split"}
    assert {c.subject for c in refusal.value.conflicts} == {"0000:20:00.0", "0000:21:00.0"}
