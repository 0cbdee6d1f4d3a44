"""Render's host software gates: the libvirt, QEMU and OVMF versions read from the host's package
database (the real dpkg list of tests/fixtures/snapshots/dev-vm, Debian 12), and the same list with
Ubuntu 22.04's versions of those packages (libvirt 8.0, OVMF edk2 2022.02)."""

from __future__ import annotations

import dataclasses
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.facts.build import build_facts
from gpuhost.facts.model import HostFacts, VirtualizationSoftware
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.spec import parse_vm
from gpuhost.render.domain import RenderRefused, plan_domain
from gpuhost.render.validate import validate_domain_xml, validator_available
from gpuhost.render.xml import render_domain
from gpuhost.selection import GpuSelector
from tests.helpers import SNAPSHOTS, snapshot_facts
from tests.render.test_domain import CASES, LAB_POLICY, lab_two_gpus_applied

DEBIAN_12 = ("9.0.0-4+deb12u2", "2022.11-6+deb12u2")
UBUNTU_2204 = {  # dev-vm's dpkg lines, with the versions Ubuntu 22.04 ships
    "ii  libvirt-daemon 9.0.0-4+deb12u2": "ii  libvirt-daemon 8.0.0-1ubuntu7.10",
    "ii  ovmf 2022.11-6+deb12u2": "ii  ovmf 2022.02-3ubuntu0.22.04.2",
}


def dev_vm_packages(tmp_path: Path, replace: dict[str, str] | None = None) -> VirtualizationSoftware | None:
    root = tmp_path / "dev-vm"
    shutil.copytree(SNAPSHOTS / "dev-vm", root, symlinks=True)
    dpkg = root / "commands" / "dpkg.txt"
    text = dpkg.read_text()
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    dpkg.write_text(text)
    return build_facts(SnapshotTree(root)).virtualization


def two_gpus_with(software: VirtualizationSoftware | None) -> HostFacts:
    return dataclasses.replace(lab_two_gpus_applied(), virtualization=software)


def test_versions_come_from_the_package_database(tmp_path):
    debian = dev_vm_packages(tmp_path)
    assert debian is not None and (debian.libvirt, debian.ovmf) == DEBIAN_12
    assert debian.qemu == "1:7.2+dfsg-7+deb12u18+b3"
    assert debian.libvirt_release == (9, 0) and debian.ovmf_release == 202211
    assert snapshot_facts("lab-gpu-pair-fresh").virtualization == VirtualizationSoftware(None, None, None)
    assert snapshot_facts("h100-guest").virtualization is None  # no package database captured
    assert VirtualizationSoftware(None, None, "0~20191122.bd85bf54-2ubuntu3").ovmf_release == 201911
    assert VirtualizationSoftware(None, None, "20230524-4.el9").ovmf_release == 202305


def test_libvirt_older_than_8_7_is_refused_for_kvm_naming_the_version(tmp_path):
    ubuntu = dev_vm_packages(tmp_path, UBUNTU_2204)
    assert ubuntu is not None and ubuntu.libvirt_release == (8, 0)
    spec = parse_vm(CASES["lab-two-gpus"][2], "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(two_gpus_with(ubuntu), spec, LAB_POLICY, host="lab")
    (conflict,) = refused.value.conflicts
    assert conflict.code == "render.libvirt.maxphysaddr"
    assert "8.0.0-1ubuntu7.10" in conflict.message and "8.7 or later" in conflict.remedy
    # TCG guests have no host-passthrough CPU and no <maxphysaddr>: nothing to refuse.
    tcg = parse_vm(CASES["lab-gpu-pair"][2], "test")
    assert "<maxphysaddr" not in render_domain(two_gpus_with(ubuntu), tcg, LAB_POLICY, host="lab")


def test_ovmf_older_than_202211_gets_its_64_bit_window_through_fw_cfg(tmp_path):
    ovmf_only = {k: v for k, v in UBUNTU_2204.items() if "ovmf" in k}
    old_ovmf = dev_vm_packages(tmp_path, ovmf_only)
    spec = parse_vm(CASES["lab-two-gpus"][2], "test")
    xml = render_domain(two_gpus_with(old_ovmf), spec, LAB_POLICY, host="lab")
    domain = ET.fromstring(xml[xml.index("<domain") :])
    args = [a.get("value") for a in domain.findall("{http://libvirt.org/schemas/domain/qemu/1.0}commandline/*")]
    hole = domain.find("devices/controller/pcihole64")
    assert hole is not None and args == ["-fw_cfg", f"name=opt/ovmf/X-PciMmio64Mb,string={int(hole.text or 0) * 1024}"]
    assert "predates edk2-stable202211" in xml and "<maxphysaddr mode='passthrough'/>" in xml
    current = render_domain(two_gpus_with(dev_vm_packages(tmp_path / "b")), spec, LAB_POLICY, host="lab")
    assert "qemu:commandline" not in current and "version of the host is unknown" not in current
    if validator_available():
        assert validate_domain_xml(xml).ok


def test_more_than_288_vcpus_are_refused_on_qemu_7_2(tmp_path):
    """Debian 12's QEMU 7.2 (dev-vm's real package list): q35 takes at most 288 vCPUs; QEMU 8.2 more."""
    debian = dev_vm_packages(tmp_path)
    assert debian is not None and debian.qemu_release == (7, 2)
    entry = {**CASES["lab-two-gpus"][2], "vcpus": 290}
    spec = parse_vm(entry, "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(two_gpus_with(debian), spec, LAB_POLICY, host="lab")
    limit = [c for c in refused.value.conflicts if c.code == "render.vcpus.qemu_q35_limit"]
    assert len(limit) == 1 and "1:7.2+dfsg-7+deb12u18+b3" in limit[0].message and "at most 288" in limit[0].remedy
    newer = dataclasses.replace(debian, qemu="1:8.2.2+ds-0ubuntu1")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(two_gpus_with(newer), spec, LAB_POLICY, host="lab")
    assert "render.vcpus.qemu_q35_limit" not in {c.code for c in refused.value.conflicts}  # (the lab has 2 CPUs)
    at_limit = parse_vm({**entry, "vcpus": 288}, "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(two_gpus_with(debian), at_limit, LAB_POLICY, host="lab")
    assert "render.vcpus.qemu_q35_limit" not in {c.code for c in refused.value.conflicts}


def test_an_iommu_narrower_than_the_cpu_is_warned_about_for_peer_to_peer():
    """The lab host as captured: QEMU's intel-iommu reports cap d2008c22260286 (MGAW 38: 39-bit
    addresses) in the kernel log, its CPU 'address sizes: 40 bits physical'."""
    lab = snapshot_facts("lab-gpu-pair-fresh")
    assert lab.cpu is not None and lab.kernel_log is not None
    assert (lab.cpu.physical_address_bits, lab.kernel_log.iommu_address_bits) == (40, 39)
    assert snapshot_facts("h100-guest").cpu.physical_address_bits == 46  # type: ignore[union-attr]
    assert snapshot_facts("dev-vm").kernel_log.iommu_address_bits is None  # type: ignore[union-attr]  # no DMAR
    policy = AuditPolicy(gpus=GpuSelector.parse(["1234:1111"], "test"))
    assert "gpu.p2p.iommu_width" not in {f.code for f in run_checks("lab-1", lab, policy)[2]}  # one GPU: no peer
    two = lab_two_gpus_applied()  # the same host with a second GPU
    (warning,) = [f for f in run_checks("lab-1", two, policy)[2] if f.code == "gpu.p2p.iommu_width"]
    assert warning.severity.value == "warning" and "39-bit" in warning.message and "40 physical" in warning.message
    as_wide = dataclasses.replace(two, cpu=dataclasses.replace(lab.cpu, physical_address_bits=39))
    assert "gpu.p2p.iommu_width" not in {f.code for f in run_checks("lab-1", as_wide, policy)[2]}
    spec = parse_vm(CASES["lab-two-gpus"][2], "test")
    assert "remaps 39-bit addresses, its CPU has 40 bits" in render_domain(
        lab_two_gpus_applied(), spec, LAB_POLICY, host="lab"
    )
