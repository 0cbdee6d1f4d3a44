"""The planner as data: real captures in, plans and refusals out."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest

from gpuhost.cli.views import describe_plan
from gpuhost.errors import InputError
from gpuhost.facts.model import (
    Bootloader,
    HugePagePool,
    Iommu,
    KernelCommandLine,
    MemInfo,
    NumaNode,
    NvidiaInstall,
    Package,
)
from gpuhost.facts.parsers import parse_cmdline
from gpuhost.plan import PlanRefused, PlanSettings, plan_host
from gpuhost.plan.hugepages import GUIDE_TABLE, auto_pages
from tests.facts.test_parsers import GUIDE_CMDLINE
from tests.helpers import FIXTURES, guide_host, snapshot_facts

GIB = 1024 * 1024
LAB_VARS = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}


def lab_facts():
    return snapshot_facts("lab-gpu-pair-fresh")


def plan(facts, **variables):
    merged = {**LAB_VARS, **variables}
    return plan_host("lab-1", facts, PlanSettings.from_variables(merged, "inventory host lab-1"))


def refusal_codes(result):
    return [r.code for r in result.refusals]


def shell_effective(dropin: str, linux: str, default: str) -> str:
    """What update-grub would see: source the drop-in with sh after the given GRUB variables."""
    script = f'GRUB_CMDLINE_LINUX="{linux}"\nGRUB_CMDLINE_LINUX_DEFAULT="{default}"\n{dropin}\n'
    script += 'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"'
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_fresh_lab_host_plan():
    result = plan(lab_facts())
    assert result.applicable and result.refusals == ()
    assert [(f.address, f.vendor_device) for f in result.functions] == [
        ("0000:01:00.0", "1234:1111"),
        ("0000:01:00.1", "8086:293e"),
    ]
    assert result.bind_by == "ids" and result.override_addresses == ()
    assert "\n/sbin/modprobe -q vfio-pci" in result.initramfs_script
    assert "driver_override" not in result.initramfs_script
    assert result.kernel_options == (
        "vfio-pci.ids=1234:1111,8086:293e",
        "modprobe.blacklist=nouveau,nvidia,nvidiafb",
        "iommu=pt",
        "default_hugepagesz=1G",
        "hugepagesz=1G",
        "hugepages=1",
    )
    # intel_iommu=on is not needed: the emulated VT-d is on by default on this kernel.
    assert "intel_iommu=on" not in result.kernel_options
    assert result.desired_grub_line.startswith("console=tty0 console=ttyS0,115200n8 vfio-pci.ids=")
    # Debian 6.1 still has vfio_virqfd (merged into vfio in 6.2).
    assert result.initramfs_modules == ("vfio", "vfio_iommu_type1", "vfio_pci", "vfio_virqfd")
    assert result.reboot_needed and "vfio-pci.ids=1234:1111,8086:293e" in result.reboot_reasons[0]
    assert result.hugepages.pages == 1 and result.hugepages.per_node == ((0, 1),)
    assert not result.driver_removal.needed and "nothing to remove" in result.driver_removal.note


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_dropin_in_sh_gives_exactly_the_planned_line_and_replaces_earlier_options():
    facts = lab_facts()
    earlier_linux = "console=ttyS0 vfio-pci.ids=10de:1111 hugepages=64 quiet"
    earlier_default = "iommu=soft hugepagesz=2M splash modprobe.blacklist=nouveau,nvidia,nvidiafb"
    grub = dataclasses.replace(
        facts.grub, cmdline_linux=parse_cmdline(earlier_linux), cmdline_linux_default=parse_cmdline(earlier_default)
    )
    result = plan(dataclasses.replace(facts, grub=grub))
    effective = shell_effective(result.grub_dropin, earlier_linux, earlier_default)
    assert effective == result.desired_grub_line
    tokens = effective.split()
    assert [t for t in tokens if t.startswith("vfio-pci.ids=")] == ["vfio-pci.ids=1234:1111,8086:293e"]
    assert [t for t in tokens if t.startswith("hugepages")] == ["hugepagesz=1G", "hugepages=1"]
    assert tokens.count("modprobe.blacklist=nouveau,nvidia,nvidiafb") == 1 and "iommu=soft" not in tokens
    assert {"quiet", "splash", "console=ttyS0"} <= set(tokens)


def test_second_plan_on_a_configured_host_changes_nothing_and_needs_no_reboot():
    facts = lab_facts()
    first = plan(facts)
    # The host after apply and reboot: our drop-in in the effective GRUB line, the new /proc/cmdline,
    # both functions on vfio-pci.
    effective = shell_effective(first.grub_dropin, "console=tty0 console=ttyS0,115200n8", "")
    grub = dataclasses.replace(
        facts.grub,
        cmdline_linux=parse_cmdline(effective.split(" vfio-pci")[0]),
        cmdline_linux_default=KernelCommandLine(tuple(first.kernel_options)),
        dropins=(*facts.grub.dropins, "/etc/default/grub.d/gpuhost.cfg"),
    )
    bound = tuple(
        dataclasses.replace(f, driver="vfio-pci") if f.address.startswith("0000:01:00.") else f for f in facts.pci
    )
    cmdline = parse_cmdline("BOOT_IMAGE=/boot/vmlinuz root=UUID=x ro " + effective)
    second = plan(dataclasses.replace(facts, grub=grub, cmdline=cmdline, pci=bound))
    assert second.grub_dropin == first.grub_dropin
    assert second.desired_grub_line == first.desired_grub_line == effective
    assert not second.reboot_needed and second.reboot_reasons == ()


def test_shared_group_is_refused_unless_allowed():
    facts = lab_facts()
    nic = dataclasses.replace(facts.function("0000:00:05.0"), address="0000:01:00.2", iommu_group=6)
    groups = {**facts.iommu.groups, 6: (*facts.iommu.groups[6], "0000:01:00.2")}
    shared = dataclasses.replace(facts, pci=(*facts.pci, nic), iommu=dataclasses.replace(facts.iommu, groups=groups))
    result = plan(shared)
    assert refusal_codes(result) == ["plan.group.intruder"]
    refusal = result.refusals[0]
    assert "lab-1" in refusal.message and "0000:01:00.2" in refusal.message and "1af4:1000" in refusal.message
    assert "gpuhost_allow_shared_group: [0000:01:00.0]" in refusal.remedy
    with pytest.raises(PlanRefused, match="shares IOMMU group 6"):
        result.require_applicable()
    allowed = plan(shared, gpuhost_allow_shared_group=["0000:01:00.0"])
    assert allowed.applicable and "0000:01:00.2" in {f.address for f in allowed.functions}


@pytest.mark.parametrize(
    ("bootloader", "code"),
    [
        (Bootloader("grubby", True, "grubby", "grubby and /boot/loader/entries (BLS) are present"), "bootloader"),
        (Bootloader("unknown", False, None, "no GRUB found"), "bootloader"),
    ],
)
def test_bootloaders_other_than_grub_are_refused(bootloader, code):
    result = plan(dataclasses.replace(lab_facts(), bootloader=bootloader))
    assert refusal_codes(result) == ["plan.bootloader.not_grub"]
    assert bootloader.kind in result.refusals[0].message


def test_grub_file_that_is_not_valid_shell_is_refused():
    facts = lab_facts()
    broken = dataclasses.replace(
        facts.grub, syntax_error="/etc/default/grub: 12: Syntax error: Unterminated quoted string"
    )
    result = plan(dataclasses.replace(facts, grub=broken))
    assert refusal_codes(result) == ["plan.grub.syntax"] and "Unterminated" in result.refusals[0].message


def test_no_iommu_in_firmware_is_refused_and_a_disabled_one_gets_the_vendor_flag():
    facts = lab_facts()
    no_iommu = Iommu(dmar_table=False, ivrs_table=False, units=(), groups={}, group_types={})
    result = plan(dataclasses.replace(facts, iommu=no_iommu))
    assert "plan.iommu.absent" in refusal_codes(result)
    assert "BIOS" in next(r.remedy for r in result.refusals if r.code == "plan.iommu.absent")
    # Firmware has VT-d but the kernel did not turn it on: intel_iommu=on is added, no refusal.
    off = Iommu(dmar_table=True, ivrs_table=False, units=(), groups={}, group_types={})
    flagged = plan(dataclasses.replace(facts, iommu=off))
    assert "plan.iommu.absent" not in refusal_codes(flagged) and "intel_iommu=on" in flagged.kernel_options


def test_other_refusals_no_gpu_no_vfio_unsupported_os():
    facts = lab_facts()
    assert refusal_codes(plan(facts, gpuhost_gpus="all")) == ["plan.selection.empty"]  # no NVIDIA GPU on the lab host
    assert refusal_codes(plan(dataclasses.replace(facts, vfio_pci="absent"))) == ["plan.vfio.absent"]
    rocky = dataclasses.replace(facts, os_pretty_name="Rocky Linux 9.4 (Blue Onyx)")
    assert refusal_codes(plan(rocky)) == ["plan.os.unsupported"]


def test_hugepages_that_the_host_cannot_hold_are_refused_before_anything_is_written():
    facts = lab_facts()  # 3.8 GiB
    result = plan(facts, gpuhost_hugepages=3)
    assert refusal_codes(result) == ["plan.hugepages.too_many"]
    assert "does not boot" in result.refusals[0].message and "at most 1" in result.refusals[0].remedy
    assert refusal_codes(plan(facts, gpuhost_hugepages="2G")) == ["plan.hugepages.too_many"]
    small = dataclasses.replace(facts, memory=dataclasses.replace(facts.memory, total_kib=2 * GIB))
    tiny = plan(small)
    assert refusal_codes(tiny) == ["plan.hugepages.too_many"] and "gpuhost_hugepages: 0" in tiny.refusals[0].remedy
    no_1g = dataclasses.replace(facts, cpu=dataclasses.replace(facts.cpu, flags=facts.cpu.flags - {"pdpe1gb"}))
    assert refusal_codes(plan(no_1g)) == ["plan.hugepages.unsupported"]
    zero = plan(facts, gpuhost_hugepages=0)
    assert zero.applicable and not any(o.startswith(("hugepages", "default_hugepagesz")) for o in zero.kernel_options)
    assert plan(facts, gpuhost_hugepages="auto").hugepages.pages == 0  # below 128 GB: none


def _big_host(total_gib: int, nodes: int):
    facts = lab_facts()
    per_node = total_gib * GIB // nodes
    numa = tuple(NumaNode(n, per_node, None, (HugePagePool(1048576, 0, 0),)) for n in range(nodes))
    memory = MemInfo(total_gib * GIB, total_gib * GIB, 0, 0, 2048, 0)
    return dataclasses.replace(facts, memory=memory, numa_nodes=numa)


def test_auto_follows_the_guide_table_with_interpolation_and_splits_across_nodes():
    for ram, pages in GUIDE_TABLE:
        assert auto_pages(ram * GIB)[0] == pages
    assert auto_pages(896 * GIB)[0] == 790  # halfway between 768 -> 700 and 1024 -> 880
    assert auto_pages(100 * GIB)[0] == 0
    assert auto_pages(256 * GIB)[0] == 233  # below the first row: its ratio, 700/768
    assert auto_pages(8192 * GIB)[0] == 7760  # above the last row: its ratio
    result = plan(_big_host(1024, 2), gpuhost_hugepages="auto")
    assert result.hugepages.pages == 880 and result.hugepages.per_node == ((0, 440), (1, 440))
    assert "hugepages=880" in result.kernel_options and result.applicable
    lopsided = _big_host(1024, 2)
    small_node = dataclasses.replace(lopsided.numa_nodes[1], mem_total_kib=100 * GIB)
    result = plan(
        dataclasses.replace(lopsided, numa_nodes=(lopsided.numa_nodes[0], small_node)), gpuhost_hugepages="auto"
    )
    assert refusal_codes(result) == ["plan.hugepages.node_too_small"] and "NUMA node 1" in result.refusals[0].message


def _guide_facts():
    return guide_host((FIXTURES / "guide/five-gpu-host.txt").read_text(), GUIDE_CMDLINE, snapshot_facts("dev-vm"))


def test_keeping_one_of_identical_gpus_binds_by_address_with_driver_override():
    facts = _guide_facts()
    facts = dataclasses.replace(facts, grub=lab_facts().grub, bootloader=lab_facts().bootloader, vfio_pci="module")
    everything = plan(facts, gpuhost_gpus="all", gpuhost_hugepages=0)
    assert everything.bind_by == "ids" and everything.vfio_ids == ("10de:2bb1", "10de:22e8")
    assert len(everything.functions) == 8
    keep_one = ["0000:01:00.0", "0000:41:00.0", "0000:81:00.0"]
    result = plan(facts, gpuhost_gpus=keep_one, gpuhost_hugepages=0)
    assert result.applicable and result.bind_by == "address" and result.vfio_ids == ()
    assert not any(o.startswith("vfio-pci.ids") for o in result.kernel_options)
    assert sorted(result.override_addresses) == [
        "0000:01:00.0",
        "0000:01:00.1",
        "0000:41:00.0",
        "0000:41:00.1",
        "0000:81:00.0",
        "0000:81:00.1",
    ]
    assert "0000:c1:00.0" not in result.initramfs_script and "0000:41:00.1" in result.initramfs_script
    assert "driver_override" in result.initramfs_script
    assert "0000:c1:00.0" in result.notes[0]
    refused = plan(facts, gpuhost_gpus=keep_one, gpuhost_hugepages=0, gpuhost_bind_by="ids")
    assert refusal_codes(refused) == ["plan.vfio_ids.captures_kept"]
    assert "gpuhost_bind_by: address" in refused.refusals[0].remedy and "0000:c1:00.0" in refused.refusals[0].message


def test_driver_removal_from_facts():
    facts = lab_facts()
    nvidia = NvidiaInstall(packages=(Package("nvidia-driver-lab", "535"),), runfile_installed=True, loaded_version=None)
    result = plan(dataclasses.replace(facts, nvidia=nvidia))
    removal = result.driver_removal
    assert removal.packages == ("nvidia-driver-lab",) and removal.runfile and removal.pin
    assert "/etc/X11/xorg.conf" not in removal.files and removal.needed  # the lab host has none (issue 27.6)
    with_xorg = plan(dataclasses.replace(facts, nvidia=nvidia, xorg_conf=True)).driver_removal
    assert with_xorg.files[0] == "/etc/X11/xorg.conf"
    assert "/etc/X11/xorg.conf" in plan(dataclasses.replace(facts, nvidia=nvidia, xorg_conf=None)).driver_removal.files
    kept = plan(dataclasses.replace(facts, nvidia=nvidia), gpuhost_remove_nvidia_driver=False)
    assert not kept.driver_removal.needed and not kept.driver_removal.pin


def test_optional_options_and_snd_hda_blacklist():
    result = plan(
        lab_facts(),
        gpuhost_pci_realloc=True,
        gpuhost_pcie_aspm_off="yes",
        gpuhost_nomodeset=True,
        gpuhost_blacklist_snd_hda_intel=True,
    )
    assert {"pci=realloc", "pcie_aspm=off", "nomodeset"} <= set(result.kernel_options)
    assert "modprobe.blacklist=nouveau,nvidia,nvidiafb,snd_hda_intel" in result.kernel_options


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("gpuhost_hugepages", "4;reboot"),
        ("gpuhost_hugepages", "$(id)"),
        ("gpuhost_hugepages", '4"'),
        ("gpuhost_hugepages", "4\nreboot"),
        ("gpuhost_hugepages", "-1"),
        ("gpuhost_hugetlbfs_mount", "/mnt/$(id)"),
        ("gpuhost_hugetlbfs_mount", "/mnt/a b"),
        ("gpuhost_hugetlbfs_mount", "/mnt/../etc"),
        ("gpuhost_hugetlbfs_mount", "relative"),
        ("gpuhost_pci_realloc", "maybe"),
        ("gpuhost_bind_by", "both"),
        ("gpuhost_gpus", ["1234:1111;reboot"]),
        ("gpuhost_allow_shared_group", ["`id`"]),
    ],
)
def test_inventory_values_that_could_reach_a_shell_or_file_are_rejected(name, value):
    with pytest.raises(InputError, match="inventory host lab-1"):
        PlanSettings.from_variables({**LAB_VARS, name: value}, "inventory host lab-1")


def test_plan_json_is_plain_data():
    import json

    data = plan(lab_facts()).to_json()
    assert data["schema"] == "gpuhost.plan/1" and data["applicable"] is True
    assert json.loads(json.dumps(data)) == data


# --- huge pages on the GPUs' NUMA nodes (issue 15) -----------------------------------------------


def _case_facts(name: str, tmp_path):
    from gpuhost.facts.build import build_facts
    from gpuhost.facts.snapshot import SnapshotTree
    from tests.test_audit_cases import CASES, derive_snapshot, load_case

    return build_facts(SnapshotTree(derive_snapshot(load_case(CASES / name), tmp_path)))


TWO_NODES_VM = [{"name": "train-1", "vcpus": 1, "memory": "1G", "gpus": ["gpu0"]}]


def test_on_two_nodes_the_page_goes_on_the_gpus_node_in_the_kernels_node_form(tmp_path):
    """The lab capture as two nodes with the GPU on node 1: the kernel's even split of hugepages=1
    would put the page on node 0; the plan names node 1."""
    facts = _case_facts("lab-two-nodes-vm-pages-on-the-other-node", tmp_path)
    result = plan(facts, gpuhost_vms=TWO_NODES_VM)
    assert result.applicable, result.refusals
    assert result.kernel_options[-3:] == ("default_hugepagesz=1G", "hugepagesz=1G", "hugepages=1:1")
    assert result.hugepages.per_node == ((0, 0), (1, 1)) and result.hugepages.node_form
    assert result.hugepages.vms_per_node == ((1, 1),)
    assert "node 1: 1 GPU(s)" in result.hugepages.placement and "1 on node 1" in result.hugepages.placement
    assert "huge pages by NUMA node" in result.grub_dropin
    text = "\n".join(describe_plan(result))
    assert "    per NUMA node: node 0: 0, node 1: 1 (hugepages=1:1; on the selected GPUs' NUMA nodes" in text
    data = result.to_json()["hugepages"]
    assert data["per_node"] == [[0, 0], [1, 1]] and data["node_form"] is True and data["vms_per_node"] == [[1, 1]]
    # Without a declared VM the placement is the same: the GPU is on node 1.
    assert plan(facts).hugepages.per_node == ((0, 0), (1, 1))


def test_a_node_of_3_gib_is_refused_its_page_and_one_of_4_gib_gets_it():
    """A real capture: the lab's numa-pair host (QEMU -numa, the GPU behind a pcie-expander-bus of
    node 1) as it was, 6 GiB in two nodes, before apply. Node 1 (2.95 GiB of MemTotal) has three
    whole gigabytes; the kernel's boot allocations take its top one, and its image, where KASLR put
    it across a gigabyte boundary, two more: hugepages=1:1 then reserved no page (issue 26's CI
    failure). The plan refuses it; with 4 GiB a node (the lab's numa-pair host now), the page fits."""
    facts = snapshot_facts("lab-numa-pair-fresh")
    assert [(node.node_id, node.cpulist) for node in facts.numa_nodes] == [(0, "0"), (1, "1")]
    assert [(f.address, f.numa_node) for f in facts.pci if f.vendor == 0x1234] == [("0000:81:00.0", 1)]
    refused = plan(facts, gpuhost_hugepages="1", gpuhost_vms=TWO_NODES_VM)
    assert refusal_codes(refused) == ["plan.hugepages.node_too_small"]
    assert "at most 0 fit" in refused.refusals[0].message and "NUMA node 1" in refused.refusals[0].subject
    assert refused.refusals[0].remedy.startswith("Lower gpuhost_hugepages so that NUMA node 1 gets at most 0 pages")
    bigger_nodes = tuple(dataclasses.replace(node, mem_total_kib=node.mem_total_kib + GIB) for node in facts.numa_nodes)
    assert facts.memory is not None
    memory = dataclasses.replace(facts.memory, total_kib=facts.memory.total_kib + 2 * GIB)
    result = plan(
        dataclasses.replace(facts, numa_nodes=bigger_nodes, memory=memory),
        gpuhost_hugepages="1",
        gpuhost_vms=TWO_NODES_VM,
    )
    assert result.applicable, result.refusals
    assert result.hugepages.per_node == ((0, 0), (1, 1)) and result.hugepages.node_form
    assert result.kernel_options[-1] == "hugepages=1:1"
    # Two pages would be one too many for node 1: the second goes to node 0.
    two = plan(dataclasses.replace(facts, numa_nodes=bigger_nodes, memory=memory), gpuhost_hugepages="2")
    assert two.applicable and two.hugepages.per_node == ((0, 1), (1, 1))


def test_the_node_form_is_refused_on_a_kernel_older_than_5_16(tmp_path):
    facts = _case_facts("lab-two-nodes-vm-pages-on-the-other-node", tmp_path)
    ubuntu_2204_ga = dataclasses.replace(facts, kernel_release="5.15.0-91-generic")
    result = plan(ubuntu_2204_ga)
    assert refusal_codes(result) == ["plan.hugepages.old_kernel"]
    assert "5.15.0-91-generic" in result.refusals[0].message and "linux-generic-hwe-22.04" in result.refusals[0].remedy
    # One node: the plain hugepages=N, on any kernel.
    assert plan(dataclasses.replace(lab_facts(), kernel_release="5.15.0-91-generic")).applicable


def _two_socket(**variables):
    from tests.render.test_domain import HGX_NODE0, HGX_NODE1, eight_gpu_two_socket_host

    facts = eight_gpu_two_socket_host()
    gpus = variables.pop("gpus", list(HGX_NODE0 + HGX_NODE1))
    return plan(facts, gpuhost_gpus=gpus, **variables)


def test_eight_gpus_on_two_sockets_split_by_gpus_and_declared_vms():
    """The 2-socket host of tests/render/test_domain.py: 1 TiB, two nodes of 512 GiB, four H100s on each."""
    even = _two_socket(gpuhost_hugepages="auto")
    assert even.applicable and even.hugepages.per_node == ((0, 440), (1, 440))
    assert "hugepages=880" in even.kernel_options and not even.hugepages.node_form  # the kernel's split is the same
    vms = [
        {"name": "a", "vcpus": 8, "memory": "100G", "gpus": ["gpu0"]},
        {"name": "b", "vcpus": 8, "memory": "100G", "gpus": ["gpu1"]},
        {"name": "c", "vcpus": 8, "memory": "1G", "gpus": "none"},
    ]
    placed = _two_socket(gpuhost_hugepages=600, gpuhost_vms=vms)
    assert placed.applicable, placed.refusals
    # 200 for the VMs on node 0, the other 400 by GPUs (4 and 4).
    assert placed.hugepages.per_node == ((0, 400), (1, 200)) and "hugepages=0:400,1:200" in placed.kernel_options
    short = _two_socket(gpuhost_hugepages=150, gpuhost_vms=vms)
    assert refusal_codes(short) == ["plan.hugepages.vms_exceed"]
    assert "need 200 1 GiB pages (200 on NUMA node 0), more than the 150 planned" in short.refusals[0].message


def test_a_gpu_two_declared_vms_name_is_refused_as_render_refuses_it():
    """One answer with render (selection.gpus_declared_twice): gpuhost_vms run at once."""
    vms = [
        {"name": "a", "vcpus": 8, "memory": "100G", "gpus": ["gpu0"]},
        {"name": "b", "vcpus": 8, "memory": "100G", "gpus": "all"},
    ]
    result = _two_socket(gpuhost_hugepages=600, gpuhost_vms=vms)
    assert refusal_codes(result) == ["plan.vms.gpu_twice"]
    assert "is declared for VM 'a' and VM 'b'" in result.refusals[0].message
    assert "Give each GPU to one VM" in result.refusals[0].remedy


def test_gpus_on_one_socket_get_the_pages_their_node_holds_and_the_rest_go_to_the_other():
    from tests.render.test_domain import HGX_NODE1

    one_node = _two_socket(gpus=list(HGX_NODE1), gpuhost_hugepages=400)
    assert one_node.applicable and "hugepages=1:400" in one_node.kernel_options
    assert one_node.hugepages.per_node == ((0, 0), (1, 400))
    # The guide's 880 for 1 TiB do not fit node 1's 512 GiB: it holds 486, node 0 takes the rest.
    spilled = _two_socket(gpus=list(HGX_NODE1), gpuhost_hugepages="auto")
    assert spilled.applicable, spilled.refusals
    assert spilled.hugepages.per_node == ((0, 394), (1, 486)) and "hugepages=0:394,1:486" in spilled.kernel_options
    assert "394 that the GPUs' nodes cannot hold go to the other nodes" in spilled.hugepages.placement
    # More than both nodes hold together: refused as before.
    too_many = _two_socket(gpus=list(HGX_NODE1), gpuhost_hugepages=1000)
    assert refusal_codes(too_many) == ["plan.hugepages.too_many"]
