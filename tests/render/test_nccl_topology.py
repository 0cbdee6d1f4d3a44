"""The NCCL topology file `gpuhost render` writes beside the domain XML and `gpuhost guest up` installs."""

from __future__ import annotations

import dataclasses
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from gpuhost.facts.nccl import parse_nccl_topology
from gpuhost.guest.provision import NCCL_CONF_SET_TOPOLOGY
from gpuhost.inventory.spec import parse_vm
from gpuhost.render.domain import plan_domain
from gpuhost.render.layout import ExpanderBus, PortKind, RootPort, guest_bus_numbers
from gpuhost.render.nccl_topology import (
    cpumap,
    topology_for_guest,
    topology_for_plan,
    topology_path_for,
    topology_xml,
)
from gpuhost.render.xml import render_plan
from tests.helpers import snapshot_facts
from tests.render.test_domain import CASES, HGX_NODE0, HGX_NODE1, controllers, hostdevs


def plan_case(name: str):
    build, policy, entry = CASES[name]
    facts = build()
    return facts, plan_domain(facts, parse_vm(entry, "test"), policy, host="hgx")


def test_cpumap_is_the_kernels_form():
    # The form of /sys/devices/system/node/node0/cpumap; the recorded H200 guest's NCCL dump has
    # affinity="ffffffff" for its 32 CPUs (tests/fixtures/nccl-topology-h200x2/dump-with-1.xml).
    assert cpumap(range(32)) == "ffffffff"
    assert cpumap(range(56, 112)) == "0000ffff,ffffffff,ff000000,00000000"
    assert cpumap([0]) == "00000001"


def test_guest_bus_numbers_follow_the_firmware_as_recorded_in_a_lab_guest():
    # The lab's numa-gpus host is a QEMU guest: a pxb-pcie with bus_nr 0x80 on pcie.0, two root
    # ports on it (slots 0 and 1), a card behind each. Its firmware numbered their buses 0x81 and
    # 0x82, as recorded in its snapshot; the rule gives the same.
    expander = ExpanderBus(index=1, bus_nr=0x80, cell=1, slot=7)
    ports = (
        RootPort(2, 1, 0x10, 1, 0, PortKind.GPU, "GPU a"),
        RootPort(3, 2, 0x11, 1, 1, PortKind.GPU, "GPU b"),
    )
    assert guest_bus_numbers((expander,), ports) == {2: 0x81, 3: 0x82}
    recorded = {f.address for f in snapshot_facts("lab-numa-gpus-vfio").pci}
    assert {"0000:81:00.0", "0000:82:00.0"} <= recorded
    # And pcie.0's root ports, in slot order, from bus 1 (the lab's gpu-pair host: its GPU at 01:00.0).
    pcie0 = (RootPort(1, 1, 0x10, 0, 3, PortKind.GPU, "GPU"), RootPort(4, 2, 0x11, 0, 2, PortKind.DISK, "disk"))
    assert guest_bus_numbers((), pcie0) == {4: 1, 1: 2}
    assert "0000:01:00.0" in {f.address for f in snapshot_facts("lab-gpu-pair-fresh").pci}


def test_eight_gpus_on_two_sockets_sit_on_their_guest_cells_at_the_guest_bus_ids():
    facts, plan = plan_case("hgx-8gpu-all")
    topology = topology_for_plan(facts, plan)
    domain = ET.fromstring(render_plan(plan))
    # The domain's expander buses: the file's bus IDs are numbered from them.
    pxbs = controllers(domain, "pcie-expander-bus")
    assert {c.find("target").get("busNr") for c in pxbs.values()} == {"32", "64"}  # type: ignore[union-attr]
    assert [cpu.numa_id for cpu in topology.cpus] == [0, 1]
    node0, node1 = topology.cpus
    assert [g.host_address for g in node0.gpus] == list(HGX_NODE0)
    assert [g.host_address for g in node1.gpus] == list(HGX_NODE1)
    assert [g.busid for g in node0.gpus] == [f"0000:{bus:02x}:00.0" for bus in (0x21, 0x22, 0x23, 0x24)]
    assert [g.busid for g in node1.gpus] == [f"0000:{bus:02x}:00.0" for bus in (0x41, 0x42, 0x43, 0x44)]
    # Each GPU's hostdev sits on the root port whose bus the file names.
    port_bus = {g.host_address: g.busid for g in topology.gpus}
    ports = controllers(domain, "pcie-root-port")
    for host, guest, _ in hostdevs(domain):
        if host in port_bus:
            port = ports[str(int(guest.split(":")[0], 16))]
            pxb = int(port.find("address").get("bus", ""), 16)  # type: ignore[union-attr]
            assert pxb == (1 if host in HGX_NODE0 else 2)
    # The guest cells' vCPUs, the host's Gen5 x16 link, the host CPU's identity.
    assert node0.affinity == cpumap(range(56)) and node1.affinity == cpumap(range(56, 112))
    assert {(g.link_speed_gts, g.link_width) for g in topology.gpus} == {(32.0, 16)}
    assert facts.cpu is not None and node0.vendor == facts.cpu.vendor and node0.family == facts.cpu.family


def test_the_file_is_what_nccl_reads():
    facts, plan = plan_case("hgx-4gpu-node1")
    text = topology_xml(topology_for_plan(facts, plan))
    root = ET.fromstring(text)
    assert root.tag == "system" and root.get("version") == "1"
    (cpu,) = root.findall("cpu")
    # A <cpu> from a file is not completed by NCCL: arch, vendor, and on Intel family and model.
    assert {"numaid", "arch", "vendor", "familyid", "modelid", "affinity"} <= set(cpu.attrib)
    assert cpu.get("numaid") == "0"  # the four GPUs of host node 1 in a one-cell guest
    pcis = cpu.findall("pci")
    assert [p.get("busid") for p in pcis] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]
    assert all(p.get("link_speed") == "32.0 GT/s PCIe" and p.get("link_width") == "16" for p in pcis)
    assert all(p.get("class") == "0x030200" and p.get("device") == "0x2330" for p in pcis)
    assert not root.findall(".//gpu")  # NCCL adds <gpu> from NVML: its NVLinks, dev, sm and rank
    assert parse_nccl_topology(text) == {p.get("busid"): 0 for p in pcis}


def test_host_text_is_escaped():
    facts, plan = plan_case("hgx-4gpu-node1")
    assert facts.cpu is not None
    odd = dataclasses.replace(facts, cpu=dataclasses.replace(facts.cpu, vendor='Genuine"<Intel>&'))
    root = ET.fromstring(topology_xml(topology_for_plan(odd, plan)))
    assert root.find("cpu").get("vendor") == 'Genuine"<Intel>&'  # type: ignore[union-attr]


def test_a_guests_own_snapshot_gives_its_own_bus_ids():
    facts = snapshot_facts("h100-guest")
    assert facts.cpu is not None and (facts.cpu.family, facts.cpu.model) == (6, 207)  # its 'cpu family', 'model'
    topology = topology_for_guest(facts)
    assert [(cpu.numa_id, [g.busid for g in cpu.gpus]) for cpu in topology.cpus] == [(0, ["0000:00:06.0"])]
    assert topology.gpus[0].host_address is None


def test_the_topology_path_is_beside_the_domain_xml():
    assert topology_path_for("/srv/vms/train-1.xml") == "/srv/vms/train-1.nccl-topo.xml"
    assert topology_path_for("train-1") == "train-1.nccl-topo.xml"


def test_guest_up_names_the_file_in_nccl_conf_keeping_the_other_lines(tmp_path: Path):
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_DEBUG=WARN\nNCCL_TOPO_FILE=/old.xml\n  NCCL_TOPO_FILE = /older.xml\nNCCL_IB_HCA=mlx5\n")
    argv = ["sh", "-c", NCCL_CONF_SET_TOPOLOGY, "sh", str(conf), "/etc/gpuhost/nccl-topology.xml"]
    subprocess.run(argv, check=True)
    assert conf.read_text() == "NCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5\nNCCL_TOPO_FILE=/etc/gpuhost/nccl-topology.xml\n"
    conf.unlink()  # no nccl.conf yet: one is made
    subprocess.run(argv, check=True)
    assert conf.read_text() == "NCCL_TOPO_FILE=/etc/gpuhost/nccl-topology.xml\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nccl.conf"]
