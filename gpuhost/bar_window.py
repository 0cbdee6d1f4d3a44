"""How much guest physical address space the passed devices' 64-bit BARs take, and how many address
bits a guest CPU needs for its firmware to place them: one answer for the audit (can this host's
VM of all its GPUs work at all) and render (the VM's <maxphysaddr>, or its refusal)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuhost.facts.pci import PciFunction

HOLE64_MIN_BYTES = 32 << 30  # QEMU's q35 default pci-hole64-size

# The guest's physical address width where nothing sets it: TCG's (and any CPU model but host's).
QEMU_DEFAULT_PHYS_BITS = 40

# OVMF (edk2-stable202211 on, PlatformDynamicMmioWindow) puts its 64-bit PCI window in the top
# eighth of the guest's address space: a width of B bits holds a window of 2^(B-3). SeaBIOS places
# BARs above the guest's memory whatever the width, and QEMU refuses a hole past the width, so the
# OVMF rule also bounds a SeaBIOS guest's hole. Measured under TCG (40 bits): OVMF 2022.11 put a
# 64 GiB BAR at 896 GiB; SeaBIOS 1.16 put a 1 TiB BAR at 1 TiB, which the guest kernel dropped.
FIRMWARE_WINDOW_SHARE_BITS = 3


def bars_window_bytes(ports: Iterable[Sequence[PciFunction]]) -> int:
    """The 64-bit PCI window the BARs of the functions behind each guest root port need, as the
    guest's firmware places them: per port, its 64-bit prefetchable BARs packed in a bridge window
    aligned to the largest of them (OVMF and SeaBIOS size a bridge's window to a multiple of its
    largest BAR); the ports' windows summed and rounded up to a power of two (the firmware's window
    is one). 0 where no function has such a BAR (its 32-bit BARs go below 4 GiB)."""
    total = 0
    for functions in ports:
        sizes = sorted(
            (bar.size for f in functions for bar in f.bars if bar.is_64bit and bar.is_prefetchable), reverse=True
        )
        if sizes:
            total += -(-sum(sizes) // sizes[0]) * sizes[0]
    return 1 << (total - 1).bit_length() if total else 0


def bar_window_bytes(ports: Iterable[Sequence[PciFunction]]) -> int:
    """The 64-bit PCI hole to give a firmware that does not size its own (an OVMF older than
    edk2-stable202211, through fw_cfg): what the BARs need, at least QEMU's default."""
    return max(HOLE64_MIN_BYTES, bars_window_bytes(ports))


def bits_for_window(window: int) -> int:
    """The fewest physical address bits whose firmware window holds `window`: exactly the widths
    `window_of_bits` says hold it (a guest of the host's width on KVM may have fewer than QEMU's 40)."""
    return max(window - 1, 0).bit_length() + FIRMWARE_WINDOW_SHARE_BITS


def window_of_bits(bits: int) -> int:
    """The 64-bit window a guest firmware makes in an address space of `bits` bits."""
    return 1 << (bits - FIRMWARE_WINDOW_SHARE_BITS)


def describe_size(size: int) -> str:
    """'512 MiB', '64 GiB', '2 TiB': a window or BAR size (powers of two), in its largest whole unit."""
    if size < 1 << 30 or size % (1 << 30):
        return f"{size >> 20} MiB"
    return f"{size >> 30} GiB" if size < 1 << 40 or size % (1 << 40) else f"{size >> 40} TiB"
