"""Checks on real facts: the H100 guest, this machine, and the IOMMU layouts the guide printed."""

from __future__ import annotations

import dataclasses

from gpuhost.checks import AuditPolicy, Severity, run_checks
from gpuhost.facts.model import NcclTopologyFile
from gpuhost.facts.nccl import parse_nccl_topology
from gpuhost.facts.pci import PciFunction
from gpuhost.inventory.policy import Role
from gpuhost.render.nccl_topology import topology_for_guest, topology_xml
from gpuhost.selection import GpuSelector, select_gpus
from tests.facts.test_parsers import GUIDE_CMDLINE
from tests.helpers import FIXTURES, guide_host, snapshot_facts

ALL_NVIDIA = AuditPolicy(gpus=GpuSelector(select_all_nvidia=True))


def codes(findings, severity=None):
    return [f.code for f in findings if severity is None or f.severity == severity]


def test_h100_guest_is_a_clean_passthrough_guest():
    facts = snapshot_facts("h100-guest")
    role, selection, findings = run_checks("h100", facts, ALL_NVIDIA)
    assert role == "guest"
    assert [card.gpu.address for card in selection.passthrough] == ["0000:00:06.0"]
    # A flat bus with no NCCL topology file: the one warning, with its fix.
    assert codes(findings, Severity.ERROR) == [] and codes(findings, Severity.WARNING) == ["guest.topology.flat"]
    flat = next(f for f in findings if f.code == "guest.topology.flat")
    assert "0000:00:06.0" in flat.message and "NCCL_TOPO_FILE" in flat.remedy and "gpuhost guest up" in flat.remedy
    messages = " ".join(f.message for f in findings)
    assert "passthrough guest" in messages and "no IOMMU" in messages and "Gen5 x16" in messages
    (none,) = (f for f in findings if f.code == "guest.nccl.topology")
    assert none.severity == Severity.INFO and "no NCCL topology file" in none.message


def h100_guest_with(topology: NcclTopologyFile | None):
    """The recorded H100 guest (one GPU, 0000:00:06.0, on its root bus) with `topology` as NCCL's file."""
    return dataclasses.replace(snapshot_facts("h100-guest"), nccl_topology=topology)


def test_a_flat_guest_whose_nccl_topology_lists_its_gpu_is_told_so():
    # The file gpuhost builds from this guest's own snapshot, as `gpuhost guest up` would install it.
    built = topology_xml(topology_for_guest(snapshot_facts("h100-guest")))
    installed = NcclTopologyFile("/etc/gpuhost/nccl-topology.xml", "/etc/nccl.conf", parse_nccl_topology(built), None)
    _, _, findings = run_checks("h100", h100_guest_with(installed), ALL_NVIDIA)
    assert codes(findings, Severity.WARNING) == [] and codes(findings, Severity.ERROR) == []
    (flat,) = (f for f in findings if f.code == "guest.topology.flat")
    assert flat.severity == Severity.INFO and flat.subject == "0000:00:06.0" and "NUMA node 0" in flat.message
    (told,) = (f for f in findings if f.code == "guest.nccl.topology")
    assert told.severity == Severity.INFO and "lists all 1 GPU(s)" in told.message
    assert "named in /etc/nccl.conf" in told.message


def test_a_topology_file_that_leaves_the_gpu_out_or_cannot_be_read_is_a_warning():
    other = NcclTopologyFile("/etc/t.xml", "/etc/nccl.conf", {"0000:01:00.0": 0}, None)  # another VM's layout
    _, _, findings = run_checks("h100", h100_guest_with(other), ALL_NVIDIA)
    assert sorted(codes(findings, Severity.WARNING)) == ["guest.nccl.topology", "guest.topology.flat"]
    (left_out,) = (f for f in findings if f.code == "guest.nccl.topology")
    assert "does not list 0000:00:06.0" in left_out.message and left_out.remedy
    broken = NcclTopologyFile("/etc/t.xml", "/etc/nccl.conf", None, "not XML (syntax error: line 1, column 0)")
    _, _, findings = run_checks("h100", h100_guest_with(broken), ALL_NVIDIA)
    assert sorted(codes(findings, Severity.WARNING)) == ["guest.nccl.topology", "guest.topology.flat"]
    (unusable,) = (f for f in findings if f.code == "guest.nccl.topology")
    assert "not XML" in unusable.message and "/etc/t.xml" in unusable.message


def test_h100_judged_as_a_host_is_not_ready_for_the_right_reasons():
    facts = snapshot_facts("h100-guest")
    _, _, findings = run_checks("h100", facts, dataclasses.replace(ALL_NVIDIA, role=Role.HOST))
    errors = codes(findings, Severity.ERROR)
    assert "iommu.active" in errors and "cpu.virtualization" in errors
    assert "gpu.vfio_ids.missing" in errors  # nvidia owns it and nothing binds vfio-pci
    driver = next(f for f in findings if f.code == "gpu.driver")
    assert driver.severity == Severity.ERROR and "nvidia" in driver.message and "0000:00:06.0" in driver.message


def test_this_machine_has_no_gpu_and_no_iommu():
    facts = snapshot_facts("dev-vm")
    role, _, findings = run_checks("dev-vm", facts, ALL_NVIDIA)
    assert role == "host"
    assert {"gpu.none", "iommu.active", "iommu.firmware"} <= set(codes(findings, Severity.ERROR))
    for finding in findings:
        assert finding.message.startswith("dev-vm: ")  # every message names the host
        if finding.severity != Severity.INFO:
            assert finding.remedy


def _guide_facts(name: str):
    return guide_host((FIXTURES / f"guide/{name}.txt").read_text(), GUIDE_CMDLINE, snapshot_facts("dev-vm"))


def test_guide_five_gpu_host_groups_are_clean_and_ids_cover_the_cards():
    facts = _guide_facts("five-gpu-host")
    _, selection, findings = run_checks("guide", facts, ALL_NVIDIA)
    # The ASPEED BMC display (1a03:2000, boot_vga) is the host's console, not an NVIDIA GPU to pass.
    assert sorted(card.gpu.address for card in selection.passthrough) == [
        "0000:01:00.0",
        "0000:41:00.0",
        "0000:81:00.0",
        "0000:c1:00.0",
    ]
    assert [card.gpu.address for card in selection.kept] == ["0000:c7:00.0"]
    assert codes(findings).count("gpu.group.clean") == 4
    assert not {"gpu.group.intruder", "gpu.group.shared", "gpu.vfio_ids.missing"} & set(codes(findings))
    # Nothing bound yet in this listing: every function says it waits for vfio-pci.
    assert codes(findings).count("gpu.driver") == 8


def test_guide_groups_with_amd_bridges_are_clean():
    facts = _guide_facts("amd-bridges-in-group")
    _, selection, findings = run_checks("guide", facts, ALL_NVIDIA)
    assert len(selection.passthrough) == 2
    clean = [f for f in findings if f.code == "gpu.group.clean"]
    assert len(clean) == 2 and "0000:40:01.1" in clean[0].message + clean[1].message


def _with_intruder(facts, group: int, address: str, class_code: int, vendor: int, device: int):
    template = next(f for f in facts.pci if f.iommu_group == group)
    intruder: PciFunction = dataclasses.replace(
        template, address=address, class_code=class_code, vendor=vendor, device=device, boot_vga=False
    )
    groups = dict(facts.iommu.groups)
    groups[group] = (*groups[group], address)
    return dataclasses.replace(facts, pci=(*facts.pci, intruder), iommu=dataclasses.replace(facts.iommu, groups=groups))


def test_an_intruder_in_a_gpu_group_is_named():
    facts = _with_intruder(_guide_facts("five-gpu-host"), 42, "0000:02:00.0", 0x020000, 0x8086, 0x1533)
    _, _, findings = run_checks("gpu07", facts, ALL_NVIDIA)
    (intruder,) = [f for f in findings if f.code == "gpu.group.intruder"]
    assert intruder.severity == Severity.ERROR
    assert intruder.subject == "0000:01:00.0"
    assert "gpu07" in intruder.message and "0000:02:00.0 [8086:1533]" in intruder.message
    assert "Ethernet controller" in intruder.message and "group 42" in intruder.message
    allowed = dataclasses.replace(ALL_NVIDIA, allow_shared_group=("0000:01:00.0",))
    _, _, findings = run_checks("gpu07", facts, allowed)
    (intruder,) = [f for f in findings if f.code == "gpu.group.intruder"]
    assert intruder.severity == Severity.WARNING


def test_two_gpus_in_one_group_go_together_or_not_at_all():
    """Both selected: the whole group goes to one guest, a warning (issue 27.2: it was an error, so the
    verification after apply's trial boot reverted every such host). One of them kept: an error."""
    facts = _with_intruder(_guide_facts("five-gpu-host"), 42, "0000:02:00.0", 0x030000, 0x10DE, 0x2BB1)
    _, _, findings = run_checks("gpu07", facts, ALL_NVIDIA)
    shared = [f for f in findings if f.code == "gpu.group.shared"]
    assert len(shared) == 2 and all(f.severity == Severity.WARNING for f in shared)
    keep_one = AuditPolicy(gpus=GpuSelector.parse(["0000:01:00.0"], "test"))
    _, _, findings = run_checks("gpu07", facts, keep_one)
    (shared_error,) = [f for f in findings if f.code == "gpu.group.shared"]
    assert shared_error.severity == Severity.ERROR and "0000:02:00.0" in shared_error.message
    assert "keeps" in shared_error.message and "ACS" in shared_error.remedy


def test_vfio_ids_that_capture_a_kept_gpu():
    facts = _guide_facts("five-gpu-host")
    keep_one = AuditPolicy(gpus=GpuSelector.parse(["0000:01:00.0", "0000:41:00.0", "0000:81:00.0"], "test"))
    selection = select_gpus(facts, keep_one.gpus)
    assert [card.gpu.address for card in selection.kept] == ["0000:c1:00.0", "0000:c7:00.0"]
    _, _, findings = run_checks("gpu07", facts, keep_one)
    captured = [f for f in findings if f.code == "gpu.vfio_ids.captures_kept"]
    assert {f.subject for f in captured} == {"0000:c1:00.0", "0000:c1:00.1"}
    assert all("driver_override" in f.remedy for f in captured)  # same IDs as the passed cards


def test_missing_vfio_ids_are_errors_naming_the_function():
    facts = _guide_facts("five-gpu-host")
    facts = dataclasses.replace(facts, cmdline=dataclasses.replace(facts.cmdline, tokens=("quiet",)))
    _, _, findings = run_checks("gpu07", facts, ALL_NVIDIA)
    missing = [f for f in findings if f.code == "gpu.vfio_ids.missing"]
    assert len(missing) == 8
    assert any("10de:22e8" in f.remedy for f in missing)


def test_hugepage_allocation_below_the_request_is_an_error():
    facts = _guide_facts("five-gpu-host")  # the cmdline asks for 576 1 GiB pages; this machine has none
    _, _, findings = run_checks("gpu07", facts, ALL_NVIDIA)
    (allocation,) = [f for f in findings if f.code == "hugepages.allocation"]
    assert allocation.severity == Severity.ERROR and "576" in allocation.message


def test_an_intruder_is_never_proposed_for_vfio_pci():
    """Issue 27.4: a consumer board's GPU group holding the chipset's SATA controller (the root file
    system): the audit names it as an intruder with ACS and another slot as the fix, and never asks
    to add its ID to vfio-pci.ids or to bind it."""
    facts = _with_intruder(_guide_facts("five-gpu-host"), 42, "0000:02:00.0", 0x010601, 0x8086, 0x2922)
    _, _, findings = run_checks("gpu07", facts, ALL_NVIDIA)
    (intruder,) = [f for f in findings if f.code == "gpu.group.intruder"]
    assert "ACS" in intruder.remedy and "another slot" in intruder.remedy
    about_sata = [f for f in findings if f.subject == "0000:02:00.0" or "8086:2922" in f.remedy]
    assert about_sata == [], about_sata


def test_amd_iommu_off_is_removed_not_answered_with_amd_iommu_on():
    """Issue 27.5: an AMD host booted with iommu=off."""
    from tests.switch_host import epyc_switch_host

    facts = epyc_switch_host(acs=True)
    assert facts.cmdline is not None
    pci = tuple(dataclasses.replace(f, iommu_group=None) for f in facts.pci)
    off = dataclasses.replace(
        facts,
        pci=pci,
        iommu=dataclasses.replace(facts.iommu, groups={}),
        cmdline=dataclasses.replace(facts.cmdline, tokens=(*facts.cmdline.tokens, "iommu=off")),
    )
    as_host = dataclasses.replace(ALL_NVIDIA, role=Role.HOST)
    _, _, findings = run_checks("epyc", off, as_host)
    (inactive,) = [f for f in findings if f.code == "iommu.active"]
    assert "remove iommu=off" in inactive.remedy and "amd_iommu=on" not in inactive.remedy
    without_off = dataclasses.replace(off, cmdline=facts.cmdline)
    (inactive,) = [f for f in run_checks("epyc", without_off, as_host)[2] if f.code == "iommu.active"]
    assert "amd_iommu=on" not in inactive.remedy


def test_gpu_driver_warnings_do_not_ask_for_vfio_pci_ids_already_set():
    """Issue 27.5: the IDs on the command line, the functions unbound: the fix is vfio-pci at boot."""
    facts = _guide_facts("five-gpu-host")
    unbound = tuple(dataclasses.replace(f, driver=None) if f.vendor == 0x10DE else f for f in facts.pci)
    _, _, findings = run_checks("gpu07", dataclasses.replace(facts, pci=unbound), ALL_NVIDIA)
    drivers = [f for f in findings if f.code == "gpu.driver"]
    assert drivers and all("already names" in f.remedy and "Bind it" not in f.remedy for f in drivers)


def test_a_switch_whose_upstream_link_trained_at_half_width_fails_every_gpu_behind_it():
    """Issue 27.6: the switch above four GPUs trained x8 of x16: each GPU's own link reads x16, and
    the host was READY. Each of the four GPUs behind it gets one error naming the switch; the other
    switch's GPUs none."""
    from gpuhost.facts.pci import PcieLinkStatus
    from tests.switch_host import epyc_switch_host

    facts = epyc_switch_host(acs=True)
    upstream = "0000:10:00.0"  # node 0's switch upstream port (tests/switch_host.py)
    half = PcieLinkStatus(32.0, 8, 32.0, 16)
    degraded = dataclasses.replace(
        facts,
        pci=tuple(
            dataclasses.replace(f, link=half) if f.address in (upstream, "0000:00:01.1") else f for f in facts.pci
        ),
    )
    as_host = dataclasses.replace(ALL_NVIDIA, role=Role.HOST)
    healthy = [f for f in run_checks("epyc", facts, as_host)[2] if f.code == "gpu.link.upstream_width"]
    assert healthy == []
    found = [f for f in run_checks("epyc", degraded, as_host)[2] if f.code == "gpu.link.upstream_width"]
    assert sorted(f.subject for f in found) == [f"0000:{0x20 + slot:02x}:00.0" for slot in range(4)], found
    assert all(f.severity.value == "error" and f"behind {upstream}" in f.message and "x8 of x16" in f.message
               for f in found)  # fmt: skip
