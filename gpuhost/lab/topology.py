"""Named PCI topologies of lab hosts, and the QEMU command line of one lab VM (pure functions).

Every topology gives the host a console display of its own on the root bus (cirrus-vga,
1013:00b8, standing for a BMC's ASPEED display), so the kernel marks it boot_vga=1 and the
stand-in GPU boot_vga=0, as on a real GPU server. The stand-in GPU is QEMU's std VGA (1234:1111,
class 0300) as function 0 with an ICH9 HDA audio function (8086:293e, class 0403) as function 1
of the same device, like a GPU and its HDMI audio.

The numa-gpus topology adds a second stand-in card whose extra function has a 1 TiB 64-bit
prefetchable BAR (QEMU's pci-testdev, membar=): the BAR1 of a large GPU, or the sum of eight.
Its display function is a virtio-gpu (class 0380, 1af4:1050), not a std VGA: a VGA's framebuffer
is a 32-bit prefetchable BAR, and a root port has one prefetchable window, which must then stay
below 4 GiB. SeaBIOS cannot fit the large BAR there and stops before the kernel (measured: a hang).
Real GPUs have no 32-bit prefetchable BAR.

Node 1 of the numa-gpus topology also has a PCIe switch (QEMU's x3130-upstream with two
xio3130-downstream ports) behind a third root port: a std VGA stand-in GPU behind one downstream
port, and behind the other a std VGA whose function 1 is a NIC (e1000e, 8086:10d3, class 0200). A
NIC that the guest gets beside the GPUs, as on a GPU server whose NIC shares the GPUs' switch: being
a function of the GPU's device, it shares its IOMMU group, the one way gpuhost passes a NIC today
(gpuhost_allow_shared_group). A separate NIC would be alone in its group (each downstream port a
group of its own), which no VM key passes.

Under OVMF the BMC display is on the root bus, found before the stand-in GPU behind its root port,
so the firmware's console (and so efifb/simpledrm in the kernel) is the BMC's, as on a server
whose GPU is not the boot display. GRUB without Secure Boot picks the kernel's framebuffer itself;
the UEFI GRUB disk asks for a mode that puts it on the BMC's display too (recipe.EFI_GRUB_GFXPAYLOAD).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuhost.lab.boot import BIOS_GRUB, BootMode

GPU_ID = "1234:1111"  # QEMU std VGA: the stand-in GPU
GPU_AUDIO_ID = "8086:293e"  # ICH9 HDA: the stand-in GPU's audio function
LARGE_BAR_GPU_ID = "1af4:1050"  # virtio-gpu: the display function of the large-BAR card
LARGE_BAR_FUNCTION_ID = "1b36:0005"  # pci-testdev: its 1 TiB BAR
LARGE_BAR = "1T"
INTRUDER_NIC_ID = "8086:100e"  # e1000 sharing the stand-in GPU's group in shared-group
BMC_DISPLAY_ID = "1013:00b8"  # cirrus-vga: the host's own console

# Fixed root-bus slots, so that PCI addresses are the same on every boot and every host.
SLOT_BMC = 0x2
SLOT_GPU1 = 0x3
SLOT_GPU2 = 0x4
SLOT_NIC = 0x5
SLOT_DISK = 0x6
SLOT_EXPANDER = 0x7  # the pcie-expander-bus of a topology with a second NUMA node
EXPANDER_BUS = 0x80  # its bus number: the root port behind it is 80:00.0, the GPU 81:00.0
SWITCH_NIC_ID = "8086:10d3"  # e1000e: the NIC behind numa-gpus' switch, function 1 of a stand-in GPU
SWITCH_UPSTREAM_ID = "104c:8232"  # QEMU's x3130-upstream: a switch's upstream port
SWITCH_DOWNSTREAM_ID = "104c:8233"  # QEMU's xio3130-downstream: its downstream ports
# numa-gpus' switch on node 1, behind the expander bus's third root port (80:02.0, bus 0x83): its
# upstream port at 83:00.0, downstream ports at 84:00.0 and 84:01.0 (buses 0x85 and 0x86).
SWITCH_UPSTREAM = f"0000:{EXPANDER_BUS + 3:02x}:00.0"
SWITCH_DOWNSTREAM = (f"0000:{EXPANDER_BUS + 4:02x}:00.0", f"0000:{EXPANDER_BUS + 4:02x}:01.0")
SWITCH_GPUS = (f"0000:{EXPANDER_BUS + 5:02x}:00.0", f"0000:{EXPANDER_BUS + 6:02x}:00.0")
SWITCH_NIC = f"0000:{EXPANDER_BUS + 6:02x}:00.1"

NAME_PATTERN = re.compile(r"lab-[0-9]{1,3}")


def _switch_on_node_1(chassis: int) -> tuple[str, ...]:
    """A PCIe switch behind a root port (slot 2) of node 1's expander bus: a stand-in GPU behind its
    first downstream port; behind its second, a stand-in GPU whose function 1 is a NIC."""
    return (
        f"pcie-root-port,id=switchport,chassis={chassis},bus=node1bus,addr=0x2",
        "x3130-upstream,id=switchup,bus=switchport,addr=0x0",
        # A downstream port is a hotplug slot: its (chassis, slot) pair must be unique.
        f"xio3130-downstream,id=switchdown1,bus=switchup,addr=0x0,chassis={chassis + 1},slot=0",
        f"xio3130-downstream,id=switchdown2,bus=switchup,addr=0x1,chassis={chassis + 2},slot=0",
        "VGA,id=gpu3,bus=switchdown1,addr=0x0.0",
        "VGA,id=gpu4,bus=switchdown2,addr=0x0.0,multifunction=on",
        # No netdev: the NIC is there to sit behind the switch; no option ROM for the nested guest's
        # SeaBIOS to run.
        "e1000e,id=switchnic,bus=switchdown2,addr=0x0.1,romfile=",
    )


def _gpu_behind_root_port(index: int, slot: int, bus: str = "pcie.0") -> tuple[str, ...]:
    port = f"gpu{index}port"
    return (
        f"pcie-root-port,id={port},chassis={index},bus={bus},addr={slot:#x}",
        f"VGA,id=gpu{index},bus={port},addr=0x0.0,multifunction=on",
        f"ich9-intel-hda,id=gpu{index}audio,bus={port},addr=0x0.1",
    )


# A BMC the host's own kernel talks to (issue 31): QEMU's BMC simulator on the ISA KCS interface at
# its default port (0xca2), which ACPI announces as IPI0001. Its watchdog's expiry resets the
# machine, and a reset of the host does not stop it (measured: docs/safety.md). Not the cirrus-vga
# "bmc" display, which every topology has.
IN_BAND_BMC = ("ipmi-bmc-sim,id=inbandbmc", "isa-ipmi-kcs,bmc=inbandbmc")


@dataclass(frozen=True)
class Topology:
    name: str
    summary: str
    iommu: bool
    devices: tuple[str, ...]  # -device values, in order
    gpus: tuple[str, ...]  # vendor:device IDs of the stand-in GPUs (for the inventory)
    # What the guest kernel shows, for documentation and for the lab tests:
    # PCI addresses of the stand-in GPU functions and of anything sharing their group.
    gpu_functions: tuple[str, ...]
    intruders: tuple[str, ...]
    # NUMA nodes: with more than one, each node gets an equal share of the vCPUs and of the memory
    # (QEMU's -numa), and `devices` may put a pxb-pcie on a node (its numa_node property).
    numa_nodes: int = 1
    # The host CPU's physical address bits (QEMU's phys-bits); None: QEMU's TCG default, 40, whose
    # 1 TiB address space cannot hold a 1 TiB BAR above the host's memory.
    phys_bits: int | None = None


TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology(
            name="gpu-pair",
            summary="a display (0300) + HDA audio (0403) pair behind its own PCIe root port: one clean group",
            iommu=True,
            devices=_gpu_behind_root_port(1, SLOT_GPU1),
            gpus=(GPU_ID,),
            gpu_functions=("0000:01:00.0", "0000:01:00.1"),
            intruders=(),
        ),
        Topology(
            name="two-gpus",
            summary="two such pairs with the same vendor:device IDs, each in its own group "
            "(binding by ID vs by address)",
            iommu=True,
            devices=_gpu_behind_root_port(1, SLOT_GPU1) + _gpu_behind_root_port(2, SLOT_GPU2),
            gpus=(GPU_ID,),
            gpu_functions=("0000:01:00.0", "0000:01:00.1", "0000:02:00.0", "0000:02:00.1"),
            intruders=(),
        ),
        Topology(
            name="shared-group",
            summary="the pair behind a conventional PCI bridge together with a NIC (8086:100e): "
            "the GPU's group holds an intruder",
            iommu=True,
            devices=(
                f"pci-bridge,id=bridge1,chassis_nr=1,bus=pcie.0,addr={SLOT_GPU1:#x}",
                "VGA,id=gpu1,bus=bridge1,addr=0x1.0,multifunction=on",
                "ich9-intel-hda,id=gpu1audio,bus=bridge1,addr=0x1.1",
                # No netdev: the NIC is there only to share the group.
                "e1000,id=intruder,bus=bridge1,addr=0x2.0",
            ),
            gpus=(GPU_ID,),
            gpu_functions=("0000:01:01.0", "0000:01:01.1"),
            intruders=("0000:01:02.0",),
        ),
        Topology(
            name="numa-pair",
            summary="two NUMA nodes (half the vCPUs and memory each); the gpu-pair behind a root port on a "
            "pcie-expander-bus of node 1, as on a 2-socket host whose GPU hangs off the second socket",
            iommu=True,
            devices=(
                f"pxb-pcie,id=node1bus,bus_nr={EXPANDER_BUS:#x},numa_node=1,bus=pcie.0,addr={SLOT_EXPANDER:#x}",
                *_gpu_behind_root_port(1, 0x0, bus="node1bus"),
            ),
            gpus=(GPU_ID,),
            gpu_functions=(f"0000:{EXPANDER_BUS + 1:02x}:00.0", f"0000:{EXPANDER_BUS + 1:02x}:00.1"),
            intruders=(),
            numa_nodes=2,
        ),
        Topology(
            name="numa-gpus",
            summary="two NUMA nodes; on node 1's pcie-expander-bus the gpu-pair and a large-BAR card (a virtio-gpu "
            f"display with a PCI test function whose 64-bit prefetchable BAR is {LARGE_BAR}iB), each behind its "
            "own root port, and a PCIe switch with two stand-in GPUs and a NIC (the second GPU's function 1) "
            "behind it; a CPU with 42 address bits: two VMs on one node, a large BAR and a switch for a nested guest",
            iommu=True,
            devices=(
                f"pxb-pcie,id=node1bus,bus_nr={EXPANDER_BUS:#x},numa_node=1,bus=pcie.0,addr={SLOT_EXPANDER:#x}",
                *_gpu_behind_root_port(1, 0x0, bus="node1bus"),
                "pcie-root-port,id=gpu2port,chassis=2,bus=node1bus,addr=0x1",
                "virtio-gpu-pci,id=gpu2,bus=gpu2port,addr=0x0.0,multifunction=on",
                f"pci-testdev,id=gpu2bar,bus=gpu2port,addr=0x0.1,membar={LARGE_BAR}",
                *_switch_on_node_1(chassis=3),
            ),
            gpus=(GPU_ID, LARGE_BAR_GPU_ID),
            gpu_functions=(
                f"0000:{EXPANDER_BUS + 1:02x}:00.0",
                f"0000:{EXPANDER_BUS + 1:02x}:00.1",
                f"0000:{EXPANDER_BUS + 2:02x}:00.0",
                f"0000:{EXPANDER_BUS + 2:02x}:00.1",
                *SWITCH_GPUS,
                SWITCH_NIC,
            ),
            intruders=(),
            numa_nodes=2,
            phys_bits=42,
        ),
        Topology(
            name="gpu-pair-bmc",
            summary="the gpu-pair host with an in-band BMC: QEMU's emulated BMC behind a KCS interface "
            "(/dev/ipmi0 once ipmi_si and ipmi_devintf are loaded), whose watchdog resets the host",
            iommu=True,
            devices=_gpu_behind_root_port(1, SLOT_GPU1) + IN_BAND_BMC,
            gpus=(GPU_ID,),
            gpu_functions=("0000:01:00.0", "0000:01:00.1"),
            intruders=(),
        ),
        Topology(
            name="no-iommu",
            summary="the gpu-pair host without the IOMMU device: no IOMMU groups at all",
            iommu=False,
            devices=_gpu_behind_root_port(1, SLOT_GPU1),
            gpus=(GPU_ID,),
            gpu_functions=("0000:01:00.0", "0000:01:00.1"),
            intruders=(),
        ),
    )
}


# CPU features that TCG emulates slowly and no lab proof needs (qemu_argv says what they cost).
TCG_CPU_FEATURES_OFF = ("-avx", "-avx2", "-fma", "-f16c")
TCG_TRANSLATION_BUFFER_MIB = 256  # see qemu_argv


@dataclass(frozen=True)
class LabVmSpec:
    name: str
    topology: str
    memory_mib: int
    cpus: int
    ssh_port: int
    disk: Path
    serial_log: Path
    pidfile: Path
    boot: BootMode = BIOS_GRUB
    # UEFI: this host's writable copy of OVMF's variable store (None under BIOS).
    efi_vars: Path | None = None
    # QMP, through which a just-booted host's state is saved for later `lab up`s (gpuhost.lab.resume).
    qmp_socket: Path | None = None


def _opt_value(value: str | Path) -> str:
    # QEMU option values are comma-separated; a literal comma is written as two.
    return str(value).replace(",", ",,")


def validate_spec(spec: LabVmSpec) -> None:
    if not NAME_PATTERN.fullmatch(spec.name):
        raise ValueError(f"lab host name {spec.name!r} must look like lab-N")
    if spec.topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {spec.topology!r}; known: {', '.join(TOPOLOGIES)}")
    if not 1 <= spec.ssh_port <= 65535:
        raise ValueError(f"SSH port {spec.ssh_port} out of range")
    if spec.memory_mib < 512 or spec.cpus < 1:
        raise ValueError("a lab host needs at least 512 MiB of memory and one CPU")
    if (spec.boot.ovmf is None) != (spec.efi_vars is None):
        raise ValueError(f"{spec.name}: a UEFI host needs its own EFI variable store, a BIOS host none")
    nodes = TOPOLOGIES[spec.topology].numa_nodes
    if spec.cpus % nodes or spec.memory_mib % nodes:
        raise ValueError(
            f"topology {spec.topology} has {nodes} NUMA nodes: give it a multiple of {nodes} vCPUs and of "
            f"{nodes} MiB of memory (--cpus {nodes} --memory {nodes * 2048}M, say)"
        )


def qemu_argv(spec: LabVmSpec, qemu: str = "qemu-system-x86_64") -> list[str]:
    """The full QEMU command line of one lab host (started daemonized, its PID in spec.pidfile)."""
    validate_spec(spec)
    topology = TOPOLOGIES[spec.topology]
    # Interrupt remapping (intremap=on) needs the split irqchip.
    machine = "q35,kernel-irqchip=split" if topology.iommu else "q35"
    ovmf = spec.boot.ovmf
    if ovmf is not None and ovmf.needs_smm:
        # OVMF's Secure Boot build keeps its variables safe from the OS in SMM.
        machine += ",smm=on"
    argv = [
        qemu,
        "-name",
        f"{spec.name},process=gpuhost-{spec.name}",
        "-machine",
        machine,
        "-accel",
        # tb-size: TCG's translation buffer in MiB (QEMU's default, 1 GiB). Measured on this 2-core
        # machine, one 2 GiB host each, same disk, back to back: a guest reboot took 229 s and 112 s
        # with the default (the vCPU thread busy for over a minute while GRUB loaded the initrd, and
        # again in the initramfs), 59 s and 54 s with 256 MiB, 54 s and 65 s with 64 MiB; a cold
        # start 58-60 s either way, and update-initramfs + update-grub no slower. Every apply in the
        # lab reboots at least once. The suspect: translations of the previous boot's code that
        # a large buffer keeps, invalidated page by page as the new boot overwrites that memory.
        # thread=single: one host thread runs every vCPU in turn. CI's two workers each drive a host on
        # a 2-core machine, so a host with several vCPUs gets about one core; with a thread per vCPU
        # (thread=multi) its vCPUs wait on each other through the other worker's load. Measured on
        # Molecule's numa-pair host (2 vCPUs) with one core kept busy beside it: update-initramfs 146 s
        # multi, 96 s single; update-grub 26 / 21 s; a reboot 100 s either way (the boot runs on one
        # vCPU); in CI, with a lab host and Ansible beside it, update-initramfs took 7 minutes multi.
        f"tcg,thread=single,tb-size={TCG_TRANSLATION_BUFFER_MIB}",
        # -cpu max offers pdpe1gb, so the host can reserve 1 GiB huge pages. Under TCG it says
        # AuthenticAMD; an Intel IOMMU belongs with an Intel CPU (intel_iommu=, not amd_iommu=).
        # Without AVX, AVX2, FMA and F16C (TCG_CPU_FEATURES_OFF): glibc and the kernel then take their
        # SSE paths, which TCG runs faster than its emulated 256-bit ones. Measured on this 2-core
        # machine, one 4 GiB host: update-initramfs 85 s against 96 s, update-grub 18 against 22 s,
        # a reboot to SSH 60 against 99 s. Nothing a lab host proves needs them.
        "-cpu",
        ",".join(["max", "vendor=GenuineIntel", *TCG_CPU_FEATURES_OFF])
        + (f",phys-bits={topology.phys_bits}" if topology.phys_bits else ""),
        "-smp",
        str(spec.cpus),
        "-m",
        str(spec.memory_mib),
        *_numa_options(spec.cpus, spec.memory_mib, topology.numa_nodes),
        "-nodefaults",
        "-no-user-config",
    ]
    if ovmf is not None and spec.efi_vars is not None:
        if ovmf.needs_smm:
            argv += ["-global", "driver=cfi.pflash01,property=secure,value=on"]
        argv += [
            "-drive",
            f"if=pflash,format=raw,unit=0,readonly=on,file={_opt_value(ovmf.code)}",
            "-drive",
            f"if=pflash,format=raw,unit=1,file={_opt_value(spec.efi_vars)}",
        ]
    if topology.iommu:
        # caching-mode=on lets a nested guest's vfio-pci work through this IOMMU.
        argv += ["-device", "intel-iommu,intremap=on,caching-mode=on"]
    argv += ["-device", f"cirrus-vga,id=bmc,bus=pcie.0,addr={SLOT_BMC:#x}"]
    for device in topology.devices:
        argv += ["-device", device]
    argv += [
        # restrict=on: the guest reaches nothing beyond its forwarded SSH port on 127.0.0.1.
        "-netdev",
        f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
        "-device",
        f"virtio-net-pci,netdev=net0,bus=pcie.0,addr={SLOT_NIC:#x}",
        # cache=unsafe: guest flushes are not forced to disk; a lab overlay is disposable and
        # fsync under TCG would only slow package and initramfs work down.
        "-drive",
        f"file={_opt_value(spec.disk)},if=none,id=disk0,format=qcow2,cache=unsafe",
        "-device",
        f"virtio-blk-pci,drive=disk0,bus=pcie.0,addr={SLOT_DISK:#x},bootindex=1",
        # The guest names itself after this serial number (gpuhost-lab-hostname.service).
        "-smbios",
        f"type=1,serial={spec.name}",
        "-serial",
        f"file:{_opt_value(spec.serial_log)}",
        "-monitor",
        "none",
        *(["-qmp", f"unix:{_opt_value(spec.qmp_socket)},server=on,wait=off"] if spec.qmp_socket else []),
        "-display",
        "none",
        "-daemonize",
        "-pidfile",
        str(spec.pidfile),
    ]
    return argv


def _numa_options(cpus: int, memory_mib: int, nodes: int) -> list[str]:
    """Node N: the Nth equal share of the vCPUs and of the memory (a RAM backend each)."""
    if nodes == 1:
        return []
    options: list[str] = []
    per_node_cpus, per_node_mib = cpus // nodes, memory_mib // nodes
    for node in range(nodes):
        first = node * per_node_cpus
        cpu_range = str(first) if per_node_cpus == 1 else f"{first}-{first + per_node_cpus - 1}"
        options += ["-object", f"memory-backend-ram,id=node{node}mem,size={per_node_mib}M"]
        options += ["-numa", f"node,nodeid={node},cpus={cpu_range},memdev=node{node}mem"]
    return options


def parse_memory(text: str) -> int:
    """'4G', '4096M', '4096' (MiB) -> MiB."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([GgMm]?)(?:i?[Bb])?\s*", text)
    if not match:
        raise ValueError(f"memory size {text!r}: write it as 4G, 4096M or 4096 (MiB)")
    number, unit = int(match.group(1)), match.group(2).upper()
    return number * 1024 if unit == "G" else number
