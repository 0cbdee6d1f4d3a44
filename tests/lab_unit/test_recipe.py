"""Image recipes and their hash, and the byte formats the image build writes itself."""

from __future__ import annotations

import dataclasses
import gzip
import lzma
import struct
import threading
from pathlib import Path

import pytest
import yaml

from gpuhost.lab import diskimage, fake_nvidia
from gpuhost.lab.boot import BIOS_GRUB, DiskLayout
from gpuhost.lab.builder import _Builder
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.recipe import (
    BASE_PACKAGES,
    GUEST_SPEED_OPTIONS,
    NESTED_GUEST_DIR,
    NESTED_GUEST_INIT,
    NESTED_PACKAGES,
    STALL_MODULE_SOURCE,
    VARIANTS,
    mirror_from_sources,
    recipe_for,
    recipe_hash,
)


def test_recipe_hash_is_stable_and_short() -> None:
    assert recipe_hash(recipe_for("base")) == recipe_hash(recipe_for("base"))
    assert len(recipe_hash(recipe_for("base"))) == 16


def test_any_change_to_the_recipe_changes_the_hash() -> None:
    base = recipe_for("base")
    changed = [
        dataclasses.replace(base, packages=(*base.packages, "vim-tiny")),
        dataclasses.replace(base, kernel_cmdline=base.kernel_cmdline + " quiet"),
        dataclasses.replace(base, files=(*base.files[:-1], ("/etc/fstab", 0o644, "changed\n"))),
        dataclasses.replace(base, steps_version=base.steps_version + 1),
        dataclasses.replace(base, disk_size_gib=base.disk_size_gib + 1),
    ]
    hashes = {recipe_hash(recipe) for recipe in changed}
    assert recipe_hash(base) not in hashes and len(hashes) == len(changed)


def test_variants_differ_and_nested_adds_its_packages_and_guest() -> None:
    base, nested = recipe_for("base"), recipe_for("nested")
    assert recipe_hash(base) != recipe_hash(nested)
    assert nested.packages == base.packages == BASE_PACKAGES
    assert nested.apt_packages == NESTED_PACKAGES and base.apt_packages == ()
    assert "/opt/gpuhost/nested-guest/init" in {path for path, _, _ in nested.files}
    assert "/opt/gpuhost/nested-guest/init" not in {path for path, _, _ in base.files}
    with pytest.raises(ValueError):
        recipe_for("huge")


def test_base_recipe_has_what_the_issue_asks_for() -> None:
    base = recipe_for("base")
    for package in ("openssh-server", "linux-image-amd64", "grub-pc", "initramfs-tools", "python3", "pciutils"):
        assert package in base.packages
    files = {path: content for path, _, content in base.files}
    initramfs = files["/etc/initramfs-tools/conf.d/gpuhost-lab.conf"]
    assert "MODULES=list" in initramfs and "COMPRESSLEVEL=1" in initramfs
    disk_modules = files["/etc/initramfs-tools/modules"].split("\n")[1:5]
    assert disk_modules == ["virtio_pci", "virtio_blk", "ext4", "crc32c_generic"]
    sshd = files["/etc/ssh/sshd_config.d/gpuhost-lab.conf"]
    assert "PermitRootLogin prohibit-password" in sshd and "PasswordAuthentication no" in sshd
    assert "{root_uuid}" in files["/etc/fstab"]


def test_mirror_is_read_from_deb822_and_one_line_sources() -> None:
    deb822 = "Types: deb\n# http://snapshot.debian.org/x\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
    one_line = "deb [arch=amd64 signed-by=/k.gpg] https://ftp.example.org/debian bookworm main\n"
    other = "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
    assert mirror_from_sources([other, deb822]) == "http://mirror.example/debian"
    assert mirror_from_sources([one_line]) == "https://ftp.example.org/debian"
    assert mirror_from_sources([other]) is None


def test_mbr_has_one_bootable_linux_partition_from_1_mib_to_the_end() -> None:
    size = 8 * 1024**3
    mbr = diskimage.mbr_with_one_partition(size)
    assert len(mbr) == 512 and mbr[510:] == b"\x55\xaa"
    status, _, kind, _, first, count = struct.unpack("<B3sB3sII", mbr[446:462])
    assert (status, kind, first) == (0x80, 0x83, 2048)
    assert (first + count) * 512 == size
    assert mbr[462:510] == bytes(48)  # no other partitions


def _parse_newc(data: bytes) -> dict[str, tuple[int, bytes, tuple[int, int]]]:
    entries = {}
    offset = 0
    while True:
        header = data[offset : offset + 110]
        assert header[:6] == b"070701"
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_start = offset + 110
        name = data[name_start : name_start + namesize - 1].decode()
        data_start = name_start + namesize + (-(110 + namesize) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = (mode, data[data_start : data_start + size], (fields[9], fields[10]))
        offset = data_start + size + (-size % 4)


def test_busybox_initramfs_is_a_newc_archive_with_init_busybox_and_console() -> None:
    archive = gzip.decompress(diskimage.busybox_initramfs(b"\x7fELFbusybox", NESTED_GUEST_INIT))
    entries = _parse_newc(archive)
    assert entries["init"][1].decode() == NESTED_GUEST_INIT
    assert entries["init"][0] == 0o100755
    assert entries["bin/busybox"][1] == b"\x7fELFbusybox"
    assert entries["dev/console"][0] == 0o020600 and entries["dev/console"][2] == (5, 1)


def test_busybox_initramfs_is_reproducible() -> None:
    one = diskimage.busybox_initramfs(b"x", "#!/bin/sh\n")
    assert one == diskimage.busybox_initramfs(b"x", "#!/bin/sh\n")


def test_the_uncompressed_kernel_is_the_xz_payload_of_the_bzimage() -> None:
    """A bzImage is setup code, the decompressor, the XZ payload and a trailer (its size word)."""
    elf = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 64
    payload = lzma.compress(elf, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
    bzimage = b"MZ setup and decompressor " * 100 + payload + (len(elf)).to_bytes(4, "little")
    assert diskimage.uncompressed_kernel(bzimage) == elf


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (b"MZ a gzip kernel \x1f\x8b\x08", "no XZ-compressed payload"),
        (b"MZ" + diskimage.XZ_MAGIC + b"\x00\x04garbage", "corrupt"),
        (b"MZ" + lzma.compress(b"#!/bin/sh not a kernel", format=lzma.FORMAT_XZ), "not an ELF kernel"),
    ],
)
def test_a_kernel_image_without_an_xz_elf_payload_is_refused(image: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        diskimage.uncompressed_kernel(image)


def test_molecules_passthrough_proof_boots_what_the_nested_image_holds() -> None:
    """Molecule's verify (playbooks/molecule/default) starts the nested variant's tiny guest by path:
    the recipe's, which YAML cannot import."""
    scenario = Path(__file__).resolve().parents[2] / "playbooks/molecule/default"
    variables = yaml.safe_load((scenario / "vars/main.yml").read_text())
    vm = variables["gpuhost_molecule_proof_vm"]
    assert vm["kernel"] == f"{NESTED_GUEST_DIR}/vmlinux" and vm["initrd"] == f"{NESTED_GUEST_DIR}/initrd.gz"
    assert GUEST_SPEED_OPTIONS in vm["cmdline"].split()
    assert variables["gpuhost_molecule_hosts"]["pair-1"]["variant"] == "nested"
    assert fake_nvidia.CALLS_FILE in (scenario / "verify.yml").read_text()


def test_image_builds_take_the_package_cache_one_at_a_time(tmp_path: Path) -> None:
    """Two builds of different variants at once (both lab workers on a fresh machine) broke each
    other's debootstrap downloads in the shared cache; the second one now waits for the first."""
    paths = LabPaths(root=tmp_path / "lab", images=tmp_path / "images")
    paths.package_cache.mkdir(parents=True)
    said: list[str] = []
    first = _Builder(paths, "base", BIOS_GRUB.layout, "http://deb.debian.org/debian", said.append)
    second = _Builder(paths, "guest", BIOS_GRUB.layout, "http://deb.debian.org/debian", said.append)
    order: list[str] = []
    with first._package_cache_held():

        def take() -> None:
            with second._package_cache_held():
                order.append("second")

        waiter = threading.Thread(target=take)
        waiter.start()
        waiter.join(timeout=1)
        assert waiter.is_alive() and order == [], "the second build did not wait for the cache"
        order.append("first done")
    waiter.join(timeout=5)
    assert order == ["first done", "second"]
    assert said == ["another image build is using the package cache; waiting for it"]


def test_the_stall_module_is_built_into_the_base_images_of_the_two_boot_loaders_whose_stalls_are_tested() -> None:
    source = STALL_MODULE_SOURCE.read_text()
    assert "module_init(gpuhost_stall_init)" in source
    carrying = {(v, layout) for v in VARIANTS for layout in DiskLayout if recipe_for(v, layout).stall_module_source}
    assert carrying == {("base", DiskLayout.BIOS_GRUB), ("base", DiskLayout.EFI_SYSTEMD_BOOT)}
    for layout in carrying:
        assert recipe_for(*layout).stall_module_source == source
    # The module's source names the image: a change to it builds the image again.
    base = recipe_for("base")
    assert recipe_hash(dataclasses.replace(base, stall_module_source=source + "\n")) != recipe_hash(base)
    # Images without it keep the names they had before the field existed.
    nested = recipe_for("nested")
    assert recipe_hash(nested) == recipe_hash(dataclasses.replace(nested, stall_module_source=""))
