"""Byte-level formats the image build writes itself: an MBR partition table and a newc cpio;
and the one it reads: the kernel inside a bzImage.

Written here rather than by sfdisk and cpio so that the build needs fewer host programs and so
that both are tested as pure functions.
"""

from __future__ import annotations

import gzip
import lzma
import struct
from dataclasses import dataclass

SECTOR = 512
FIRST_SECTOR = 2048  # 1 MiB: room for GRUB's core.img between the MBR and the partition
PARTITION_OFFSET = FIRST_SECTOR * SECTOR


def mbr_with_one_partition(disk_bytes: int, *, disk_id: int = 0x6C616231) -> bytes:
    """A 512-byte MBR: one bootable Linux (0x83) partition from 1 MiB to the end of the disk.

    CHS fields hold the "use LBA" filler (0xFE 0xFF 0xFF), as every modern tool writes them.
    """
    sectors = disk_bytes // SECTOR
    if sectors <= FIRST_SECTOR + 1:
        raise ValueError(f"disk of {disk_bytes} bytes is too small for a partition")
    count = sectors - FIRST_SECTOR
    if count > 0xFFFFFFFF:
        raise ValueError("disk too large for an MBR partition table")
    entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", FIRST_SECTOR, count)
    mbr = bytearray(SECTOR)
    struct.pack_into("<I", mbr, 440, disk_id)
    mbr[446 : 446 + 16] = entry
    mbr[510:512] = b"\x55\xaa"
    return bytes(mbr)


@dataclass(frozen=True)
class CpioEntry:
    path: str  # relative, no leading slash
    mode: int  # full st_mode: file type bits included
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)  # major, minor of a device node


def _cpio_header(ino: int, entry: CpioEntry, name: bytes) -> bytes:
    fields = (ino, entry.mode, 0, 0, 1, 0, len(entry.data), 0, 0, *entry.rdev, len(name) + 1, 0)
    return b"070701" + b"".join(b"%08X" % value for value in fields)


def _pad4(length: int) -> bytes:
    return b"\0" * (-length % 4)


def cpio_newc(entries: list[CpioEntry]) -> bytes:
    """A newc ("070701") archive, the format the Linux kernel unpacks as an initramfs."""
    out = bytearray()
    for ino, entry in enumerate([*entries, CpioEntry("TRAILER!!!", 0)], start=1):
        name = entry.path.lstrip("/").encode()
        header = _cpio_header(ino if entry.path != "TRAILER!!!" else 0, entry, name)
        out += header + name + b"\0"
        out += _pad4(len(header) + len(name) + 1)
        out += entry.data + _pad4(len(entry.data))
    return bytes(out)


S_IFDIR = 0o040000
S_IFREG = 0o100000
S_IFCHR = 0o020000


def busybox_initramfs(busybox: bytes, init_script: str) -> bytes:
    """A gzip-compressed initramfs holding a static busybox and an init script."""
    entries = [
        CpioEntry("bin", S_IFDIR | 0o755),
        CpioEntry("dev", S_IFDIR | 0o755),
        # The kernel opens /dev/console for init before anything can mount devtmpfs.
        CpioEntry("dev/console", S_IFCHR | 0o600, rdev=(5, 1)),
        CpioEntry("proc", S_IFDIR | 0o755),
        CpioEntry("sys", S_IFDIR | 0o755),
        CpioEntry("bin/busybox", S_IFREG | 0o755, busybox),
        CpioEntry("init", S_IFREG | 0o755, init_script.encode()),
    ]
    # mtime=0 keeps the archive reproducible.
    return gzip.compress(cpio_newc(entries), compresslevel=6, mtime=0)


XZ_MAGIC = b"\xfd7zXZ\x00"
ELF_MAGIC = b"\x7fELF"


def uncompressed_kernel(bzimage: bytes) -> bytes:
    """The ELF kernel (vmlinux) inside an XZ-compressed bzImage, as Debian builds them.

    QEMU boots an ELF vmlinux through its PVH entry point, with no decompressor. Under TCG the
    decompressor dominates a kernel's start: 9-11 s of XZ before the first message at one level of
    emulation (measured on this 2-core machine: bzImage 16.6 s to init, vmlinux 8.6 s), and a
    nested guest pays it at two levels. Python's lzma reads the payload; the stream ends before
    the bzImage's trailer, which the decompressor object leaves unread.
    """
    start = bzimage.find(XZ_MAGIC)
    if start < 0:
        raise ValueError("no XZ-compressed payload in the kernel image (is it a bzImage built with CONFIG_KERNEL_XZ?)")
    try:
        kernel = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
    except lzma.LZMAError as error:
        raise ValueError(f"the kernel image's XZ payload is corrupt: {error}") from error
    if not kernel.startswith(ELF_MAGIC):
        raise ValueError("the kernel image's XZ payload is not an ELF kernel")
    return kernel
