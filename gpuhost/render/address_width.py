"""The guest's physical address width, the 64-bit MMIO window OVMF gives the GPUs' BARs, and the memory lock limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpuhost.bar_window import (
    QEMU_DEFAULT_PHYS_BITS,
    bar_window_bytes,
    bars_window_bytes,
    bits_for_window,
    describe_size,
    window_of_bits,
)
from gpuhost.facts.model import GIB_KIB, Firmware, HostFacts
from gpuhost.inventory.spec import DomainType, VmSpec
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.render.conflicts import render_conflict
from gpuhost.render.layout import RootPort
from gpuhost.render.memory import KIB_PER_MIB

# What libvirt itself allows beyond guest memory for a VFIO domain's locked memory when no limit is
# given (the devices' I/O space and QEMU's own locked allocations).
VFIO_LOCK_ALLOWANCE_KIB = GIB_KIB

MAXPHYSADDR_LIBVIRT = (8, 7)  # the first libvirt with <maxphysaddr>

TCG_MAX_PHYS_BITS = 52  # x86-64's architectural limit, QEMU's TARGET_PHYS_ADDR_SPACE_BITS

# OVMF sizes its 64-bit PCI aperture from the guest's physical address width from edk2-stable202211
# on; older builds keep 32 GiB unless fw_cfg opt/ovmf/X-PciMmio64Mb says otherwise.
OVMF_SIZES_FROM_PHYS_BITS = 202211

# q35's most vCPUs: 288 until QEMU 8.1 raised it to 1024 (QEMU refuses to start the domain beyond it).
Q35_MAX_VCPUS_OLD_QEMU = 288

Q35_MORE_VCPUS_QEMU = (8, 1)

# A TCG domain (domain_type qemu: tests and labs without KVM) runs QEMU's code translator, whose
# buffer is 1 GiB by default (an eighth of the host's memory on smaller hosts). With <locked/>
# QEMU locks its whole address space, the buffer included, within the memtune hard limit, so the
# buffer's size is set (libvirt's <tcg><tb-cache>, 8.0 on) and counted in the limit. Measured on
# the lab: the passthrough proof's 1 GiB domain, limit 2.0 GiB, failed to start ("mlockall: Cannot
# allocate memory") on a 6 GiB host (a 768 MiB buffer) and started on a 4 GiB one (512 MiB).
TCG_TB_CACHE_MIB = 256

VCPUS_QEMU_Q35_LIMIT = register(
    "render.vcpus.qemu_q35_limit",
    Stage.RENDER,
    Severity.ERROR,
    "more than 288 vCPUs, the most q35 takes on the host's QEMU (before 8.1)",
)

LIBVIRT_MAXPHYSADDR = register(
    "render.libvirt.maxphysaddr",
    Stage.RENDER,
    Severity.ERROR,
    "the host's libvirt is older than 8.7, which <maxphysaddr> needs (every KVM guest, a TCG guest with large BARs)",
)

BARS_ADDRESS_WIDTH = register(
    "render.bars.address_width",
    Stage.RENDER,
    Severity.ERROR,
    "the guest's physical address width leaves its firmware a 64-bit PCI window smaller than the GPUs' BARs",
)


@dataclass(frozen=True)
class GuestAddressWidth:
    """The guest CPU's physical address width, as <maxphysaddr> says it: the host's (passthrough, KVM)
    or a number of bits (emulate, TCG)."""

    mode: Literal["passthrough", "emulate"]
    bits: int | None = None  # emulate only


def guest_address_width(
    facts: HostFacts, spec: VmSpec, bars_window: int, conflicts: list[Problem], notes: list[str]
) -> GuestAddressWidth | None:
    """What <maxphysaddr> the guest needs for its firmware's 64-bit window to hold `bars_window`
    (`bars_window_bytes`: what the passed BARs need, nothing more).

    KVM: the host's width (passthrough), refused only where the BARs do not fit the window the
    host CPU's own width leaves the firmware (a 39-bit desktop's 64 GiB holds a consumer card's).
    TCG: QEMU's 40 bits are left alone where they suffice, else the fewest bits that do (emulate).
    Either needs libvirt 8.7; an older one is refused, naming it."""
    needed = bits_for_window(bars_window)
    window = f"a {describe_size(bars_window)} 64-bit PCI window (the BARs of the passed functions)"
    if spec.domain_type is DomainType.KVM:
        cpu_bits = facts.cpu.physical_address_bits if facts.cpu is not None else None
        if cpu_bits is not None and cpu_bits < needed:
            conflicts.append(
                render_conflict(
                    BARS_ADDRESS_WIDTH,
                    "BARs",
                    f"the VM needs {window}, but the host's CPU has {cpu_bits} physical address bits, which leave the "
                    f"guest's firmware a window of {describe_size(window_of_bits(cpu_bits))}: the BARs that "
                    "do not fit are not assigned;",
                    f"give the VM fewer GPUs (or GPUs with smaller BARs), or run it on a host whose CPU has at least "
                    f"{needed} physical address bits.",
                )
            )
        width = GuestAddressWidth("passthrough")
    elif needed <= QEMU_DEFAULT_PHYS_BITS:
        return None
    elif needed > TCG_MAX_PHYS_BITS:
        conflicts.append(
            render_conflict(
                BARS_ADDRESS_WIDTH,
                "BARs",
                f"the VM needs {window}, which would take {needed} physical address bits, more than the "
                f"{TCG_MAX_PHYS_BITS} QEMU emulates;",
                "give the VM fewer GPUs (or GPUs with smaller BARs).",
            )
        )
        return None
    else:
        notes.append(
            f"the guest CPU gets {needed} physical address bits (QEMU's default {QEMU_DEFAULT_PHYS_BITS} leave the "
            f"firmware a {describe_size(window_of_bits(QEMU_DEFAULT_PHYS_BITS))} window; the VM needs "
            f"{window})"
        )
        width = GuestAddressWidth("emulate", needed)
    _check_maxphysaddr_libvirt(facts, conflicts, notes)
    return width


def _check_maxphysaddr_libvirt(facts: HostFacts, conflicts: list[Problem], notes: list[str]) -> None:
    """<maxphysaddr> is libvirt 8.7's: an older one is refused, naming it (`virsh define` would fail).
    Unknown (no package database, libvirt not installed): emitted, and said."""
    software = facts.virtualization
    release = software.libvirt_release if software is not None else None
    if release is None:
        notes.append("the libvirt version of the host is unknown: maxphysaddr needs libvirt 8.7 or later")
        return
    if release < MAXPHYSADDR_LIBVIRT:
        assert software is not None
        conflicts.append(
            render_conflict(
                LIBVIRT_MAXPHYSADDR,
                "libvirt",
                f"the host's libvirt is {software.libvirt} (libvirt-daemon), older than 8.7: it does not know "
                "<maxphysaddr>, through which the guest gets the physical address width its firmware needs for "
                "the GPUs' BARs, so `virsh define` would fail;",
                "upgrade libvirt to 8.7 or later (Debian 12 ships 9.0, Ubuntu 24.04 10.0) and audit again.",
            )
        )


def iommu_width_note(facts: HostFacts) -> list[str]:
    """The audit's gpu.p2p.iommu_width, said where it matters: in the XML that passes the CPU's width on."""
    cpu_bits = facts.cpu.physical_address_bits if facts.cpu is not None else None
    iommu_bits = facts.kernel_log.iommu_address_bits if facts.kernel_log is not None else None
    if cpu_bits is None or iommu_bits is None or iommu_bits >= cpu_bits:
        return []
    return [
        f"the IOMMU of the host remaps {iommu_bits}-bit addresses, its CPU has {cpu_bits} bits: BARs placed above "
        f"2^{iommu_bits} by OVMF cannot be mapped for peer-to-peer between the passed devices"
    ]


def check_q35_vcpus(facts: HostFacts, spec: VmSpec, conflicts: list[Problem]) -> None:
    """More than 288 vCPUs on a QEMU before 8.1: q35 refuses them when the domain starts."""
    software = facts.virtualization
    release = software.qemu_release if software is not None else None
    if spec.vcpus <= Q35_MAX_VCPUS_OLD_QEMU or release is None or release >= Q35_MORE_VCPUS_QEMU:
        return
    assert software is not None
    conflicts.append(
        render_conflict(
            VCPUS_QEMU_Q35_LIMIT,
            "vCPUs",
            f"{spec.vcpus} vCPUs asked, but the host's QEMU is {software.qemu}, whose q35 machine takes at most "
            f"{Q35_MAX_VCPUS_OLD_QEMU};",
            f"ask for at most {Q35_MAX_VCPUS_OLD_QEMU} vCPUs, or upgrade QEMU to 8.1 or later.",
        )
    )


def older_ovmf_mmio64_mib(facts: HostFacts, spec: VmSpec, hole64: int, notes: list[str]) -> int | None:
    """The 64-bit aperture to hand an OVMF older than edk2-stable202211 through fw_cfg (it keeps 32 GiB
    otherwise, and a larger BAR is not assigned); None where OVMF sizes it itself or is not used."""
    if spec.firmware is not Firmware.UEFI:
        return None
    software = facts.virtualization
    release = software.ovmf_release if software is not None else None
    if release is None:
        notes.append(
            "the OVMF version of the host is unknown: an OVMF older than edk2-stable202211 keeps a 32 GiB "
            "64-bit PCI window whatever the address width of the guest"
        )
        return None
    if release >= OVMF_SIZES_FROM_PHYS_BITS:
        return None
    assert software is not None
    notes.append(
        f"the OVMF of the host ({software.ovmf}) predates edk2-stable202211 and keeps a 32 GiB 64-bit PCI window: "
        f"it is set to {hole64 >> 20} MiB through fw_cfg opt/ovmf/X-PciMmio64Mb"
    )
    return hole64 >> 20


def lock_limit_kib(memory_kib: int, ports: Sequence[RootPort], tcg_tb_cache_mib: int | None = None) -> int:
    """The memtune hard_limit of a domain with locked memory: the guest memory, every BAR of every
    passed-through function (VFIO maps them into the process; libvirt's docs: the limit must hold
    the guest's memory and what the process itself uses), a TCG domain's translation buffer and
    libvirt's own VFIO allowance. A limit too low keeps the domain from starting; one this size
    only bounds it."""
    bars = sum(bar.size for port in ports for f in port.functions for bar in f.host.bars)
    translator = (tcg_tb_cache_mib or 0) * KIB_PER_MIB
    return memory_kib + -(-bars // 1024) + translator + VFIO_LOCK_ALLOWANCE_KIB


def hole64_bytes(ports: Sequence[RootPort]) -> int:
    """The 64-bit PCI hole to hand an older OVMF for the VM's root ports (gpuhost.bar_window says how)."""
    return bar_window_bytes(tuple(f.host for f in port.functions) for port in ports)


def bars_window(ports: Sequence[RootPort]) -> int:
    """The 64-bit PCI window the BARs behind the VM's root ports need (gpuhost.bar_window says how)."""
    return bars_window_bytes(tuple(f.host for f in port.functions) for port in ports)
