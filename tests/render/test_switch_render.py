"""Guest PCIe switches that mirror the host's (issue 30, item 3): on tests/switch_host.py's 2-socket
EPYC host (8 H100 behind two Broadcom switches, one per socket; ACS on and off), the rendered domain
puts the GPUs (and a NIC) that share a host switch behind one guest switch on their node's expander
bus, and the NCCL topology file nests them under that switch at the guest's bus IDs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from gpuhost.facts.model import HostFacts
from gpuhost.facts.nccl import parse_nccl_topology
from gpuhost.inventory.spec import HostPolicy, parse_vm
from gpuhost.render.devices import host_switch_of
from gpuhost.render.domain import DomainPlan, plan_domain
from gpuhost.render.layout import ExpanderBus, PortKind, PortModel, RootPort, guest_bus_numbers
from gpuhost.render.nccl_topology import topology_for_guest, topology_for_plan, topology_xml
from gpuhost.render.validate import validate_domain_xml
from gpuhost.render.xml import render_plan
from gpuhost.selection import GpuSelector
from tests.helpers import snapshot_facts
from tests.render.test_domain import CASES, _with_1g_pages, hostdevs, require_validator
from tests.switch_host import NIC_ADDRESS, epyc_switch_host

ALL = GpuSelector(select_all_nvidia=True)
NODE0_SWITCH, NODE1_SWITCH = "0000:10:00.0", "0000:90:00.0"  # the host switches' upstream ports
NODE0_GPUS = ("0000:20:00.0", "0000:21:00.0", "0000:22:00.0", "0000:23:00.0")
NODE1_GPUS = ("0000:a0:00.0", "0000:a1:00.0", "0000:a2:00.0", "0000:a3:00.0")


def _host(acs: bool, nic: bool = False) -> HostFacts:
    return _with_1g_pages(epyc_switch_host(acs=acs, gpu_driver="vfio-pci", nic=nic), 64)


def _plan(facts: HostFacts, gpus: object = "all", policy: HostPolicy | None = None) -> DomainPlan:
    vm = parse_vm({"name": "train0", "gpus": gpus, "vcpus": 16, "memory": "32G"}, "test")
    return plan_domain(facts, vm, policy or HostPolicy(gpus=ALL), host="epyc-8gpu")


def _tree(domain: ET.Element) -> dict[int, tuple[str, int]]:
    """Controller index -> (model, the index of the bus it is plugged into), from the XML alone."""
    tree = {}
    for controller in domain.iter("controller"):
        address = controller.find("address")
        if controller.get("type") != "pci" or address is None:
            continue
        tree[int(controller.get("index", ""))] = (controller.get("model", ""), int(address.get("bus", ""), 16))
    return tree


def _switch_of_hostdevs(domain: ET.Element) -> dict[str, tuple[int, int, int]]:
    """Host address -> (its downstream port, that port's upstream port, the root port above it),
    checking each controller's model on the way."""
    tree = _tree(domain)
    found = {}
    for host, guest, _ in hostdevs(domain):
        downstream = int(guest.split(":")[0], 16)
        assert tree[downstream][0] == "pcie-switch-downstream-port", (host, tree[downstream])
        upstream = tree[downstream][1]
        assert tree[upstream][0] == "pcie-switch-upstream-port", (host, tree[upstream])
        root = tree[upstream][1]
        assert tree[root][0] == "pcie-root-port", (host, tree[root])
        found[host] = (downstream, upstream, root)
    return found


@pytest.mark.parametrize("acs", [False, True])
def test_each_host_switch_becomes_one_guest_switch_on_its_nodes_expander_bus(acs: bool):
    facts = _host(acs)
    plan = _plan(facts)
    xml = render_plan(plan)
    domain = ET.fromstring(xml)
    tree = _tree(domain)
    switches = _switch_of_hostdevs(domain)
    assert sorted(switches) == sorted((*NODE0_GPUS, *NODE1_GPUS))
    # One downstream port per GPU; the four GPUs of a host switch share one upstream port, the two
    # switches' GPUs do not.
    assert len({downstream for downstream, _, _ in switches.values()}) == 8
    upstream_of = {host: upstream for host, (_, upstream, _) in switches.items()}
    assert len({upstream_of[gpu] for gpu in NODE0_GPUS}) == 1
    assert len({upstream_of[gpu] for gpu in NODE1_GPUS}) == 1
    assert upstream_of[NODE0_GPUS[0]] != upstream_of[NODE1_GPUS[0]]
    # Each switch's root port sits on the pcie-expander-bus of its node's guest cell.
    cell_of_bus = {
        int(c.get("index", "")): int(c.findtext("target/node", "")) for c in domain.iter("controller")
        if c.get("model") == "pcie-expander-bus"
    }  # fmt: skip
    for gpus, cell in ((NODE0_GPUS, 0), (NODE1_GPUS, 1)):
        root = switches[gpus[0]][2]
        assert tree[root][1] in cell_of_bus and cell_of_bus[tree[root][1]] == cell, (gpus, tree[root])
    assert [c.host_node for c in plan.cells] == [0, 1]
    # The upstream ports mirror the host's, which the XML's comments name.
    assert (
        f"mirrors the host's PCIe switch {NODE0_SWITCH}" in xml
        and f"mirrors the host's PCIe switch {NODE1_SWITCH}" in xml
    )
    # Downstream ports in slots 0-3 of their upstream port's bus, each with its own chassis.
    downstream = [c for c in domain.iter("controller") if c.get("model") == "pcie-switch-downstream-port"]
    assert sorted(int(c.find("address").get("slot", ""), 16) for c in downstream) == [0, 0, 1, 1, 2, 2, 3, 3]  # type: ignore[union-attr]
    targets = [c.find("target") for c in domain.iter("controller") if "port" in c.get("model", "")]
    chassis = [t.get("chassis") for t in targets if t is not None]
    assert len(chassis) == len(set(chassis)) == 8 + 2 + 4  # downstream ports, the switches' and the others' root ports
    assert {c.find("model").get("name") for c in downstream} == {"xio3130-downstream"}  # type: ignore[union-attr]


@pytest.mark.libvirt
@pytest.mark.parametrize("acs", [False, True])
def test_a_domain_with_guest_switches_passes_libvirts_schema(acs: bool):
    require_validator()
    validate_domain_xml(
        render_plan(_plan(_host(acs, nic=True), policy=HostPolicy(gpus=ALL, allow_shared_group=NODE1_GPUS)))
    )


@pytest.mark.parametrize("acs", [False, True])
def test_the_topology_file_nests_each_switchs_gpus_under_it_at_the_guest_bus_ids(acs: bool):
    facts = _host(acs)
    plan = _plan(facts)
    topology = topology_for_plan(facts, plan)
    # Cell 0's expander bus is bus 0x20 (busNr 32): its root port's device is on bus 0x21 (the
    # switch's upstream port), the upstream port's own bus is 0x22 (its downstream ports), and the
    # downstream ports' buses 0x23-0x26 (the GPUs). Cell 1's from 0x40 the same way.
    assert [cpu.numa_id for cpu in topology.cpus] == [0, 1]
    for cpu, first, host_switch, gpus in (
        (topology.cpus[0], 0x20, NODE0_SWITCH, NODE0_GPUS),
        (topology.cpus[1], 0x40, NODE1_SWITCH, NODE1_GPUS),
    ):
        assert cpu.gpus == ()  # none directly on a root port
        (switch,) = cpu.switches
        assert switch.busid == f"0000:{first + 1:02x}:00.0" and switch.host_address == host_switch
        assert (switch.class_code, switch.vendor, switch.device) == (0x060400, 0x1000, 0xC030)
        assert [g.busid for g in switch.gpus] == [f"0000:{first + 3 + i:02x}:00.0" for i in range(4)]
        assert [g.host_address for g in switch.gpus] == list(gpus)
    # The guest addresses agree with the domain: each GPU's hostdev is on the bus of its downstream
    # port's controller, numbered depth first.
    domain = ET.fromstring(render_plan(plan))
    buses = guest_bus_numbers(plan.expanders, plan.ports)
    file_busid = {g.host_address: g.busid for g in topology.gpus}
    for host, guest, _ in hostdevs(domain):
        assert file_busid[host] == f"0000:{buses[int(guest.split(':')[0], 16)]:02x}:00.0"
    # As NCCL's dump nests them: <cpu><pci switch><pci gpu/>...</pci></cpu>.
    system = ET.fromstring(topology_xml(topology))
    for cpu_element in system.findall("cpu"):
        (switch_element,) = cpu_element.findall("pci")
        assert switch_element.get("class") == "0x060400" and switch_element.get("link_width") == "16"
        assert [p.get("class") for p in switch_element.findall("pci")] == ["0x030200"] * 4


def test_gpus_of_one_switch_share_a_guest_switch_and_gpus_of_two_switches_do_not():
    facts = _host(acs=True)  # each GPU in a group of its own: a VM may take any of them
    same = ET.fromstring(render_plan(_plan(facts, gpus=list(NODE0_GPUS[:2]))))
    switches = _switch_of_hostdevs(same)
    assert len({upstream for _, upstream, _ in switches.values()}) == 1
    assert len({downstream for downstream, _, _ in switches.values()}) == 2
    plan = _plan(facts, gpus=[NODE0_GPUS[0], NODE1_GPUS[0]])
    apart = _switch_of_hostdevs(ET.fromstring(render_plan(plan)))
    assert len({upstream for _, upstream, _ in apart.values()}) == 2
    assert len({root for _, _, root in apart.values()}) == 2
    topology = topology_for_plan(facts, plan)
    assert [[s.host_address for s in cpu.switches] for cpu in topology.cpus] == [[NODE0_SWITCH], [NODE1_SWITCH]]


def test_a_nic_in_the_switchs_group_goes_behind_the_same_guest_switch_and_stays_out_of_the_file():
    facts = _host(acs=False, nic=True)
    plan = _plan(facts, policy=HostPolicy(gpus=ALL, allow_shared_group=NODE1_GPUS))
    switches = _switch_of_hostdevs(ET.fromstring(render_plan(plan)))
    assert NIC_ADDRESS in switches
    assert switches[NIC_ADDRESS][1] == switches[NODE1_GPUS[0]][1]  # the GPUs' upstream port
    assert switches[NIC_ADDRESS][0] not in {switches[gpu][0] for gpu in NODE1_GPUS}  # a downstream port of its own
    assert NIC_ADDRESS not in {g.host_address for g in topology_for_plan(facts, plan).gpus}


def test_a_device_behind_a_root_port_or_a_conventional_bridge_has_no_switch():
    lab = snapshot_facts("lab-gpu-pair-fresh")  # the GPU behind a root port: one bridge above it
    assert host_switch_of(lab, lab.function("0000:01:00.0")) is None  # type: ignore[arg-type]
    facts = epyc_switch_host(acs=True)
    gpu = facts.function(NODE0_GPUS[0])
    assert gpu is not None and host_switch_of(facts, gpu) == NODE0_SWITCH
    # Parents not gathered: not taken for a switch.
    assert host_switch_of(lab, gpu) is None


def test_guest_bus_numbers_go_depth_first_through_a_switch():
    # pcie.0: a root port in slot 2 with a switch behind it (2 downstream ports), one in slot 3.
    ports = (
        RootPort(1, 1, 0x10, 0, 2, PortKind.SWITCH, "switch"),
        RootPort(2, 0, 0, 1, 0, PortKind.SWITCH, "switch", model=PortModel.SWITCH_UPSTREAM),
        RootPort(3, 2, 0, 2, 0, PortKind.GPU, "GPU a", model=PortModel.SWITCH_DOWNSTREAM),
        RootPort(4, 3, 1, 2, 1, PortKind.GPU, "GPU b", model=PortModel.SWITCH_DOWNSTREAM),
        RootPort(5, 4, 0x13, 0, 3, PortKind.DISK, "disk"),
    )
    assert guest_bus_numbers((), ports) == {1: 1, 2: 2, 3: 3, 4: 4, 5: 5}
    expander = ExpanderBus(index=6, bus_nr=0x40, cell=1, slot=4)
    moved = tuple(
        RootPort(
            p.index,
            p.chassis,
            p.port,
            6 if p.bus == 0 and p.index == 1 else p.bus,
            p.slot,
            p.kind,
            p.label,
            model=p.model,
        )
        for p in ports
    )
    assert guest_bus_numbers((expander,), moved) == {1: 0x41, 2: 0x42, 3: 0x43, 4: 0x44, 5: 1}


def test_a_machines_own_view_nests_its_gpus_under_its_switches():
    """topology_for_guest, on facts read where they sit (a guest whose switches are its own): here
    the switch host itself, whose two switches are its upstream ports at their own addresses."""
    facts = epyc_switch_host(acs=True)
    topology = topology_for_guest(facts)
    assert [[(s.busid, s.host_address) for s in cpu.switches] for cpu in topology.cpus] == [
        [(NODE0_SWITCH, None)],
        [(NODE1_SWITCH, None)],
    ]
    assert [[g.busid for g in cpu.switches[0].gpus] for cpu in topology.cpus] == [list(NODE0_GPUS), list(NODE1_GPUS)]
    assert all(cpu.gpus == () for cpu in topology.cpus)
    assert sorted(parse_nccl_topology(topology_xml(topology))) == sorted((*NODE0_GPUS, *NODE1_GPUS))


def test_a_host_without_switches_gets_root_ports_only():
    """The recorded lab GPU and the HGX host's GPUs sit right behind root ports: no guest switch
    (their golden files in tests/fixtures/render/ are unchanged, byte for byte)."""
    for name in ("lab-gpu-pair", "hgx-8gpu-all"):
        build, policy, entry = CASES[name]
        plan = plan_domain(build(), parse_vm(entry, "test"), policy, host="h")
        assert {port.model for port in plan.ports} == {PortModel.ROOT}, name
        assert all(cpu.switches == () for cpu in topology_for_plan(build(), plan).cpus), name
        assert "pcie-switch" not in render_plan(plan), name
