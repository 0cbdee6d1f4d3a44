"""Firmware facts from real lab captures: UEFI or BIOS, Secure Boot, the ESP, the loader that ran.

tests/fixtures/snapshots/ (all `gpuhost snapshot` of `gpuhost lab up` hosts, gpu-pair topology):
  lab-uefi                              --firmware uefi: OVMF, Secure Boot off, shim + GRUB on the ESP;
                                        taken before the lab's UEFI GRUB disk set a video mode: GRUB's
                                        bochs driver gave the kernel the stand-in GPU's framebuffer
  lab-uefi-secureboot                   --firmware uefi-secureboot: OVMF with Microsoft's keys, enforcing
  lab-uefi-secureboot-unsigned-module   the same host after an unsigned copy of an in-tree module
                                        (dummy.ko with its signature cut off) was put in updates/dkms as
                                        nvidia-stand-in.ko, as DKMS would, and insmod was refused
  lab-gpu-pair-fresh                    the BIOS lab host, captured before the firmware facts existed
  lab-uefi-systemd-boot                 --firmware uefi --boot systemd-boot: OVMF, systemd-boot at the
                                        removable path, kernel-install's entry from /etc/kernel/cmdline
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.facts import parsers as p
from gpuhost.facts.model import ActiveLoader, BootloaderKind, Firmware
from gpuhost.lab.builder import loader_entry_files_missing
from gpuhost.selection import GpuSelector
from tests.helpers import SNAPSHOTS, snapshot_facts

STAND_IN = AuditPolicy(gpus=GpuSelector.parse(["1234:1111"], "test"))


def command(snapshot: str, name: str) -> str:
    return (SNAPSHOTS / snapshot / "commands" / f"{name}.txt").read_text()


def test_secure_boot_variable_is_attributes_then_one_byte() -> None:
    enforcing = p.parse_od_bytes(command("lab-uefi-secureboot", "efivar-SecureBoot"))
    off = p.parse_od_bytes(command("lab-uefi", "efivar-SecureBoot"))
    # Attributes 0x06: boot service and runtime access (read-only to the OS), then the value.
    assert enforcing == b"\x06\x00\x00\x00\x01" and off == b"\x06\x00\x00\x00\x00"
    assert p.parse_efivar_bool(enforcing) is True and p.parse_efivar_bool(off) is False
    # Not a boolean variable: too long, or a value other than 0/1, is unknown rather than a guess.
    assert p.parse_efivar_bool(enforcing + b"\x00") is None and p.parse_efivar_bool(off[:4] + b"\x02") is None
    assert p.parse_efivar_bool(None) is None
    assert p.parse_od_bytes("not od output") is None


def test_out_of_tree_modules_with_and_without_a_signer() -> None:
    (module,) = p.parse_out_of_tree_modules(command("lab-uefi-secureboot-unsigned-module", "out-of-tree-modules"))
    assert module.path == "/lib/modules/6.1.0-50-amd64/updates/dkms/nvidia-stand-in.ko"
    assert module.signer is None and module.name == "nvidia-stand-in"
    assert p.parse_out_of_tree_modules(command("lab-uefi-secureboot", "out-of-tree-modules")) == ()


def test_secure_boot_host_facts() -> None:
    facts = snapshot_facts("lab-uefi-secureboot")
    firmware = facts.firmware
    assert firmware.mode is Firmware.UEFI and firmware.secure_boot is True
    assert firmware.loader is ActiveLoader.SHIM_GRUB and firmware.loader_info is None
    assert firmware.esp == "/boot/efi"
    assert set(firmware.esp_binaries) == {"EFI/BOOT/BOOTX64.EFI", "EFI/BOOT/grubx64.efi", "EFI/BOOT/mmx64.efi"}
    assert firmware.cmdline_source == "/etc/default/grub" and not firmware.proxmox_boot_tool
    assert facts.bootloader.kind is BootloaderKind.GRUB and facts.bootloader.efi is True
    assert firmware.describe() == "UEFI, Secure Boot enabled, shim+grub-efi"
    # Under OVMF the BMC display took efifb, and the stand-in GPU is not the boot display.
    assert facts.function("0000:00:02.0").boot_vga is True and facts.function("0000:01:00.0").boot_vga is False
    assert facts.kernel_log.matching("secureboot: Secure boot enabled")


def test_uefi_host_without_secure_boot_still_runs_shim() -> None:
    firmware = snapshot_facts("lab-uefi").firmware
    assert firmware.mode is Firmware.UEFI and firmware.secure_boot is False
    # Installed at the removable path, shim is BOOTX64.EFI; its MOK manager beside it names it.
    assert firmware.loader is ActiveLoader.SHIM_GRUB
    assert firmware.describe() == "UEFI, Secure Boot disabled, shim+grub-efi"


def test_bios_host_facts_from_a_capture_older_than_the_firmware_facts() -> None:
    firmware = snapshot_facts("lab-gpu-pair-fresh").firmware
    assert firmware.mode is Firmware.BIOS and firmware.secure_boot is False
    assert firmware.loader is ActiveLoader.GRUB_BIOS and firmware.esp is None
    assert firmware.out_of_tree_modules is None  # not listed by that gather script: unknown, not none
    assert firmware.describe() == "BIOS, grub-bios"


def test_audit_reports_firmware_and_the_unsigned_module_under_secure_boot() -> None:
    _, _, findings = run_checks("lab-1", snapshot_facts("lab-uefi-secureboot-unsigned-module"), STAND_IN)
    by_code = {f.code: f for f in findings}
    assert by_code["firmware"].message == (
        "lab-1: UEFI, Secure Boot enabled, shim+grub-efi; ESP /boot/efi; kernel command line from /etc/default/grub"
    )
    unsigned = by_code["firmware.secure_boot.unsigned_module"]
    assert unsigned.severity.value == "warning" and "nvidia-stand-in" in unsigned.message
    assert "mokutil --import" in unsigned.remedy
    _, _, fresh = run_checks("lab-1", snapshot_facts("lab-uefi-secureboot"), STAND_IN)
    assert "firmware.secure_boot.unsigned_module" not in {f.code for f in fresh}
    assert "firmware.unknown" not in {f.code for f in fresh}


def test_efifb_on_the_stand_in_gpu_names_the_bar_it_holds() -> None:
    """Real capture: under OVMF without Secure Boot GRUB handed the kernel the stand-in GPU's
    framebuffer (boot_vga=1), as a server's firmware does with a GPU as its primary display, and the
    kernel gave its BAR 0 to efifb; the finding says so, with the remedy that still works."""
    facts = snapshot_facts("lab-uefi")
    assert facts.kernel_log is not None and facts.kernel_log.firmware_framebuffer_bars("0000:01:00.0") == ("0",)
    _, _, findings = run_checks("lab-1", facts, STAND_IN)
    (display,) = [f for f in findings if f.code == "gpu.boot_display"]
    assert display.subject == "0000:01:00.0" and "BAR 0 assigned to efifb" in display.message, display
    assert "initcall_blacklist=simpledrm" in display.remedy and "efifb:off" not in display.remedy


def test_efifb_on_the_bmc_display_leaves_the_stand_in_gpu_alone() -> None:
    """Real capture: with Secure Boot the kernel's EFI stub took the firmware's console, the BMC's
    display (0000:00:02.0)."""
    facts = snapshot_facts("lab-uefi-secureboot")
    assert facts.kernel_log is not None and facts.kernel_log.firmware_framebuffer_bars("0000:00:02.0") == ("0",)
    _, _, findings = run_checks("lab-1", facts, STAND_IN)
    assert "gpu.boot_display" not in [f.code for f in findings]


SYSTEMD_BOOT_ENTRY = "boot/efi/loader/entries/debian-6.1.0-50-amd64.conf"


def test_systemd_boot_host_facts() -> None:
    facts = snapshot_facts("lab-uefi-systemd-boot")
    firmware = facts.firmware
    assert firmware.mode is Firmware.UEFI and firmware.secure_boot is False
    assert firmware.loader is ActiveLoader.SYSTEMD_BOOT
    assert firmware.loader_info == "systemd-boot 252.39-1~deb12u2"
    assert firmware.loader_entry == "debian-6.1.0-50-amd64.conf"
    assert firmware.esp == "/boot/efi"
    assert set(firmware.esp_binaries) == {"EFI/BOOT/BOOTX64.EFI", "EFI/systemd/systemd-bootx64.efi"}
    assert firmware.cmdline_source == "/etc/kernel/cmdline" and not firmware.proxmox_boot_tool
    assert firmware.kernel_cmdline_file is not None
    # systemd-boot puts initrd= (the entry's initrd, in EFI path form) before the entry's options.
    assert facts.cmdline is not None
    assert facts.cmdline.tokens == (
        "initrd=\\debian\\6.1.0-50-amd64\\initrd.img-6.1.0-50-amd64",
        *firmware.kernel_cmdline_file.tokens,
    )
    assert facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT and facts.bootloader.efi is True
    assert firmware.describe() == "UEFI, Secure Boot disabled, systemd-boot"


def test_kernel_installs_loader_entry_parses_with_paths_relative_to_the_esp() -> None:
    entry = p.parse_loader_entry((SNAPSHOTS / "lab-uefi-systemd-boot" / SYSTEMD_BOOT_ENTRY).read_text())
    assert entry.title == "Debian GNU/Linux 12 (bookworm)" and entry.version == "6.1.0-50-amd64"
    assert entry.linux == "/debian/6.1.0-50-amd64/linux"
    assert entry.initrds == ("/debian/6.1.0-50-amd64/initrd.img-6.1.0-50-amd64",)
    kernel_cmdline = (SNAPSHOTS / "lab-uefi-systemd-boot" / "etc/kernel/cmdline").read_text()
    assert entry.options == p.parse_cmdline(kernel_cmdline)


def test_the_image_build_finds_a_loader_entry_whose_files_are_not_on_the_esp(tmp_path: Path) -> None:
    """The lab image's own check: systemd-boot skips an entry whose kernel it cannot open on the ESP
    (what OVMF showed when kernel-install wrote /boot/efi/debian/... paths)."""
    entry = p.parse_loader_entry((SNAPSHOTS / "lab-uefi-systemd-boot" / SYSTEMD_BOOT_ENTRY).read_text())
    assert loader_entry_files_missing(entry, tmp_path) == (entry.linux, *entry.initrds)
    for path in (entry.linux, *entry.initrds):
        assert path is not None
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_bytes(b"")
    assert loader_entry_files_missing(entry, tmp_path) == ()
    # The same paths below /boot/efi, as kernel-install wrote them with the ESP bound onto itself.
    assert entry.linux is not None
    shifted = dataclasses.replace(entry, linux="/boot/efi" + entry.linux, initrds=())
    assert loader_entry_files_missing(shifted, tmp_path) == ("/boot/efi/debian/6.1.0-50-amd64/linux",)
