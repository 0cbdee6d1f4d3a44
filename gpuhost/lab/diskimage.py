"""Byte-level formats the image build writes itself: MBR and GPT partition tables, a newc cpio;
and the one it reads: the kernel inside a bzImage.

Written here rather than by sfdisk and cpio so that the build needs fewer host programs and so
that both are tested as pure functions.
"""

from __future__ import annotations

import gzip
import lzma
import struct
import uuid
import zlib
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


# GPT (UEFI specification, chapter 5): a protective MBR, the header at LBA 1 and 128 entries of
# 128 bytes from LBA 2, mirrored at the end of the disk (entries, then the backup header last).
GPT_ENTRIES = 128
GPT_ENTRY_SIZE = 128
GPT_ENTRY_SECTORS = GPT_ENTRIES * GPT_ENTRY_SIZE // SECTOR  # 32
ESP_TYPE = uuid.UUID("c12a7328-f81f-11d2-ba4b-00a0c93ec93b")
LINUX_FS_TYPE = uuid.UUID("0fc63daf-8483-4772-8e79-3d7de47709e4")


@dataclass(frozen=True)
class GptPartition:
    name: str
    type_guid: uuid.UUID
    guid: uuid.UUID
    first_lba: int
    last_lba: int  # inclusive, as GPT stores it

    @property
    def offset(self) -> int:
        return self.first_lba * SECTOR

    @property
    def size(self) -> int:
        return (self.last_lba - self.first_lba + 1) * SECTOR


@dataclass(frozen=True)
class GptDisk:
    head: bytes  # written at offset 0: protective MBR, primary header, entries
    tail: bytes  # written so that it ends at the end of the disk: backup entries and header
    esp: GptPartition
    root: GptPartition


def _gpt_header(
    *, my_lba: int, other_lba: int, entries_lba: int, sectors: int, disk_guid: uuid.UUID, entries_crc: int
) -> bytes:
    def pack(crc: int) -> bytes:
        return struct.pack(
            "<8sIIIIQQQQ16sQIII",
            b"EFI PART",
            0x00010000,
            92,
            crc,
            0,
            my_lba,
            other_lba,
            2 + GPT_ENTRY_SECTORS,
            sectors - 2 - GPT_ENTRY_SECTORS,
            disk_guid.bytes_le,
            entries_lba,
            GPT_ENTRIES,
            GPT_ENTRY_SIZE,
            entries_crc,
        )

    header = pack(zlib.crc32(pack(0)))
    return header + bytes(SECTOR - len(header))


def gpt_with_esp_and_root(
    disk_bytes: int, esp_bytes: int, *, disk_guid: uuid.UUID, esp_guid: uuid.UUID, root_guid: uuid.UUID
) -> GptDisk:
    """A GPT disk: an EFI system partition from 1 MiB, then a Linux root to the last usable sector."""
    sectors = disk_bytes // SECTOR
    esp_first = FIRST_SECTOR
    esp_last = esp_first + esp_bytes // SECTOR - 1
    root_first = esp_last + 1
    last_usable = sectors - 2 - GPT_ENTRY_SECTORS
    if root_first + FIRST_SECTOR > last_usable:
        raise ValueError(f"disk of {disk_bytes} bytes is too small for an ESP of {esp_bytes} bytes and a root")
    esp = GptPartition("EFI system partition", ESP_TYPE, esp_guid, esp_first, esp_last)
    root = GptPartition("gpuhost-lab root", LINUX_FS_TYPE, root_guid, root_first, last_usable)
    entries = bytearray(GPT_ENTRIES * GPT_ENTRY_SIZE)
    for index, part in enumerate((esp, root)):
        struct.pack_into(
            "<16s16sQQQ72s",
            entries,
            index * GPT_ENTRY_SIZE,
            part.type_guid.bytes_le,
            part.guid.bytes_le,
            part.first_lba,
            part.last_lba,
            0,
            part.name.encode("utf-16-le"),
        )
    entries_crc = zlib.crc32(entries)
    protective = bytearray(SECTOR)
    # One partition of type 0xEE covering the disk (capped at what 32 bits can say).
    struct.pack_into(
        "<B3sB3sII", protective, 446, 0, b"\x00\x02\x00", 0xEE, b"\xfe\xff\xff", 1, min(sectors - 1, 0xFFFFFFFF)
    )
    protective[510:512] = b"\x55\xaa"
    primary = _gpt_header(
        my_lba=1, other_lba=sectors - 1, entries_lba=2, sectors=sectors, disk_guid=disk_guid, entries_crc=entries_crc
    )
    backup = _gpt_header(
        my_lba=sectors - 1,
        other_lba=1,
        entries_lba=sectors - 1 - GPT_ENTRY_SECTORS,
        sectors=sectors,
        disk_guid=disk_guid,
        entries_crc=entries_crc,
    )
    return GptDisk(head=bytes(protective) + primary + bytes(entries), tail=bytes(entries) + backup, esp=esp, root=root)


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
