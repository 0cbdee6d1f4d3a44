"""NVSwitch (HGX) hosts: audit, plan, render and verification on the published HGX H100 layout
(tests/fixtures/hgx), and the host that keeps its NVIDIA driver (gpuhost_remove_nvidia_driver: false)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.facts.build import build_facts
from gpuhost.facts.model import NvidiaInstall, Package
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.spec import HostPolicy, parse_vm
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.verify import verify_host
from gpuhost.render.domain import RenderRefused, plan_domain
from gpuhost.render.xml import METADATA_NS, render_domain
from gpuhost.selection import GpuSelector, NvSwitchModel, select_gpus
from tests.helpers import snapshot_facts
from tests.hgx_host import hgx_h100_host
from tests.test_audit_cases import CASES, derive_snapshot, load_case

NVSWITCHES = ("0000:07:00.0", "0000:08:00.0", "0000:09:00.0", "0000:0a:00.0")
NODE0_GPUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"]
ALL = GpuSelector.parse("all", "test")
DRIVER_535 = NvidiaInstall(
    packages=(
        Package("nvidia-driver-535-server", "535.183.06-0ubuntu0.22.04.1"),
        Package("nvidia-fabricmanager-535", "535.183.06-1"),
        Package("libnvidia-nscq-535", "535.183.06-1"),
    ),
    runfile_installed=False,
    loaded_version="535.183.06",
)


def audit_codes(facts, gpus="all") -> list[str]:
    _, _, findings = run_checks("hgx", facts, AuditPolicy(gpus=GpuSelector.parse(gpus, "test")))
    return [finding.code for finding in findings]


def hgx_plan(facts, **variables):
    merged = {"gpuhost_gpus": "all", "gpuhost_hugepages": 0, **variables}
    return plan_host("hgx", facts, PlanSettings.from_variables(merged, "inventory host hgx"))


def test_the_selection_names_nvidia_s_virtualization_model():
    host = hgx_h100_host()
    assert select_gpus(host, ALL).nvswitch_model is NvSwitchModel.FULL_PASSTHROUGH
    assert [f.address for f in select_gpus(host, ALL).nvswitches] == list(NVSWITCHES)
    assert select_gpus(host, GpuSelector.parse(NODE0_GPUS, "t")).nvswitch_model is NvSwitchModel.SHARED
    assert select_gpus(host, GpuSelector.parse(["1a03:2000"], "t")).nvswitch_model is NvSwitchModel.BARE_METAL
    assert select_gpus(snapshot_facts("lab-gpu-pair-fresh"), ALL).nvswitch_model is NvSwitchModel.NONE


def test_audit_reports_each_nvswitch_and_that_full_passthrough_needs_them_on_vfio():
    """Before apply: the GPUs and NVSwitches on the host's nvidia driver, Fabric Manager installed."""
    before = dataclasses.replace(hgx_h100_host("nvidia", "nvidia"), nvidia=DRIVER_535)
    _, _, findings = run_checks("hgx", before, AuditPolicy(gpus=ALL))
    nvswitch = [f for f in findings if f.code == "gpu.nvswitch"]
    assert [f.subject for f in nvswitch] == list(NVSWITCHES)
    assert "IOMMU group 100" in nvswitch[0].message and "full passthrough" in nvswitch[0].message
    assert "nvidia-fabricmanager-535 535.183.06-1" in nvswitch[0].message
    driver = [f for f in findings if f.code == "gpu.nvswitch.driver"]
    assert [f.subject for f in driver] == list(NVSWITCHES) and "error 802" in driver[0].message
    after = audit_codes(hgx_h100_host())
    assert after.count("gpu.nvswitch") == 4 and "gpu.nvswitch.driver" not in after


def test_audit_refuses_some_gpus_of_an_nvswitch_host():
    codes = audit_codes(hgx_h100_host(), NODE0_GPUS)
    assert "gpu.nvswitch.shared" in codes and "gpu.nvswitch.driver" not in codes


def test_plan_binds_the_nvswitches_with_every_gpu_and_says_so():
    facts = dataclasses.replace(hgx_h100_host("nvidia", "nvidia"), nvidia=DRIVER_535)
    result = hgx_plan(facts)
    assert result.applicable, result.refusals
    bound = [f.address for f in result.functions]
    assert bound[-4:] == list(NVSWITCHES) and len(bound) == 12
    assert result.vfio_ids == ("10de:2330", "10de:22a3")
    assert any("full passthrough" in note and "nvidia-fabricmanager" in note for note in result.notes)
    assert "NVSwitch: 0000:07:00.0 [10de:22a3]" in result.grub_dropin
    assert "GPU 0000:1b:00.0: 0000:1b:00.0 [10de:2330]" in result.grub_dropin
    # The guest runs Fabric Manager: the host's goes with the driver, and the plan says why.
    removal = result.driver_removal
    assert "nvidia-fabricmanager-535" in removal.packages and "the NVSwitches go to the guest" in removal.note


def test_plan_refuses_the_shared_nvswitch_model_and_never_purges_fabric_manager_there():
    facts = dataclasses.replace(hgx_h100_host("nvidia", "nvidia"), nvidia=DRIVER_535)
    result = hgx_plan(facts, gpuhost_gpus=NODE0_GPUS)
    assert [r.code for r in result.refusals] == ["plan.nvswitch.shared"]
    refusal = result.refusals[0]
    assert "keeps 0000:9d:00.0, 0000:c3:00.0, 0000:d1:00.0, 0000:df:00.0" in refusal.message
    assert "gpuhost_gpus: all" in refusal.remedy
    assert not any(f.address in NVSWITCHES for f in result.functions)
    removal = result.driver_removal
    assert "nvidia-fabricmanager-535" not in removal.packages and "libnvidia-nscq-535" not in removal.packages
    assert "nvidia-driver-535-server" in removal.packages
    assert "kept: the host's NVSwitches need it" in removal.note


def test_render_gives_one_vm_every_gpu_and_nvswitch():
    host = hgx_h100_host()
    spec = parse_vm({"name": "train-8", "vcpus": 16, "memory": "64G", "gpus": "all"}, "test")
    xml = render_domain(host, spec, HostPolicy(gpus=ALL), host="hgx")
    domain = ET.fromstring(xml[xml.index("<domain") :])
    sources = [
        "0000:{}:{}.{}".format(*(a.get(k)[2:] for k in ("bus", "slot", "function")))
        for a in domain.findall("./devices/hostdev/source/address")
    ]
    assert len(sources) == 12 and sources[-4:] == list(NVSWITCHES)
    metadata = domain.find("./metadata")
    assert metadata is not None
    namespace = f"{{{METADATA_NS}}}"
    assert len(metadata.findall(f".//{namespace}gpu")) == 8
    assert [n.get("address") for n in metadata.findall(f".//{namespace}nvswitch")] == list(NVSWITCHES)


def test_render_refuses_a_vm_with_some_gpus_of_an_nvswitch_host():
    spec = parse_vm({"name": "train-4", "vcpus": 8, "memory": "64G", "gpus": NODE0_GPUS}, "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(hgx_h100_host(), spec, HostPolicy(gpus=ALL), host="hgx")
    (conflict,) = refused.value.conflicts
    assert conflict.code == "render.nvswitch.partial"
    assert "0000:9d:00.0" in conflict.message and "gpus: all" in conflict.remedy


def test_render_refuses_nvswitches_the_host_still_drives():
    spec = parse_vm({"name": "train-8", "vcpus": 16, "memory": "64G", "gpus": "all"}, "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(hgx_h100_host(nvswitch_driver="nvidia"), spec, HostPolicy(gpus=ALL), host="hgx")
    assert {c.subject for c in refused.value.conflicts if c.code == "render.function.not_vfio"} == set(NVSWITCHES)


# --- a host that keeps its NVIDIA driver (gpuhost_remove_nvidia_driver: false) ---------------------


def test_blacklist_keeps_nvidia_loadable_where_the_host_keeps_its_driver():
    lab = snapshot_facts("lab-gpu-pair-fresh")
    variables = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}
    removed = plan_host("lab-1", lab, PlanSettings.from_variables(variables, "t"))
    kept = plan_host(
        "lab-1", lab, PlanSettings.from_variables({**variables, "gpuhost_remove_nvidia_driver": False}, "t")
    )
    assert "modprobe.blacklist=nouveau,nvidia,nvidiafb" in removed.kernel_options
    assert "modprobe.blacklist=nouveau,nvidiafb" in kept.kernel_options
    assert "^(nvidia|nouveau) " in removed.verify_command and "'^nouveau '" in kept.verify_command


def test_verification_accepts_the_nvidia_driver_the_host_keeps(tmp_path: Path):
    """The case h100-guest-audited-as-host (nvidia and nvidia_uvm loaded): a failure where apply
    removed the driver, none where the host keeps it."""
    facts = build_facts(SnapshotTree(derive_snapshot(load_case(CASES / "h100-guest-audited-as-host"), tmp_path)))
    variables = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1, "gpuhost_remove_nvidia_driver": False}
    settings = PlanSettings.from_variables(variables, "t")
    plan = plan_host("lab-1", snapshot_facts("lab-gpu-pair-fresh"), settings).require_applicable().to_json()
    codes = [p.code for p in verify_host("h100", facts, settings, plan).problems]
    assert "verify.host_driver.loaded" not in codes


def test_a_device_in_an_nvswitch_s_group_is_refused_by_plan_and_render():
    """The lab host's virtio NIC (a real function of the recorded host) put into the first
    NVSwitch's IOMMU group, as a platform without ACS between them would."""
    host = hgx_h100_host()
    nic = dataclasses.replace(host.function("0000:00:05.0"), iommu_group=100)  # type: ignore[arg-type]
    groups = {**host.iommu.groups, 100: (NVSWITCHES[0], nic.address)}
    pci = tuple(nic if f.address == nic.address else f for f in host.pci)
    shared = dataclasses.replace(host, pci=pci, iommu=dataclasses.replace(host.iommu, groups=groups))
    refusals = [r for r in hgx_plan(shared).refusals if r.subject == nic.address]
    assert [r.code for r in refusals] == ["plan.group.intruder"] and "NVSwitch" in refusals[0].message
    spec = parse_vm({"name": "train-8", "vcpus": 16, "memory": "64G", "gpus": "all"}, "test")
    with pytest.raises(RenderRefused) as refused:
        plan_domain(shared, spec, HostPolicy(gpus=ALL), host="hgx")
    assert "render.group.intruder" in {c.code for c in refused.value.conflicts if c.subject == nic.address}


@pytest.mark.parametrize("cpu_bits", [43, 44, 46])
def test_audit_and_render_agree_on_whether_the_cpu_holds_the_full_passthrough_bars(cpu_bits):
    """Issue 27 item 6: the audit said READY where render then refused the one VM a full-passthrough
    HGX host can have. Its 8 GPUs (16 MiB + 128 GiB + 32 MiB BARs each, a 256 GiB window each) and 4
    NVSwitches take a 2 TiB window, which the firmware of a 44-bit guest holds (2^41), not a 43-bit one."""
    host = hgx_h100_host()
    assert host.cpu is not None
    host = dataclasses.replace(host, cpu=dataclasses.replace(host.cpu, physical_address_bits=cpu_bits))
    _, _, findings = run_checks("hgx", host, AuditPolicy(gpus=ALL))
    audit = [f for f in findings if f.code == "gpu.bars.address_width"]
    spec = parse_vm({"name": "train-8", "vcpus": 16, "memory": "64G", "gpus": "all"}, "test")
    try:
        plan_domain(host, spec, HostPolicy(gpus=ALL), host="hgx")
        render = []
    except RenderRefused as refused:
        render = [c for c in refused.conflicts if c.code == "render.bars.address_width"]
    assert bool(audit) == bool(render) == (cpu_bits < 44)
    if audit:
        (finding,) = audit
        assert finding.severity.name == "ERROR" and "2 TiB 64-bit PCI window" in finding.message
        assert f"{cpu_bits} physical address bits" in finding.message and "at least 44" in finding.remedy
    # Four GPUs of one node, NVSwitches on the host (the shared model): no VM of all of them, no finding.
    shared = run_checks("hgx", host, AuditPolicy(gpus=GpuSelector.parse(NODE0_GPUS, "t")))[2]
    assert "gpu.bars.address_width" not in [f.code for f in shared]
