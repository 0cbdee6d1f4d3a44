"""Issue 42: each host shape of tests/fixtures/hosts-as-they-come gives the audit (and plan) answer
its case.json states, through the audit-case walker; class 3, a host gpuhost does not support, in detail."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.inventory.policy import Role
from gpuhost.inventory.spec import HostPolicy, parse_vm
from gpuhost.render.domain import RenderRefused, plan_domain
from gpuhost.selection import GpuSelector
from tests import test_audit_cases as cases
from tests.hosts_as_they_come import shape_directories, shape_facts

ALL = GpuSelector.parse("all", "test")


@pytest.mark.parametrize("directory", shape_directories(), ids=lambda p: p.name)
def test_host_shape(directory: Path, tmp_path: Path):
    cases.test_audit_case(directory, tmp_path)


def test_an_aarch64_grace_host_gets_one_error_and_no_x86_advice(tmp_path: Path):
    # Before: errors on missing VT-x/SVM, "VT-d (DMAR) is off" beside an active SMMU, x2APIC advice.
    facts = shape_facts("aarch64-grace-hopper", tmp_path)
    _, _, findings = run_checks("grace", facts, AuditPolicy(gpus=ALL, role=Role.HOST))
    assert [f.code for f in findings] == ["host.unsupported"]
    (finding,) = findings
    assert "aarch64" in finding.message and "smmu3.0x0000000011000000" in finding.message
    assert "nvgrace-gpu-vfio-pci" in finding.message and "does not support" in finding.message
    for x86 in ("VT-x", "x2APIC", "pdpe1gb", "iommu=pt", "intel_iommu", "is off", "BIOS"):
        assert x86 not in finding.message + finding.remedy


def test_render_refuses_the_aarch64_host_the_same_way(tmp_path: Path):
    # Before: an x86_64 q35/OVMF domain, exit 0.
    facts = shape_facts("aarch64-grace-hopper", tmp_path)
    vm = parse_vm({"name": "gh", "vcpus": 2, "memory": "1G", "gpus": ["gpu0"]}, "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(facts, vm, HostPolicy(gpus=ALL), host="grace")
    assert [c.code for c in refused.value.conflicts] == ["render.host.unsupported"]
    assert "aarch64" in str(refused.value) and "does not support" in str(refused.value)


def test_the_architecture_of_an_older_snapshot_is_read_from_its_cpuinfo(tmp_path: Path):
    facts = shape_facts("aarch64-grace-hopper", tmp_path)
    assert facts.machine == "aarch64"
    (tmp_path / "aarch64-grace-hopper" / "snapshot" / "commands" / "machine.txt").unlink()
    from gpuhost.facts.build import build_facts
    from gpuhost.facts.snapshot import SnapshotTree

    older = build_facts(SnapshotTree(tmp_path / "aarch64-grace-hopper" / "snapshot"))
    assert older.machine == "aarch64"
    assert shape_facts("desktop-39-bit-rtx-2070-super", tmp_path).machine == "x86_64"
