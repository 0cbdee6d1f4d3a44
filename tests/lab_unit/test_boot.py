"""Lab hosts that boot by UEFI (with or without Secure Boot) or systemd-boot: the firmware and
loader choice, the GPT disk the image build writes, the recipes and the QEMU command line."""

from __future__ import annotations

import struct
import uuid
import zlib
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from gpuhost.errors import InputError
from gpuhost.lab import diskimage
from gpuhost.lab.boot import BIOS_GRUB, FIRMWARE_CHOICES, DiskLayout, Loader, boot_mode
from gpuhost.lab.recipe import (
    BASE_PACKAGES,
    EFI_GRUB_GFXPAYLOAD,
    EFI_GRUB_PACKAGES,
    FSTAB_EFI,
    KERNEL_CMDLINE,
    VARIANTS,
    recipe_for,
    recipe_hash,
)
from gpuhost.lab.topology import qemu_argv
from tests.lab_unit.test_topology import spec

MIB = 1024**2
GIB = 1024**3


def option_values(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == name]


# ---------------------------------------------------------------- firmware and loader choice


def test_boot_modes_and_their_disks() -> None:
    assert boot_mode("bios", "grub") == BIOS_GRUB and BIOS_GRUB.layout is DiskLayout.BIOS_GRUB
    assert boot_mode("uefi", "grub").layout is DiskLayout.EFI_SHIM_GRUB
    # Secure Boot boots the very same disk: shim, GRUB and kernel are all signed.
    assert boot_mode("uefi-secureboot", "grub").layout is DiskLayout.EFI_SHIM_GRUB
    assert boot_mode("uefi", "systemd-boot").layout is DiskLayout.EFI_SYSTEMD_BOOT
    assert BIOS_GRUB.ovmf is None
    secure = boot_mode("uefi-secureboot", "grub").ovmf
    assert secure is not None and secure.needs_smm
    assert secure.code.name == "OVMF_CODE_4M.ms.fd" and secure.vars_template.name == "OVMF_VARS_4M.ms.fd"


@pytest.mark.parametrize(
    ("firmware", "loader", "says"),
    [
        ("bios", "systemd-boot", "needs UEFI firmware"),
        ("uefi-secureboot", "systemd-boot", "not signed"),
        ("coreboot", "grub", "firmware is one of bios, uefi, uefi-secureboot"),
        ("uefi", "lilo", "boot one of grub, systemd-boot"),
    ],
)
def test_combinations_the_lab_cannot_boot_are_refused(firmware: str, loader: str, says: str) -> None:
    with pytest.raises(InputError, match=says):
        boot_mode(firmware, loader)


def test_lab_up_refuses_an_unknown_firmware_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:  # argparse's choices: usage and exit status 2
        main(["lab", "up", "--lab-dir", str(tmp_path), "--firmware", "coreboot"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--firmware: invalid choice: 'coreboot'" in err and "Traceback" not in err
    assert not (tmp_path / "state.json").exists()


def test_lab_up_refuses_systemd_boot_under_secure_boot_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["lab", "up", "--lab-dir", str(tmp_path), "--firmware", "uefi-secureboot", "--boot", "systemd-boot"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--firmware uefi --boot systemd-boot" in err and "Traceback" not in err
    assert not (tmp_path / "state.json").exists()


# ---------------------------------------------------------------- the GPT disk


def test_gpt_disk_has_an_esp_and_a_root_with_valid_checksums() -> None:
    size = 8 * GIB
    sectors = size // 512
    guids = [uuid.UUID(int=n) for n in (1, 2, 3)]
    disk = diskimage.gpt_with_esp_and_root(size, 256 * MIB, disk_guid=guids[0], esp_guid=guids[1], root_guid=guids[2])
    assert disk.esp.offset == 1 * MIB and disk.esp.size == 256 * MIB
    assert disk.root.offset == 257 * MIB and disk.root.last_lba == sectors - 34
    head, tail = disk.head, disk.tail
    assert len(head) == 34 * 512 and len(tail) == 33 * 512
    # Protective MBR: one 0xEE partition from LBA 1, and the boot signature.
    assert head[446 + 4] == 0xEE and struct.unpack_from("<I", head, 446 + 8)[0] == 1
    assert head[510:512] == b"\x55\xaa"
    header = head[512 : 512 + 92]
    assert header[:8] == b"EFI PART"
    (crc,) = struct.unpack_from("<I", header, 16)
    assert zlib.crc32(header[:16] + b"\0\0\0\0" + header[20:]) == crc
    my_lba, other_lba, first_usable, last_usable = struct.unpack_from("<QQQQ", header, 24)
    assert (my_lba, other_lba, first_usable, last_usable) == (1, sectors - 1, 34, sectors - 34)
    entries = head[1024:]
    assert zlib.crc32(entries) == struct.unpack_from("<I", header, 88)[0]
    assert uuid.UUID(bytes_le=entries[:16]) == diskimage.ESP_TYPE
    assert uuid.UUID(bytes_le=entries[128:144]) == diskimage.LINUX_FS_TYPE
    # The backup: the same entries, then a header that points back at LBA 1.
    assert tail[: len(entries)] == entries
    backup = tail[-512:][:92]
    assert struct.unpack_from("<QQ", backup, 24) == (sectors - 1, 1)
    assert struct.unpack_from("<Q", backup, 72)[0] == sectors - 33


def test_gpt_refuses_a_disk_too_small_for_both_partitions() -> None:
    with pytest.raises(ValueError, match="too small"):
        diskimage.gpt_with_esp_and_root(
            200 * MIB, 256 * MIB, disk_guid=uuid.uuid4(), esp_guid=uuid.uuid4(), root_guid=uuid.uuid4()
        )


# ---------------------------------------------------------------- recipes


def test_bios_recipes_hash_as_before_uefi_existed() -> None:
    # The hashes of the cached images (their directories are named so): adding UEFI layouts must not
    # re-key them. A deliberate recipe change updates this list (nested: the PVH vmlinux guest; all:
    # MODULES=list with the disk's modules in /etc/initramfs-tools/modules; guest: qemu-guest-agent;
    # base: the stall module built in the image).
    assert [recipe_hash(recipe_for(v)) for v in VARIANTS] == [
        "01c058860c8ae3f1",
        "64be5c54a5367115",
        "a8680372ff06de2b",
    ]


def test_uefi_recipes_replace_grub_pc_and_differ_per_loader() -> None:
    grub = recipe_for("base", DiskLayout.EFI_SHIM_GRUB)
    sdboot = recipe_for("base", DiskLayout.EFI_SYSTEMD_BOOT)
    assert len({recipe_hash(recipe_for("base")), recipe_hash(grub), recipe_hash(sdboot)}) == 3
    for efi in (grub, sdboot):
        assert "grub-pc" not in efi.packages and set(efi.packages) < set(BASE_PACKAGES)
        assert dict((path, text) for path, _, text in efi.files)["/etc/fstab"] == FSTAB_EFI
        assert efi.kernel_cmdline == KERNEL_CMDLINE  # mitigations=off and the serial console stay
    assert set(EFI_GRUB_PACKAGES) <= set(grub.apt_packages) and "shim-signed" in grub.apt_packages
    assert "mokutil" in grub.apt_packages
    files = {path: text for path, _, text in sdboot.files}
    assert "/etc/default/grub" not in files and "systemd-boot" in sdboot.apt_packages
    assert files["/etc/kernel/cmdline"] == "root=UUID={root_uuid} ro " + KERNEL_CMDLINE + "\n"


def test_only_the_uefi_grub_disk_sets_a_video_mode_for_the_kernel() -> None:
    # Taller than GRUB's bochs driver sets (1200 lines), so that GRUB's cirrus driver, the BMC
    # display's, sets it (see recipe.EFI_GRUB_GFXPAYLOAD); under BIOS GRUB boots in text mode.
    width, height, depth = (int(n) for n in EFI_GRUB_GFXPAYLOAD.split("x"))
    assert height > 1200 and width % 8 == 0 and width * height * depth // 8 <= 4 << 20
    grub = {path: text for path, _, text in recipe_for("base", DiskLayout.EFI_SHIM_GRUB).files}
    assert grub["/etc/default/grub"].splitlines()[-1] == f"GRUB_GFXPAYLOAD_LINUX={EFI_GRUB_GFXPAYLOAD}"
    bios = {path: text for path, _, text in recipe_for("base").files}
    assert "GFXPAYLOAD" not in bios["/etc/default/grub"]


# ---------------------------------------------------------------- QEMU


def test_bios_argv_has_no_firmware_drives() -> None:
    argv = qemu_argv(spec())
    assert not [d for d in option_values(argv, "-drive") if "pflash" in d]
    assert "-global" not in argv


def test_uefi_argv_maps_ovmf_code_read_only_and_the_hosts_own_variables() -> None:
    argv = qemu_argv(spec(boot=boot_mode("uefi", "grub"), efi_vars=Path("/lab/overlays/lab-1-efivars.fd")))
    assert option_values(argv, "-machine") == ["q35,kernel-irqchip=split"]
    assert [d for d in option_values(argv, "-drive") if "pflash" in d] == [
        "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
        "if=pflash,format=raw,unit=1,file=/lab/overlays/lab-1-efivars.fd",
    ]


def test_secure_boot_argv_turns_on_smm_and_secure_flash() -> None:
    argv = qemu_argv(spec(boot=boot_mode("uefi-secureboot", "grub"), efi_vars=Path("/lab/o/lab-1-efivars.fd")))
    assert option_values(argv, "-machine") == ["q35,kernel-irqchip=split,smm=on"]
    assert option_values(argv, "-global") == ["driver=cfi.pflash01,property=secure,value=on"]
    assert "file=/usr/share/OVMF/OVMF_CODE_4M.ms.fd" in " ".join(option_values(argv, "-drive"))
    # The BMC display stays on the root bus, before the stand-in GPU: the firmware's console.
    devices = option_values(argv, "-device")
    assert devices.index("cirrus-vga,id=bmc,bus=pcie.0,addr=0x2") < next(
        i for i, d in enumerate(devices) if d.startswith("VGA,")
    )


def test_a_uefi_host_without_its_variable_store_is_refused() -> None:
    with pytest.raises(ValueError, match="EFI variable store"):
        qemu_argv(spec(boot=boot_mode("uefi", "grub")))
    with pytest.raises(ValueError, match="EFI variable store"):
        qemu_argv(spec(efi_vars=Path("/lab/x.fd")))


def test_firmware_choices_and_loader_values_are_the_cli_words() -> None:
    assert list(FIRMWARE_CHOICES) == ["bios", "uefi", "uefi-secureboot"]
    assert [b.value for b in Loader] == ["grub", "systemd-boot"]
    assert [boot_mode(name).firmware_option for name in FIRMWARE_CHOICES] == list(FIRMWARE_CHOICES)
