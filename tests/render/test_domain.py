"""`gpuhost render` as data: real host facts in, domain XML out, compared whole with golden files.

Golden files live in tests/fixtures/render/. When the output changes on purpose, regenerate them
with `GPUHOST_REGEN_GOLDEN=1 python3 -m pytest tests/render/test_domain.py` and review the diff; without
that variable any change to the XML fails the test. Schema checks by libvirt's own
virt-xml-validate are marked `libvirt` (Debian: libvirt-clients + libxml2-utils); they skip when
the tool is missing unless GPUHOST_REQUIRE_LIBVIRT=1 (CI sets it), where they fail instead.
"""

from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuhost.facts.model import HostFacts, HugePagePool, MemInfo, NumaNode, VirtualizationSoftware
from gpuhost.facts.pci import Bar, PcieLinkStatus, PciFunction
from gpuhost.inventory.spec import HostPolicy, parse_vm, parse_vms
from gpuhost.passthrough import gpu_cards
from gpuhost.render.address_width import GuestAddressWidth
from gpuhost.render.cpus import VmCpus, allocate_cpus, format_cpulist
from gpuhost.render.domain import RenderRefused, parse_cpulist, plan_domain
from gpuhost.render.validate import validate_domain_xml, validator_available
from gpuhost.render.xml import render_domain
from gpuhost.selection import GpuSelector
from tests.helpers import FIXTURES, snapshot_facts

GOLDEN = FIXTURES / "render"
REGENERATE = os.environ.get("GPUHOST_REGEN_GOLDEN") == "1"
GIB_KIB = 1048576
LAB_GPU = GpuSelector.parse(["1234:1111"], "test")  # the lab's stand-in GPU, as `gpuhost lab` writes it
NVIDIA = GpuSelector.parse("all", "test")


def require_validator() -> None:
    if not validator_available():
        if os.environ.get("GPUHOST_REQUIRE_LIBVIRT") == "1":
            pytest.fail("virt-xml-validate is not installed (apt-get install libvirt-clients libxml2-utils)")
        pytest.skip("virt-xml-validate is not installed (apt-get install libvirt-clients libxml2-utils)")


# --- hosts built from recorded facts ----------------------------------------------------------


def _with_1g_pages(facts: HostFacts, pages_per_node: int, free_per_node: int | None = None) -> HostFacts:
    free = pages_per_node if free_per_node is None else free_per_node
    nodes = tuple(
        dataclasses.replace(
            node,
            hugepages=(
                *(p for p in node.hugepages if p.size_kib != GIB_KIB),
                HugePagePool(GIB_KIB, pages_per_node, free),
            ),
        )
        for node in facts.numa_nodes
    )
    count = max(1, len(nodes))
    pools = (
        *(p for p in facts.hugepage_pools if p.size_kib != GIB_KIB),
        HugePagePool(GIB_KIB, pages_per_node * count, free * count),
    )
    return dataclasses.replace(facts, numa_nodes=nodes, hugepage_pools=pools)


def lab_gpu_pair_applied() -> HostFacts:
    """The lab's gpu-pair host as captured before `gpuhost apply` (tests/fixtures/snapshots/
    lab-gpu-pair-fresh), with what apply changes: both functions of the stand-in GPU on vfio-pci
    and one 1 GiB huge page reserved (the lab host's `hugepages=1`)."""
    facts = snapshot_facts("lab-gpu-pair-fresh")
    pci = tuple(
        dataclasses.replace(f, driver="vfio-pci") if f.address.startswith("0000:01:00.") else f for f in facts.pci
    )
    return _with_1g_pages(dataclasses.replace(facts, pci=pci), 1)


def lab_two_gpus_applied() -> HostFacts:
    """The lab's two-gpus topology (gpuhost.lab.topology): the recorded gpu-pair host plus a second,
    identical pair behind the root port at 00:04.0, which the kernel numbers bus 02 and puts in
    IOMMU group 7 — the recorded functions replicated at 0000:02:00.0/.1."""
    facts = lab_gpu_pair_applied()
    second = tuple(
        dataclasses.replace(
            f, address=f.address.replace("0000:01:", "0000:02:"), iommu_group=7, parents=("0000:00:04.0",)
        )
        for f in facts.pci
        if f.address.startswith("0000:01:00.")
    )
    groups = {**facts.iommu.groups, 7: tuple(f.address for f in second)}
    return dataclasses.replace(facts, pci=(*facts.pci, *second), iommu=dataclasses.replace(facts.iommu, groups=groups))


HGX_NODE0 = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")
HGX_NODE1 = ("0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")
NODE_CPUS = ("0-31,64-95", "32-63,96-127")


def eight_gpu_two_socket_host(free_pages_per_node: int = 448) -> HostFacts:
    """An 8-GPU, 2-socket host built from recorded facts.

    The H100 function recorded in tests/fixtures/snapshots/h100-guest (10de:2330, its real BARs:
    16 MiB + 128 GiB + 32 MiB, all 64-bit prefetchable; its real Gen5 x16 link) is replicated at the
    eight bus addresses of an HGX H100 baseboard, four per socket, each in its own IOMMU group and
    on vfio-pci (after `gpuhost apply`). The rest of the host is the recorded lab host (Intel, its
    root complex and console display), with its CPU count, memory and NUMA layout replaced by two
    nodes of 64 logical CPUs (HT siblings numbered n and n+64) and 512 GiB each, 448 of them
    reserved as 1 GiB huge pages, and its CPU's address width (TCG's 40 bits) by the recorded H100
    machine's Xeon's (46 bits, as on an HGX H100's Sapphire Rapids).
    """
    base = snapshot_facts("lab-gpu-pair-fresh")
    h100_machine = snapshot_facts("h100-guest")
    (h100,) = (f for f in h100_machine.pci if f.vendor_device == "10de:2330")
    assert h100_machine.cpu is not None and h100_machine.cpu.physical_address_bits == 46
    assert h100.bars and all(bar.is_64bit for bar in h100.bars)
    gpus = []
    groups = {g: members for g, members in base.iommu.groups.items() if g != 6}
    for index, address in enumerate(HGX_NODE0 + HGX_NODE1):
        node = 0 if address in HGX_NODE0 else 1
        group = 40 + index
        gpus.append(
            dataclasses.replace(
                h100,
                address=address,
                driver="vfio-pci",
                iommu_group=group,
                numa_node=node,
                local_cpulist=NODE_CPUS[node],
                boot_vga=False,
            )
        )
        groups[group] = (address,)
    others = tuple(f for f in base.pci if not f.address.startswith("0000:01:"))
    numa = tuple(NumaNode(n, 512 * GIB_KIB, NODE_CPUS[n], (HugePagePool(2048, 0, 0),)) for n in (0, 1))
    assert base.cpu is not None and base.memory is not None
    facts = dataclasses.replace(
        base,
        hostname="hgx-h100",
        cpu=dataclasses.replace(
            base.cpu, logical_cpus=128, physical_address_bits=h100_machine.cpu.physical_address_bits
        ),
        memory=dataclasses.replace(base.memory, total_kib=1024 * GIB_KIB, available_kib=100 * GIB_KIB),
        numa_nodes=numa,
        pci=(*others, *gpus),
        iommu=dataclasses.replace(base.iommu, groups=groups),
    )
    return _with_1g_pages(facts, 448, free_pages_per_node)


def vm(**overrides: object):
    entry: dict[str, object] = {"name": "train-1", "vcpus": 2, "memory": "1G", "gpus": ["gpu0"]}
    entry.update(overrides)
    return parse_vm(entry, "test")


LAB_POLICY = HostPolicy(gpus=LAB_GPU)
HGX_POLICY = HostPolicy(gpus=NVIDIA, reserved_cpus="0-1,32-33")

# The nested-passthrough proof's guest: TCG inside the lab host, a busybox initramfs booted directly.
NESTED = {
    "name": "nested-proof",
    "vcpus": 1,
    "memory": "1G",
    "gpus": ["gpu0"],
    "domain_type": "qemu",
    "network": "none",
    "kernel": "/boot/vmlinuz",
    "initrd": "/var/lib/gpuhost/busybox-initrd.gz",
    "cmdline": "console=ttyS0 panic=-1",
}

CASES = {
    "lab-gpu-pair": (lab_gpu_pair_applied, LAB_POLICY, NESTED),
    "lab-two-gpus": (
        lab_two_gpus_applied,
        LAB_POLICY,
        {
            "name": "two-gpus",
            "vcpus": 2,
            "memory": "1G",
            "gpus": "all",
            "disk_size": "20G",
            "base_image": "/var/lib/libvirt/images/base/debian-12-genericcloud-amd64.qcow2",
        },
    ),
    "hgx-8gpu-all": (
        eight_gpu_two_socket_host,
        HGX_POLICY,
        {
            "name": "train-8",
            "vcpus": 112,
            "memory": "768G",
            "gpus": "all",
            "disk_size": "500G",
            "base_image": "/var/lib/libvirt/images/base/ubuntu-24.04-server-cloudimg-amd64.img",
            "cuda_version": "12.6",
        },
    ),
    "hgx-4gpu-node1": (
        eight_gpu_two_socket_host,
        HGX_POLICY,
        {
            "name": "train-4",
            "vcpus": 48,
            "memory": "256G",
            "gpus": ["gpu4", "gpu5", "0000:ba:00.0", "gpu7"],
            "disk_size": "200G",
        },
    ),
}


def render_case(name: str) -> str:
    build, policy, entry = CASES[name]
    return render_domain(build(), parse_vm(entry, "test"), policy, host=name.split("-", 1)[0])


# --- golden files -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    xml = render_case(name)
    path = GOLDEN / f"{name}.xml"
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(xml, encoding="utf-8")
    assert path.is_file(), f"{path} is missing: GPUHOST_REGEN_GOLDEN=1 python3 -m pytest {__file__}"
    assert xml == path.read_text(encoding="utf-8"), f"{name}: output differs from {path} (see module docstring)"


@pytest.mark.libvirt
@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_domains_pass_libvirts_schema(name):
    require_validator()
    result = validate_domain_xml(render_case(name))
    assert result.ok and "validates" in result.output


@pytest.mark.libvirt
def test_the_validator_rejects_what_libvirt_rejects():
    require_validator()
    broken = render_case("lab-gpu-pair").replace("<vcpu placement='static'>", "<vcpu placement='everywhere'>")
    result = validate_domain_xml(broken, check=False)
    assert not result.ok and "domain.xml fails to validate" in result.output


# --- what the XML says, read back as XML ------------------------------------------------------


def parse(xml: str) -> ET.Element:
    return ET.fromstring(xml)


def hostdevs(domain: ET.Element) -> list[tuple[str, str, str | None]]:
    """(host address, guest bus:slot.function, multifunction) of every hostdev."""
    found = []
    for hostdev in domain.iter("hostdev"):
        source = hostdev.find("source/address")
        guest = hostdev.find("address")
        assert source is not None and guest is not None
        host = "{}:{}:{}.{}".format(*(source.get(k, "")[2:] for k in ("domain", "bus", "slot", "function")))
        where = "{}:{}.{}".format(*(guest.get(k, "")[2:] for k in ("bus", "slot", "function")))
        found.append((host, where, guest.get("multifunction")))
        assert hostdev.get("managed") == "yes" and hostdev.get("mode") == "subsystem" and hostdev.get("type") == "pci"
    return found


def controllers(domain: ET.Element, model: str) -> dict[str, ET.Element]:
    return {c.get("index", ""): c for c in domain.iter("controller") if c.get("model") == model}


def test_gpu_pair_functions_stay_one_multifunction_device_behind_its_own_root_port():
    domain = parse(render_case("lab-gpu-pair"))
    assert hostdevs(domain) == [("0000:01:00.0", "01:00.0", "on"), ("0000:01:00.1", "01:00.1", None)]
    port = controllers(domain, "pcie-root-port")["1"]
    address = port.find("address")
    assert address is not None and address.get("bus") == "0x00"  # the port on pcie.0, the GPU behind it
    assert domain.get("type") == "qemu"
    assert domain.find("os/type").get("machine") == "q35"  # type: ignore[union-attr]
    assert domain.find("cpu").get("mode") == "maximum"  # type: ignore[union-attr]  # TCG: no host-passthrough
    assert domain.find("os/kernel").text == "/boot/vmlinuz"  # type: ignore[union-attr]
    assert domain.find("devices/disk") is None and domain.find("devices/interface") is None
    assert domain.find("os/loader").text == "/usr/share/OVMF/OVMF_CODE_4M.fd"  # type: ignore[union-attr]
    assert domain.find("memoryBacking/hugepages/page").get("size") == "1048576"  # type: ignore[union-attr]
    assert domain.find("memoryBacking/locked") is not None
    assert domain.find("devices/serial/log") is not None and domain.find("devices/console") is not None
    assert "qemu:commandline" not in render_case("lab-gpu-pair")


@pytest.mark.parametrize("name", sorted(CASES))
def test_locked_memory_always_comes_with_a_hard_limit_holding_memory_bars_and_libvirts_allowance(name):
    """libvirt: with <locked/> set a memtune hard_limit, else it lifts the memory lock limit altogether.
    The limit: guest memory + every BAR of the passed functions + the 1 GiB libvirt allows VFIO domains
    + a TCG domain's translation buffer, which QEMU locks with the rest (its size set in the XML)."""
    build, policy, entry = CASES[name]
    facts, spec = build(), parse_vm(entry, "test")
    domain = parse(render_domain(facts, spec, policy, host="h"))
    limit = domain.find("memtune/hard_limit")
    assert (domain.find("memoryBacking/locked") is not None) == (limit is not None)
    assert limit is not None and limit.get("unit") == "KiB"  # every case has huge pages
    passed = {address for address, _, _ in hostdevs(domain)}
    bars_kib = sum(bar.size for f in facts.pci if f.address in passed for bar in f.bars) // 1024
    memory_kib = int(domain.findtext("memory") or 0)
    tb_cache = domain.find("features/tcg/tb-cache")
    assert (tb_cache is not None) == (domain.get("type") == "qemu")
    translator_kib = int(tb_cache.text or 0) * 1024 if tb_cache is not None else 0
    assert tb_cache is None or tb_cache.get("unit") == "MiB"
    assert int(limit.text or 0) == memory_kib + bars_kib + translator_kib + GIB_KIB
    if name == "hgx-8gpu-all":  # 768 GiB + 8 x (16 MiB + 128 GiB + 32 MiB) + 1 GiB
        assert int(limit.text or 0) == (768 + 8 * 128 + 1) * GIB_KIB + 8 * 48 * 1024


def test_without_huge_pages_memory_is_neither_locked_nor_limited():
    entry = {**CASES["lab-gpu-pair"][2], "hugepages": False}
    domain = parse(render_domain(lab_gpu_pair_applied(), parse_vm(entry, "test"), LAB_POLICY, host="lab"))
    assert domain.find("memoryBacking") is None and domain.find("memtune") is None


def test_two_gpus_each_get_a_port_and_kvm_gets_host_passthrough():
    domain = parse(render_case("lab-two-gpus"))
    assert [h[:2] for h in hostdevs(domain)] == [
        ("0000:01:00.0", "01:00.0"),
        ("0000:01:00.1", "01:00.1"),
        ("0000:02:00.0", "02:00.0"),
        ("0000:02:00.1", "02:00.1"),
    ]
    cpu = domain.find("cpu")
    assert cpu is not None and cpu.get("mode") == "host-passthrough" and cpu.find("maxphysaddr") is not None
    assert domain.find("features/ioapic").get("driver") == "kvm"  # type: ignore[union-attr]
    disk = domain.find("devices/disk")
    assert disk is not None and disk.find("target").get("bus") == "virtio"  # type: ignore[union-attr]
    assert disk.find("source").get("file") == "/var/lib/libvirt/images/two-gpus.qcow2"  # type: ignore[union-attr]
    assert domain.find("devices/interface/model").get("type") == "virtio"  # type: ignore[union-attr]
    # Two vCPUs on a two-CPU lab host: one to one, the emulator shares them.
    pins = {p.get("vcpu"): p.get("cpuset") for p in domain.iter("vcpupin")}
    assert pins == {"0": "0", "1": "1"}
    assert domain.find("cputune/emulatorpin").get("cpuset") == "0-1"  # type: ignore[union-attr]


def test_eight_gpus_on_two_sockets_get_two_guest_cells_with_their_gpus_on_their_node():
    domain = parse(render_case("hgx-8gpu-all"))
    cells = domain.findall("cpu/numa/cell")
    assert [(c.get("id"), c.get("cpus"), c.get("memory")) for c in cells] == [
        ("0", "0-55", str(384 * GIB_KIB)),
        ("1", "56-111", str(384 * GIB_KIB)),
    ]
    memnodes = {m.get("cellid"): m.get("nodeset") for m in domain.iter("memnode")}
    assert memnodes == {"0": "0", "1": "1"}
    pins = {int(p.get("vcpu", "")): int(p.get("cpuset", "")) for p in domain.iter("vcpupin")}
    node0 = set(parse_cpulist(NODE_CPUS[0])) - {0, 1}
    node1 = set(parse_cpulist(NODE_CPUS[1])) - {32, 33}
    assert len(pins) == 112 and len(set(pins.values())) == 112  # one to one, no CPU twice
    assert all(pins[v] in node0 for v in range(56)) and all(pins[v] in node1 for v in range(56, 112))
    assert not {0, 1, 32, 33} & set(pins.values())  # gpuhost_reserved_cpus stay with the host
    # Each socket's GPUs behind a pxb-pcie that carries its guest cell.
    pxbs = controllers(domain, "pcie-expander-bus")
    assert {i: c.find("target/node").text for i, c in pxbs.items()} == {"1": "0", "2": "1"}  # type: ignore[union-attr]
    ports = controllers(domain, "pcie-root-port")
    bus_of_port = {i: int(c.find("address").get("bus", ""), 16) for i, c in ports.items()}  # type: ignore[union-attr]
    for host, guest, _ in hostdevs(domain):
        parent = bus_of_port[str(int(guest.split(":")[0], 16))]
        assert parent == (1 if host in HGX_NODE0 else 2), host
    # 8 x (128 GiB + 48 MiB, each window aligned to 128 GiB) = 2 TiB.
    assert domain.find("devices/controller[@model='pcie-root']/pcihole64").text == "2048"  # type: ignore[union-attr]
    assert domain.find("devices/controller[@model='pcie-root']/pcihole64").get("unit") == "GiB"  # type: ignore[union-attr]


def test_four_gpus_of_one_socket_pin_to_that_socket_only():
    plan = plan_domain(eight_gpu_two_socket_host(), parse_vm(CASES["hgx-4gpu-node1"][2], "t"), HGX_POLICY, host="hgx")
    assert plan.cells == () and plan.host_nodes == (1,) and plan.expanders == ()
    assert {cpu for _, cpu in plan.vcpu_pins} <= set(parse_cpulist(NODE_CPUS[1]))
    assert plan.emulator_cpus == "114-127"  # node 1 minus reserved 32-33 minus the 48 pinned: 34-63, 96-113
    assert plan.hole64_gib == 1024 and plan.hugepages and plan.memory_kib == 256 * GIB_KIB


def test_cpulists_round_trip():
    assert parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpulist((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert format_cpulist(()) == ""


def test_no_hugepages_reserved_means_ordinary_memory_in_auto_mode():
    facts = snapshot_facts("lab-gpu-pair-fresh")
    facts = dataclasses.replace(facts, pci=tuple(dataclasses.replace(f, driver="vfio-pci") for f in facts.pci))
    plan = plan_domain(facts, vm(), LAB_POLICY, host="lab-1")
    assert not plan.hugepages and "memoryBacking" not in render_domain(facts, vm(), LAB_POLICY, host="lab-1")


def test_values_are_escaped_not_interpreted():
    # A path with XML-special characters cannot get in (refused); what gets in is escaped by the template.
    plan = plan_domain(lab_gpu_pair_applied(), vm(cmdline="console=ttyS0 a=b,c"), LAB_POLICY, host="lab-1")
    assert plan.cmdline == "console=ttyS0 a=b,c"


# --- refusals, each naming its conflict -------------------------------------------------------


def refusal(facts: HostFacts, spec, policy=LAB_POLICY, **kwargs) -> str:
    with pytest.raises(RenderRefused) as caught:
        render_domain(facts, spec, policy, host="h", **kwargs)
    return str(caught.value)


def test_refuses_a_gpu_not_on_vfio_pci_naming_its_driver():
    message = refusal(snapshot_facts("lab-gpu-pair-fresh"), vm())
    assert "0000:01:00.0 [1234:1111] is bound to bochs-drm, not vfio-pci" in message
    assert "0000:01:00.1 [8086:293e] is bound to snd_hda_intel, not vfio-pci" in message
    assert "gpuhost apply" in message


def test_refuses_a_gpu_another_domain_has():
    message = refusal(lab_gpu_pair_applied(), vm(), taken={"0000:01:00.1": "other-vm"})
    assert "0000:01:00.1 [8086:293e] is already given to domain 'other-vm'" in message
    # The same VM redefined is not a conflict.
    render_domain(lab_gpu_pair_applied(), vm(), LAB_POLICY, host="h", taken={"0000:01:00.0": "train-1"})


def test_refuses_more_huge_pages_than_free():
    message = refusal(lab_gpu_pair_applied(), vm(memory="2G"))
    assert "2 free 1 GiB huge pages needed on NUMA node 0, which has 1 free (of 1)" in message
    busy = eight_gpu_two_socket_host(free_pages_per_node=100)
    message = refusal(busy, parse_vm(CASES["hgx-4gpu-node1"][2], "t"), HGX_POLICY)
    assert "256 free 1 GiB huge pages needed on NUMA node 1, which has 100 free (of 448)" in message


def test_refuses_hugepages_on_when_none_are_reserved_and_memory_not_in_gib():
    facts = dataclasses.replace(lab_gpu_pair_applied(), hugepage_pools=(HugePagePool(GIB_KIB, 0, 0),))
    assert "no 1 GiB huge pages reserved" in refusal(facts, vm(hugepages=True))
    assert "1536 MiB is not a whole number of GiB" in refusal(lab_gpu_pair_applied(), vm(memory="1536M"))


def test_refuses_vcpus_beyond_the_host_and_beyond_the_node():
    assert "3 vCPUs asked, but the host has 2 CPUs" in refusal(lab_gpu_pair_applied(), vm(vcpus=3))
    message = refusal(eight_gpu_two_socket_host(), vm(vcpus=64, memory="64G", gpus=["gpu0"]), HGX_POLICY)
    assert "64 vCPUs to pin on NUMA node 0 (CPUs 0-31,64-95 (4 reserved by gpuhost_reserved_cpus))" in message
    assert "which has 62 usable CPUs" in message


def test_refuses_unknown_gpu_names():
    message = refusal(lab_gpu_pair_applied(), vm(gpus=["gpu1"]))
    assert "unknown GPU 'gpu1': the host's passthrough GPUs are gpu0 (0000:01:00.0)" in message
    message = refusal(lab_gpu_pair_applied(), vm(gpus=["0000:41:00.0"]))
    assert "unknown GPU '0000:41:00.0': the host has no GPU at that address" in message


def test_refuses_a_gpu_the_host_keeps():
    kept = HostPolicy(gpus=GpuSelector.parse(["0000:02:00.0"], "t"))
    message = refusal(lab_two_gpus_applied(), vm(gpus=["0000:01:00.0"]), kept)
    assert "GPU 0000:01:00.0 is not one of the host's passthrough GPUs (0000:02:00.0): the host keeps it" in message


def _shared_group(facts: HostFacts, extra: PciFunction) -> HostFacts:
    groups = dict(facts.iommu.groups)
    groups[6] = (*groups[6], extra.address)
    return dataclasses.replace(facts, pci=(*facts.pci, extra), iommu=dataclasses.replace(facts.iommu, groups=groups))


def _nic(address: str) -> PciFunction:
    return PciFunction(
        address=address,
        vendor=0x8086,
        device=0x100E,
        subsystem_vendor=None,
        subsystem_device=None,
        class_code=0x020000,
        revision=None,
        driver="vfio-pci",
        driver_override=None,
        iommu_group=6,
        numa_node=-1,
        local_cpulist="0-1",
        link=PcieLinkStatus(None, None, None, None),
        reset_methods=None,
        bars=(Bar(0, 0xFEB80000, 0xFEB9FFFF, 0x40200),),
    )


def test_refuses_an_intruder_in_the_group_unless_the_host_allows_it():
    facts = _shared_group(lab_gpu_pair_applied(), _nic("0000:01:02.0"))
    message = refusal(facts, vm())
    assert "GPU 0000:01:00.0 shares IOMMU group 6 with 0000:01:02.0 [8086:100e]" in message
    assert "gpuhost_allow_shared_group" in message
    allowed = dataclasses.replace(LAB_POLICY, allow_shared_group=("0000:01:00.0",))
    domain = parse(render_domain(facts, vm(), allowed, host="h"))
    # The intruder is its own device behind its own port; the card stays one multifunction device.
    assert [h[:2] for h in hostdevs(domain)] == [
        ("0000:01:00.0", "01:00.0"),
        ("0000:01:00.1", "01:00.1"),
        ("0000:01:02.0", "02:00.0"),
    ]


def test_refuses_to_split_two_gpus_of_one_group():
    facts = lab_two_gpus_applied()
    second = [f for f in facts.pci if f.address.startswith("0000:02:")]
    merged = tuple(dataclasses.replace(f, iommu_group=6) if f in second else f for f in facts.pci)
    groups = {g: m for g, m in facts.iommu.groups.items() if g != 7}
    groups[6] = (*groups[6], *(f.address for f in second))
    facts = dataclasses.replace(facts, pci=merged, iommu=dataclasses.replace(facts.iommu, groups=groups))
    message = refusal(facts, vm(gpus=["gpu0"]))
    assert "GPU 0000:01:00.0 shares IOMMU group 6 with GPU 0000:02:00.0" in message
    render_domain(facts, vm(gpus="all"), LAB_POLICY, host="h")


def test_refuses_vcpus_or_memory_that_do_not_split_over_the_cells():
    message = refusal(eight_gpu_two_socket_host(), vm(vcpus=7, memory="64G", gpus="all"), HGX_POLICY)
    assert "7 vCPUs cannot be split evenly over 2 guest NUMA cells" in message
    message = refusal(eight_gpu_two_socket_host(), vm(vcpus=8, memory="63G", gpus="all"), HGX_POLICY)
    assert "cannot be split evenly over 2 guest NUMA cells in whole GiB" in message


def test_every_conflict_is_listed_at_once():
    message = refusal(snapshot_facts("lab-gpu-pair-fresh"), vm(vcpus=4, gpus=["gpu0", "gpu3"]))
    assert message.count("\n  - ") >= 4


def test_memory_beyond_the_node_without_huge_pages():
    facts = dataclasses.replace(lab_gpu_pair_applied(), memory=MemInfo(4007140, None, 0, 0, 2048, 0))
    message = refusal(facts, vm(memory="8G", hugepages="off"))
    assert "8192 MiB of memory to bind to NUMA node 0, which has 3913 MiB" in message


def test_golden_dir_holds_only_what_the_cases_write():
    if REGENERATE:
        pytest.skip("regenerating")
    assert {p.stem for p in Path(GOLDEN).glob("*.xml")} == set(CASES)


# --- each conflict by its code (gpuhost.problems registry: render.*) -----------------------------


def refusal_codes(facts: HostFacts, spec, policy=LAB_POLICY) -> list[str]:
    with pytest.raises(RenderRefused) as caught:
        plan_domain(facts, spec, policy, host="h")
    assert all(conflict.severity.value == "error" for conflict in caught.value.conflicts)
    return [conflict.code for conflict in caught.value.conflicts]


def test_refuses_a_gpu_named_twice_and_a_host_without_passthrough_gpus():
    assert refusal_codes(lab_gpu_pair_applied(), vm(gpus=["gpu0", "0000:01:00.0"])) == ["render.gpu.duplicate"]
    h100_only = HostPolicy(gpus=GpuSelector.parse(["10de:2330"], "t"))  # the lab host has no H100
    assert refusal_codes(lab_gpu_pair_applied(), vm(gpus="all"), h100_only) == ["render.gpu.none"]


def test_refuses_more_memory_than_a_host_without_numa_placement_has():
    # No GPU, so nothing is pinned to a node: the whole host's 3.8 GiB is what there is.
    assert refusal_codes(lab_gpu_pair_applied(), vm(gpus="none", memory="64G", hugepages="off")) == [
        "render.memory.too_much"
    ]


def test_refuses_a_gpu_whose_iommu_group_listing_is_unknown():
    """The lab host with IOMMU group 6's devices/ listing unread (empty): not isolated, refused."""
    facts = lab_gpu_pair_applied()
    groups = {**facts.iommu.groups, 6: ()}
    unknown = dataclasses.replace(facts, iommu=dataclasses.replace(facts.iommu, groups=groups))
    assert refusal_codes(unknown, vm()) == ["render.group.unknown"]


def test_refuses_gpus_it_cannot_place_on_numa_nodes():
    host = eight_gpu_two_socket_host()
    lost = tuple(dataclasses.replace(f, numa_node=-1) if f.address == HGX_NODE1[0] else f for f in host.pci)
    spec = vm(vcpus=8, memory="64G", gpus="all")
    assert "render.gpu.numa_unknown" in refusal_codes(dataclasses.replace(host, pci=lost), spec, HGX_POLICY)
    nodes = tuple(dataclasses.replace(n, cpulist=None) if n.node_id == 1 else n for n in host.numa_nodes)
    no_cpus = refusal_codes(dataclasses.replace(host, numa_nodes=nodes), spec, HGX_POLICY)
    assert no_cpus == ["render.node.cpus_unknown"]
    # Each GPU on a node of its own: eight nodes, one more than the guest cells supported.
    spread = tuple(
        dataclasses.replace(f, numa_node=(HGX_NODE0 + HGX_NODE1).index(f.address))
        if f.is_gpu and f.address in HGX_NODE0 + HGX_NODE1
        else f
        for f in host.pci
    )
    eight_nodes = tuple(NumaNode(n, 128 * GIB_KIB, f"{16 * n}-{16 * n + 15}", ()) for n in range(8))
    many = refusal_codes(dataclasses.replace(host, pci=spread, numa_nodes=eight_nodes), spec, HGX_POLICY)
    assert "render.numa.too_many_nodes" in many


# --- several VMs of one host share its CPUs out (issue 15) --------------------------------------

# Two 8-vCPU VMs with one GPU each on node 1 of the 2-socket host, and a third that asks for more
# of node 1 than they leave (62 usable CPUs there: 32-63,96-127 less the reserved 32-33).
NODE1_VMS = parse_vms(
    [
        {"name": "train-a", "vcpus": 8, "memory": "64G", "gpus": ["gpu4"]},
        {"name": "train-b", "vcpus": 8, "memory": "64G", "gpus": ["gpu5"]},
        {"name": "train-c", "vcpus": 48, "memory": "64G", "gpus": ["gpu6"]},
    ],
    "test",
)
TRAIN_A, TRAIN_B, TRAIN_C = NODE1_VMS


def pins_and_emulator(xml: str) -> tuple[set[int], set[int]]:
    domain = parse(xml)
    pins = {int(p.get("cpuset", "")) for p in domain.iter("vcpupin")}
    emulator = domain.find("cputune/emulatorpin")
    assert emulator is not None
    return pins, set(parse_cpulist(emulator.get("cpuset")))


def test_two_vms_on_one_node_get_disjoint_pins_and_keep_their_emulators_off_each_other():
    host = eight_gpu_two_socket_host()
    pins_a, emulator_a = pins_and_emulator(render_domain(host, TRAIN_A, HGX_POLICY, host="hgx", host_vms=NODE1_VMS))
    pins_b, emulator_b = pins_and_emulator(render_domain(host, TRAIN_B, HGX_POLICY, host="hgx", host_vms=NODE1_VMS))
    assert pins_a == set(range(34, 42)) and pins_b == set(range(42, 50))  # node 1's first free CPUs, in order
    node1 = set(parse_cpulist(NODE_CPUS[1])) - {32, 33}
    assert pins_a | pins_b <= node1 and not pins_a & pins_b
    assert not emulator_a & (pins_a | pins_b) and not emulator_b & (pins_a | pins_b)
    assert emulator_a == emulator_b == node1 - pins_a - pins_b  # 50-63,96-127: no VM's vCPUs, none reserved


def test_a_vm_that_no_longer_fits_its_node_is_refused_naming_the_node_and_the_vms():
    with pytest.raises(RenderRefused) as caught:
        plan_domain(eight_gpu_two_socket_host(), TRAIN_C, HGX_POLICY, host="hgx", host_vms=NODE1_VMS)
    assert [c.code for c in caught.value.conflicts] == ["render.vcpus.node_full"]
    message = str(caught.value)
    assert "refusing to render VM 'train-c' for host hgx" in message
    assert "48 vCPUs to pin on NUMA node 1, which has 62 usable CPUs: VM train-a (8), VM train-b (8) hold 16" in message
    assert "46 are left" in message and "gpuhost_vms order" in message
    # Alone on the host it fits: the refusal is the other VMs', not the node's size.
    alone = plan_domain(eight_gpu_two_socket_host(), TRAIN_C, HGX_POLICY, host="hgx")
    assert len(alone.vcpu_pins) == 48


def test_a_vms_pins_do_not_depend_on_which_vm_is_rendered():
    host = eight_gpu_two_socket_host()
    allocation = allocate_cpus(host, HGX_POLICY, NODE1_VMS)
    for spec in (TRAIN_A, TRAIN_B):
        plan = plan_domain(host, spec, HGX_POLICY, host="hgx", host_vms=NODE1_VMS)
        assert (plan.vcpu_pins, plan.emulator_cpus) == (
            allocation.of(spec).vcpu_pins,
            allocation.of(spec).emulator_cpus,
        )
    # train-c did not fit: it holds nothing, and says why.
    assert allocation.of(TRAIN_C).vcpu_pins == () and allocation.of(TRAIN_C).conflicts
    # A VM that cannot be placed takes no CPUs, so a smaller one after it still fits where it left room.
    small = parse_vm({"name": "train-d", "vcpus": 4, "memory": "16G", "gpus": ["gpu7"]}, "test")
    after = allocate_cpus(host, HGX_POLICY, (*NODE1_VMS, small))
    assert [cpu for _, cpu in after.of(small).vcpu_pins] == [50, 51, 52, 53]
    assert after.of(TRAIN_B) == VmCpus("train-b", allocation.of(TRAIN_B).vcpu_pins, "54-63,96-127", ())


def test_a_vm_on_both_sockets_takes_each_cells_cpus_after_those_of_the_vms_before_it():
    both = parse_vm({"name": "train-2s", "vcpus": 8, "memory": "64G", "gpus": ["gpu3", "gpu4"]}, "test")
    allocation = allocate_cpus(eight_gpu_two_socket_host(), HGX_POLICY, (TRAIN_A, both))
    # Cell 0 on node 0 from CPU 2 (0-1 reserved), cell 1 on node 1 after train-a's 34-41.
    assert allocation.of(both).vcpu_pins == (*((v, 2 + v) for v in range(4)), *((v, 38 + v) for v in range(4, 8)))
    # Both nodes' free CPUs: 6-31,64-95 on node 0 and 46-63,96-127 on node 1.
    assert allocation.of(both).emulator_cpus == "6-31,46-127"


def test_a_vm_whose_gpus_cannot_be_placed_takes_no_cpus_from_the_vms_after_it():
    host = eight_gpu_two_socket_host()
    broken = parse_vm({"name": "train-x", "vcpus": 8, "memory": "64G", "gpus": ["gpu9"]}, "test")  # no gpu9
    allocation = allocate_cpus(host, HGX_POLICY, (broken, TRAIN_A))
    assert allocation.of(broken).vcpu_pins == ()
    assert [cpu for _, cpu in allocation.of(TRAIN_A).vcpu_pins] == list(range(34, 42))


def test_cpus_other_defined_domains_hold_are_left_to_them():
    host = eight_gpu_two_socket_host()
    # A domain outside the inventory pinned to 34-37, and train-a's own domain as defined before.
    taken = {**dict.fromkeys(range(34, 38), "legacy"), **dict.fromkeys(range(38, 46), "train-a")}
    allocation = allocate_cpus(host, HGX_POLICY, NODE1_VMS[:2], cpus_taken=taken)
    assert [cpu for _, cpu in allocation.of(TRAIN_A).vcpu_pins] == list(range(38, 46))  # its own, redefined
    assert [cpu for _, cpu in allocation.of(TRAIN_B).vcpu_pins] == list(range(46, 54))
    assert not {34, 35, 36, 37} & set(parse_cpulist(allocation.of(TRAIN_A).emulator_cpus))
    with pytest.raises(RenderRefused) as caught:
        plan_domain(host, TRAIN_C, HGX_POLICY, host="hgx", host_vms=NODE1_VMS, cpus_taken=taken)
    assert "VM train-a (8), VM train-b (8), defined domain legacy (4) hold 20 of them, 42 are left" in str(caught.value)


# --- SMT siblings ----------------------------------------------------------------------------


def with_smt_siblings(facts: HostFacts) -> HostFacts:
    """The 2-socket host with its SMT siblings as its docstring numbers them: CPUs n and n+64 are
    the two threads of one core (thread_siblings_list 'n,n+64', as Linux numbers Intel/AMD hosts)."""
    half = facts.cpu.logical_cpus // 2 if facts.cpu else 0
    siblings = {cpu: (cpu % half, cpu % half + half) for cpu in range(2 * half)}
    return dataclasses.replace(facts, thread_siblings=siblings)


def test_vcpus_go_to_whole_cores_and_the_guest_is_told_threads_2():
    host = with_smt_siblings(eight_gpu_two_socket_host())
    plans = [plan_domain(host, spec, HGX_POLICY, host="hgx", host_vms=NODE1_VMS) for spec in (TRAIN_A, TRAIN_B)]
    for plan in plans:
        assert (plan.sockets, plan.cores, plan.threads) == (1, 4, 2)
        for vcpu, cpu in plan.vcpu_pins:
            if vcpu % 2 == 0:  # vCPUs 2k and 2k+1: the two threads of one host core
                assert dict(plan.vcpu_pins)[vcpu + 1] == host.thread_siblings[cpu][1]
    # Node 1 is 32-63,96-127; 32-33 are reserved, so their cores (with 96-97) are not used.
    assert plans[0].vcpu_pins == ((0, 34), (1, 98), (2, 35), (3, 99), (4, 36), (5, 100), (6, 37), (7, 101))
    assert {cpu for _, cpu in plans[1].vcpu_pins} == {38, 39, 40, 41, 102, 103, 104, 105}
    xml = render_domain(host, TRAIN_A, HGX_POLICY, host="hgx", host_vms=NODE1_VMS)
    assert "<topology sockets='1' dies='1' cores='4' threads='2'/>" in xml


def test_emulator_threads_never_share_a_core_with_a_pinned_vcpu():
    """An odd vCPU count is pinned on whole cores too (threads=1): the last core's idle thread is
    the VM's; the emulator threads avoid every core a VM holds, this VM's and the others'."""
    host = with_smt_siblings(eight_gpu_two_socket_host())
    odd = parse_vms(
        [
            {"name": "odd-a", "vcpus": 3, "memory": "8G", "gpus": ["gpu4"]},
            {"name": "odd-b", "vcpus": 5, "memory": "8G", "gpus": ["gpu5"]},
        ],
        "test",
    )
    allocation = allocate_cpus(host, HGX_POLICY, odd)
    a, b = (allocation.of(spec) for spec in odd)
    assert a.threads == b.threads == 1
    pinned = {cpu for share in (a, b) for _, cpu in share.vcpu_pins}
    assert a.vcpu_pins == ((0, 34), (1, 98), (2, 35))  # core 35/99: vCPU 2 alone on it
    assert b.vcpu_pins == ((0, 36), (1, 100), (2, 37), (3, 101), (4, 38))  # not 99: odd-a's core
    siblings = {host.thread_siblings[cpu][1] for cpu in pinned}  # 99 and 102: the odd vCPUs' idle threads
    for share in (a, b):
        emulator = set(parse_cpulist(share.emulator_cpus))
        assert emulator and not emulator & (pinned | siblings) and not emulator & {32, 33}  # reserved
    plan = plan_domain(host, odd[0], HGX_POLICY, host="hgx", host_vms=odd)
    assert (plan.cores, plan.threads) == (3, 1)


def test_two_vms_never_share_a_core_with_adjacent_siblings():
    """Issue 27.3: siblings numbered 2k, 2k+1 (as some firmware numbers them). A 3-vCPU VM took
    34, 35, 36 and left 37, its core's other thread, to the next VM. Now each VM holds whole cores."""
    host = eight_gpu_two_socket_host()
    host = dataclasses.replace(host, thread_siblings={cpu: (cpu - cpu % 2, cpu - cpu % 2 + 1) for cpu in range(128)})
    vms = parse_vms(
        [
            {"name": "odd-a", "vcpus": 3, "memory": "8G", "gpus": ["gpu4"]},
            {"name": "odd-b", "vcpus": 3, "memory": "8G", "gpus": ["gpu5"]},
        ],
        "test",
    )
    allocation = allocate_cpus(host, HGX_POLICY, vms)
    cores = [{host.thread_siblings[cpu] for _, cpu in allocation.of(spec).vcpu_pins} for spec in vms]
    assert cores[0] and cores[1] and not cores[0] & cores[1]
    assert [cpu for _, cpu in allocation.of(vms[1]).vcpu_pins] == [38, 39, 40]  # 37 is odd-a's idle thread


def test_without_known_siblings_pinning_is_as_before():
    plan = plan_domain(eight_gpu_two_socket_host(), TRAIN_A, HGX_POLICY, host="hgx", host_vms=NODE1_VMS)
    assert plan.threads == 1 and [cpu for _, cpu in plan.vcpu_pins] == list(range(34, 42))


# --- the declared VMs take their nodes' 1 GiB pages in turn (issue 15) ----------------------------


def test_a_vm_whose_node_the_vms_before_it_leave_short_of_pages_is_refused():
    """Node 1 of the 2-socket host has 448 pages reserved: train-a's 300 GiB leave 148, which
    train-b's 200 GiB on the same node do not fit, although each fits alone."""
    vms = parse_vms(
        [
            {"name": "train-a", "vcpus": 8, "memory": "300G", "gpus": ["gpu4"]},
            {"name": "train-b", "vcpus": 8, "memory": "200G", "gpus": ["gpu5"]},
        ],
        "test",
    )
    host = eight_gpu_two_socket_host()
    assert plan_domain(host, vms[0], HGX_POLICY, host="hgx", host_vms=vms).hugepages
    with pytest.raises(RenderRefused) as caught:
        plan_domain(host, vms[1], HGX_POLICY, host="hgx", host_vms=vms)
    assert [c.code for c in caught.value.conflicts] == ["render.hugepages.node_short"]
    assert "200 1 GiB huge pages needed on NUMA node 1, which has 448 reserved; the VMs declared before it " in str(
        caught.value
    )
    assert "(train-a) take 300 of them" in str(caught.value)
    assert plan_domain(host, vms[1], HGX_POLICY, host="hgx").hugepages  # alone it fits


def test_a_tcg_guest_gets_the_address_width_its_firmwares_window_needs_and_no_more():
    """QEMU's TCG guests have 40 physical address bits, whose top eighth (OVMF's 64-bit window) is
    128 GiB: enough for the lab's small BARs (nothing emitted), not for eight H100s' 2 TiB."""
    small = parse(render_case("lab-gpu-pair"))
    assert small.find("cpu/maxphysaddr") is None
    hgx_tcg = {**CASES["hgx-8gpu-all"][2], "domain_type": "qemu", "vcpus": 8, "memory": "64G"}
    domain = parse(render_domain(eight_gpu_two_socket_host(), parse_vm(hgx_tcg, "t"), HGX_POLICY, host="hgx"))
    width = domain.find("cpu/maxphysaddr")
    # 2 TiB = 2^41; its eighth-share needs 2^44.
    assert width is not None and (width.get("mode"), width.get("bits")) == ("emulate", "44")
    assert "gets 44 physical address bits" in render_domain(
        eight_gpu_two_socket_host(), parse_vm(hgx_tcg, "t"), HGX_POLICY, host="hgx"
    )


def test_a_host_cpu_too_narrow_for_the_bars_window_is_refused_naming_the_bits():
    host = eight_gpu_two_socket_host()
    assert host.cpu is not None
    narrow = dataclasses.replace(host, cpu=dataclasses.replace(host.cpu, physical_address_bits=43))
    with pytest.raises(RenderRefused) as refused:
        plan_domain(narrow, parse_vm(CASES["hgx-8gpu-all"][2], "t"), HGX_POLICY, host="hgx")
    (conflict,) = refused.value.conflicts
    assert conflict.code == "render.bars.address_width"
    assert "2 TiB 64-bit PCI window" in conflict.message and "43 physical address bits" in conflict.message
    assert "at least 44 physical address bits" in conflict.remedy
    # Four of them (1 TiB) fit 43 bits.
    plan = plan_domain(narrow, parse_vm(CASES["hgx-4gpu-node1"][2], "t"), HGX_POLICY, host="hgx")
    assert plan.maxphysaddr is not None and plan.maxphysaddr.mode == "passthrough"


def test_a_tcg_guest_with_large_bars_on_a_libvirt_without_maxphysaddr_is_refused():
    old = VirtualizationSoftware(libvirt="8.0.0-1ubuntu7.10", qemu=None, ovmf=None)
    host = dataclasses.replace(eight_gpu_two_socket_host(), virtualization=old)
    hgx_tcg = {**CASES["hgx-8gpu-all"][2], "domain_type": "qemu", "vcpus": 8, "memory": "64G"}
    with pytest.raises(RenderRefused) as refused:
        plan_domain(host, parse_vm(hgx_tcg, "t"), HGX_POLICY, host="hgx")
    assert [c.code for c in refused.value.conflicts] == ["render.libvirt.maxphysaddr"]


# The lab's numa-gpus host as captured (tests/fixtures/snapshots/lab-numa-gpus-vfio): both cards on
# node 1 (CPUs 2-3) and on vfio-pci; the large-BAR card's test function (1b36:0005, class 00ff,
# a 1 TiB BAR) shares its slot and group, accepted into the guest by the operator.
NUMA_GPUS_POLICY = HostPolicy(
    gpus=GpuSelector.parse(["1234:1111", "1af4:1050"], "test"),
    allow_shared_group=("0000:82:00.0",),
    reserved_cpus="0",
)
NUMA_GPUS_VMS = tuple(
    parse_vm({**NESTED, "name": name, "memory": "512M", "gpus": [gpu], "firmware": "bios"}, "test")
    for name, gpu in (("pair", "0000:81:00.0"), ("wide", "0000:82:00.0"))
)


def test_a_lone_display_controller_leads_its_card_and_beside_a_vga_it_is_a_companion():
    facts = snapshot_facts("lab-numa-gpus-vfio")
    cards = {card.gpu.address: [f.address for f in card.companions] for card in gpu_cards(facts)}
    # The virtio-gpu (0380) leads its card; the unclassified test function is no companion.
    assert cards == {"0000:00:02.0": [], "0000:81:00.0": ["0000:81:00.1"], "0000:82:00.0": []}
    pair = snapshot_facts("lab-gpu-pair-fresh")
    secondary = tuple(
        dataclasses.replace(f, class_code=0x038000) if f.address == "0000:01:00.1" else f for f in pair.pci
    )
    cards = {
        c.gpu.address: [f.address for f in c.companions] for c in gpu_cards(dataclasses.replace(pair, pci=secondary))
    }
    assert cards["0000:01:00.0"] == ["0000:01:00.1"] and "0000:01:00.1" not in cards


def test_two_vms_of_the_captured_numa_gpus_host_get_disjoint_cpus_and_the_wide_one_44_bits():
    facts = snapshot_facts("lab-numa-gpus-vfio")
    plans = {
        vm.name: plan_domain(facts, vm, NUMA_GPUS_POLICY, host="lab-1", host_vms=NUMA_GPUS_VMS) for vm in NUMA_GPUS_VMS
    }
    assert {name: plan.vcpu_pins for name, plan in plans.items()} == {"pair": ((0, 2),), "wide": ((0, 3),)}
    assert {plan.host_nodes for plan in plans.values()} == {(1,)}
    assert plans["pair"].maxphysaddr is None and plans["pair"].hole64_gib == 32
    # 1 TiB + the display's 16 KiB behind one port, aligned to 1 TiB: a 2 TiB hole, 2^44 for its eighth.
    assert plans["wide"].maxphysaddr == GuestAddressWidth("emulate", 44) and plans["wide"].hole64_gib == 2048
    assert [f.host.address for port in plans["wide"].gpu_ports for f in port.functions] == [
        "0000:82:00.0",
        "0000:82:00.1",
    ]


def test_a_tcg_window_past_what_qemu_emulates_is_refused():
    """Eight GPUs whose three BARs are 256 TiB each: an 8192 TiB hole would take 56 bits, past x86-64's 52."""
    host = eight_gpu_two_socket_host()
    huge = tuple(
        dataclasses.replace(f, bars=tuple(dataclasses.replace(b, end=b.start + (256 << 40) - 1) for b in f.bars))
        if f.vendor_device == "10de:2330"
        else f
        for f in host.pci
    )
    hgx_tcg = {**CASES["hgx-8gpu-all"][2], "domain_type": "qemu", "vcpus": 8, "memory": "64G"}
    with pytest.raises(RenderRefused) as refused:
        plan_domain(dataclasses.replace(host, pci=huge), parse_vm(hgx_tcg, "t"), HGX_POLICY, host="hgx")
    (conflict,) = refused.value.conflicts
    assert conflict.code == "render.bars.address_width"
    assert "would take 56 physical address bits, more than the 52 QEMU emulates" in conflict.message


def test_one_gpu_declared_for_two_vms_is_refused_by_alias_or_address():
    """Issue 27 item 6: two declared VMs holding one GPU cannot run at once, yet their CPUs were
    allocated as if both did. The second names the first's GPU by its address, not its alias."""
    host = eight_gpu_two_socket_host()
    address = plan_domain(host, TRAIN_A, HGX_POLICY, host="hgx").gpu_ports[0].functions[0].host.address
    vms = parse_vms(
        [
            {"name": "train-a", "vcpus": 8, "memory": "64G", "gpus": ["gpu4"]},
            {"name": "again", "vcpus": 8, "memory": "64G", "gpus": [address, "gpu5"]},
        ],
        "test",
    )
    for spec, other in ((vms[0], "again"), (vms[1], "train-a")):
        with pytest.raises(RenderRefused) as caught:
            plan_domain(host, spec, HGX_POLICY, host="hgx", host_vms=vms)
        assert [c.code for c in caught.value.conflicts] == ["render.gpu.declared_twice"], caught.value.conflicts
        message = str(caught.value)
        assert f"is declared for VM '{other}' too" in message and "give each GPU to one VM" in message
    # Disjoint declarations render as before.
    plan_domain(host, TRAIN_A, HGX_POLICY, host="hgx", host_vms=NODE1_VMS)
