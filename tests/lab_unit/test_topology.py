"""QEMU command lines of lab hosts, per topology, checked as data."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.lab.topology import (
    GPU_ID,
    IN_BAND_BMC,
    SWITCH_DOWNSTREAM,
    SWITCH_GPUS,
    SWITCH_NIC,
    SWITCH_UPSTREAM,
    TOPOLOGIES,
    LabVmSpec,
    parse_memory,
    qemu_argv,
)


def spec(topology: str = "gpu-pair", **changes: object) -> LabVmSpec:
    values: dict[str, object] = {
        "name": "lab-1",
        "topology": topology,
        "memory_mib": 4096,
        "cpus": 2,
        "ssh_port": 40022,
        "disk": Path("/lab/overlays/lab-1.qcow2"),
        "serial_log": Path("/lab/logs/lab-1-serial.log"),
        "pidfile": Path("/lab/lab-1.pid"),
    }
    values.update(changes)
    return LabVmSpec(**values)  # type: ignore[arg-type]


def devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-device"]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_gpu_pair_argv_is_exactly_this() -> None:
    argv = qemu_argv(spec())
    assert argv[0] == "qemu-system-x86_64"
    assert option(argv, "-machine") == "q35,kernel-irqchip=split"
    assert option(argv, "-accel") == "tcg,thread=single,tb-size=256"
    assert option(argv, "-cpu") == "max,vendor=GenuineIntel,-avx,-avx2,-fma,-f16c"
    assert option(argv, "-m") == "4096"
    assert option(argv, "-smp") == "2"
    assert devices(argv) == [
        "intel-iommu,intremap=on,caching-mode=on",
        "cirrus-vga,id=bmc,bus=pcie.0,addr=0x2",
        "pcie-root-port,id=gpu1port,chassis=1,bus=pcie.0,addr=0x3",
        "VGA,id=gpu1,bus=gpu1port,addr=0x0.0,multifunction=on",
        "ich9-intel-hda,id=gpu1audio,bus=gpu1port,addr=0x0.1",
        "virtio-net-pci,netdev=net0,bus=pcie.0,addr=0x5",
        "virtio-blk-pci,drive=disk0,bus=pcie.0,addr=0x6,bootindex=1",
    ]
    assert option(argv, "-netdev") == "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22"
    assert option(argv, "-serial") == "file:/lab/logs/lab-1-serial.log"
    assert option(argv, "-pidfile") == "/lab/lab-1.pid"
    assert option(argv, "-smbios") == "type=1,serial=lab-1"
    assert "-daemonize" in argv and "-nodefaults" in argv
    assert option(argv, "-display") == "none" and option(argv, "-monitor") == "none"


def test_intel_iommu_comes_before_every_other_device() -> None:
    for name, topology in TOPOLOGIES.items():
        found = devices(qemu_argv(spec(name)))
        if topology.iommu:
            assert found[0].startswith("intel-iommu,"), name


def test_no_iommu_drops_only_the_iommu_and_split_irqchip() -> None:
    with_iommu = devices(qemu_argv(spec("gpu-pair")))
    without = qemu_argv(spec("no-iommu"))
    assert devices(without) == with_iommu[1:]
    assert option(without, "-machine") == "q35"


def test_two_gpus_have_same_ids_on_separate_root_ports() -> None:
    found = devices(qemu_argv(spec("two-gpus")))
    ports = [d for d in found if d.startswith("pcie-root-port")]
    assert ports == [
        "pcie-root-port,id=gpu1port,chassis=1,bus=pcie.0,addr=0x3",
        "pcie-root-port,id=gpu2port,chassis=2,bus=pcie.0,addr=0x4",
    ]
    assert [d.split(",")[0] for d in found].count("VGA") == 2
    assert [d.split(",")[0] for d in found].count("ich9-intel-hda") == 2
    assert TOPOLOGIES["two-gpus"].gpus == (GPU_ID,)


def test_shared_group_puts_gpu_and_nic_behind_one_conventional_bridge() -> None:
    found = devices(qemu_argv(spec("shared-group")))
    assert "pci-bridge,id=bridge1,chassis_nr=1,bus=pcie.0,addr=0x3" in found
    behind = [d for d in found if "bus=bridge1" in d]
    assert [d.split(",")[0] for d in behind] == ["VGA", "ich9-intel-hda", "e1000"]
    assert not any(d.startswith("pcie-root-port") for d in found)
    assert TOPOLOGIES["shared-group"].intruders == ("0000:01:02.0",)


def test_numa_pair_splits_cpus_and_memory_and_hangs_the_gpu_off_node_1() -> None:
    argv = qemu_argv(spec("numa-pair", cpus=2, memory_mib=4096))
    assert [argv[i + 1] for i, word in enumerate(argv) if word in ("-object", "-numa")] == [
        "memory-backend-ram,id=node0mem,size=2048M",
        "node,nodeid=0,cpus=0,memdev=node0mem",
        "memory-backend-ram,id=node1mem,size=2048M",
        "node,nodeid=1,cpus=1,memdev=node1mem",
    ]
    assert devices(argv)[2:5] == [
        "pxb-pcie,id=node1bus,bus_nr=0x80,numa_node=1,bus=pcie.0,addr=0x7",
        "pcie-root-port,id=gpu1port,chassis=1,bus=node1bus,addr=0x0",
        "VGA,id=gpu1,bus=gpu1port,addr=0x0.0,multifunction=on",
    ]
    assert TOPOLOGIES["numa-pair"].gpu_functions == ("0000:81:00.0", "0000:81:00.1")
    four = qemu_argv(spec("numa-pair", cpus=4, memory_mib=4096))
    assert "node,nodeid=1,cpus=2-3,memdev=node1mem" in four


@pytest.mark.parametrize("changes", [{"cpus": 1}, {"cpus": 3}, {"memory_mib": 4095}])
def test_numa_pair_needs_an_even_share_per_node(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="topology numa-pair has 2 NUMA nodes"):
        qemu_argv(spec("numa-pair", **changes))


def test_gpu_pair_bmc_is_gpu_pair_with_the_emulated_bmc_on_kcs() -> None:
    with_bmc = devices(qemu_argv(spec("gpu-pair-bmc")))
    assert [d for d in with_bmc if d not in IN_BAND_BMC] == devices(qemu_argv(spec("gpu-pair")))
    assert IN_BAND_BMC == ("ipmi-bmc-sim,id=inbandbmc", "isa-ipmi-kcs,bmc=inbandbmc")
    first = with_bmc.index(IN_BAND_BMC[0])
    assert tuple(with_bmc[first : first + 2]) == IN_BAND_BMC  # the interface names its BMC, declared first


def test_one_node_topologies_have_no_numa_options() -> None:
    argv = qemu_argv(spec("gpu-pair"))
    assert "-numa" not in argv and "-object" not in argv


def test_every_topology_keeps_a_bmc_console_on_the_root_bus() -> None:
    for name in TOPOLOGIES:
        assert "cirrus-vga,id=bmc,bus=pcie.0,addr=0x2" in devices(qemu_argv(spec(name)))


def test_commas_in_paths_are_escaped_for_qemu() -> None:
    argv = qemu_argv(spec(disk=Path("/a,b/lab-1.qcow2"), serial_log=Path("/x,y/serial.log")))
    assert option(argv, "-drive").startswith("file=/a,,b/lab-1.qcow2,if=none")
    assert option(argv, "-serial") == "file:/x,,y/serial.log"


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "lab-1,process=x"},
        {"name": "web-1"},
        {"topology": "nope"},
        {"ssh_port": 0},
        {"memory_mib": 100},
        {"cpus": 0},
    ],
)
def test_bad_specs_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        qemu_argv(spec(**changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "mib"), [("4G", 4096), ("4g", 4096), ("2048M", 2048), ("1024", 1024), ("2GiB", 2048)])
def test_parse_memory(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


def test_parse_memory_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="4G"):
        parse_memory("lots")


def test_numa_gpus_puts_a_second_card_with_a_1_tib_bar_on_node_1_and_widens_the_cpu() -> None:
    argv = qemu_argv(spec("numa-gpus", cpus=4, memory_mib=6144))
    assert option(argv, "-cpu") == "max,vendor=GenuineIntel,-avx,-avx2,-fma,-f16c,phys-bits=42"
    assert devices(argv)[6:9] == [
        "pcie-root-port,id=gpu2port,chassis=2,bus=node1bus,addr=0x1",
        "virtio-gpu-pci,id=gpu2,bus=gpu2port,addr=0x0.0,multifunction=on",
        "pci-testdev,id=gpu2bar,bus=gpu2port,addr=0x0.1,membar=1T",
    ]
    assert TOPOLOGIES["numa-gpus"].gpus == ("1234:1111", "1af4:1050")
    # The other topologies keep QEMU's default address width.
    numa_pair_cpu = option(qemu_argv(spec("numa-pair", cpus=2, memory_mib=4096)), "-cpu")
    assert numa_pair_cpu == "max,vendor=GenuineIntel,-avx,-avx2,-fma,-f16c"


def test_numa_gpus_puts_a_switch_with_two_stand_in_gpus_and_a_nic_behind_a_root_port_of_node_1() -> None:
    argv = qemu_argv(spec("numa-gpus", cpus=4, memory_mib=6144))
    listed = devices(argv)
    assert listed[9:] == [
        "pcie-root-port,id=switchport,chassis=3,bus=node1bus,addr=0x2",
        "x3130-upstream,id=switchup,bus=switchport,addr=0x0",
        "xio3130-downstream,id=switchdown1,bus=switchup,addr=0x0,chassis=4,slot=0",
        "xio3130-downstream,id=switchdown2,bus=switchup,addr=0x1,chassis=5,slot=0",
        "VGA,id=gpu3,bus=switchdown1,addr=0x0.0",
        "VGA,id=gpu4,bus=switchdown2,addr=0x0.0,multifunction=on",
        "e1000e,id=switchnic,bus=switchdown2,addr=0x0.1,romfile=",
        "virtio-net-pci,netdev=net0,bus=pcie.0,addr=0x5",
        "virtio-blk-pci,drive=disk0,bus=pcie.0,addr=0x6,bootindex=1",
    ]
    # Every bus a device names is declared before it (QEMU needs it so); ids are unique; no two
    # hotplug slots (root and downstream ports) share a chassis.
    fields = [dict(part.split("=", 1) for part in device.split(",")[1:] if "=" in part) for device in listed]
    declared = {"pcie.0"}
    for device, values in zip(listed, fields, strict=True):
        assert values.get("bus", "pcie.0") in declared, device
        if "id" in values:
            assert values["id"] not in declared, device
            declared.add(values["id"])
    chassis = [v["chassis"] for d, v in zip(listed, fields, strict=True) if d.startswith(("pcie-root-port", "xio3130"))]
    assert len(chassis) == len(set(chassis))
    # What the host sees, as its firmware numbers node 1's buses depth first from 0x80: root ports
    # 80:00.0, 80:01.0, 80:02.0 (buses 0x81-0x83), the switch's upstream port on 0x83, its downstream
    # ports on 0x84, their devices on 0x85 and 0x86.
    assert (SWITCH_UPSTREAM, SWITCH_DOWNSTREAM) == ("0000:83:00.0", ("0000:84:00.0", "0000:84:01.0"))
    assert (SWITCH_GPUS, SWITCH_NIC) == (("0000:85:00.0", "0000:86:00.0"), "0000:86:00.1")
    assert TOPOLOGIES["numa-gpus"].gpu_functions[4:] == (*SWITCH_GPUS, SWITCH_NIC)
