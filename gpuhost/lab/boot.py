"""How a lab host boots: its firmware (BIOS, UEFI, UEFI with Secure Boot) and its boot loader.

The firmware decides the QEMU command line (SeaBIOS, or OVMF's code and a per-host copy of its
variable store); the firmware kind and the loader together decide the disk (an MBR disk with BIOS
GRUB, or a GPT disk with an EFI system partition holding shim + GRUB or systemd-boot). UEFI and
UEFI with Secure Boot boot the same disk: Debian's shim, GRUB and kernel are all signed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from gpuhost.errors import InputError
from gpuhost.facts.model import Firmware

# `lab up --firmware`'s values: the firmware, and for UEFI whether it enforces Secure Boot.
FIRMWARE_CHOICES: dict[str, tuple[Firmware, bool]] = {
    "bios": (Firmware.BIOS, False),
    "uefi": (Firmware.UEFI, False),
    "uefi-secureboot": (Firmware.UEFI, True),
}


class Loader(enum.Enum):
    GRUB = "grub"
    SYSTEMD_BOOT = "systemd-boot"


class DiskLayout(enum.Enum):
    """What the image's disk holds; one cached image per layout and variant."""

    BIOS_GRUB = "bios-grub"  # MBR, one ext4 partition, GRUB in the MBR gap
    EFI_SHIM_GRUB = "efi-shim-grub"  # GPT, ESP with shim + signed GRUB at \EFI\BOOT, ext4 root
    EFI_SYSTEMD_BOOT = "efi-systemd-boot"  # GPT, ESP with systemd-boot and kernel-install's entries


# Debian 12's `ovmf` package. The Secure Boot build needs SMM; its variable store has Microsoft's
# keys enrolled (PK/KEK/db), so shim (signed by Microsoft's UEFI CA) is trusted and enforcing.
OVMF_DIR = Path("/usr/share/OVMF")


@dataclass(frozen=True)
class OvmfFiles:
    code: Path  # read-only firmware
    vars_template: Path  # copied per host: the firmware writes its variables there
    needs_smm: bool


OVMF = OvmfFiles(OVMF_DIR / "OVMF_CODE_4M.fd", OVMF_DIR / "OVMF_VARS_4M.fd", needs_smm=False)
OVMF_SECURE_BOOT = OvmfFiles(OVMF_DIR / "OVMF_CODE_4M.ms.fd", OVMF_DIR / "OVMF_VARS_4M.ms.fd", needs_smm=True)


@dataclass(frozen=True)
class BootMode:
    firmware: Firmware
    loader: Loader
    secure_boot: bool = False  # UEFI only: OVMF enforcing Secure Boot with Microsoft's keys enrolled

    @property
    def layout(self) -> DiskLayout:
        if self.firmware is Firmware.BIOS:
            return DiskLayout.BIOS_GRUB
        return DiskLayout.EFI_SYSTEMD_BOOT if self.loader is Loader.SYSTEMD_BOOT else DiskLayout.EFI_SHIM_GRUB

    @property
    def ovmf(self) -> OvmfFiles | None:
        if self.firmware is Firmware.BIOS:
            return None
        return OVMF_SECURE_BOOT if self.secure_boot else OVMF

    @property
    def firmware_option(self) -> str:
        """This mode's `--firmware` value (bios, uefi, uefi-secureboot)."""
        return next(name for name, choice in FIRMWARE_CHOICES.items() if choice == (self.firmware, self.secure_boot))

    def describe(self) -> str:
        return f"{self.firmware_option} + {self.loader.value}"


BIOS_GRUB = BootMode(Firmware.BIOS, Loader.GRUB)


def boot_mode(firmware: str, loader: str = "grub") -> BootMode:
    """The boot mode for `lab up --firmware F --boot L`; refuses combinations the lab cannot boot."""
    try:
        kind, secure_boot = FIRMWARE_CHOICES[firmware]
        chosen = BootMode(kind, Loader(loader), secure_boot)
    except (KeyError, ValueError) as error:
        raise InputError(
            f"unknown boot mode --firmware {firmware} --boot {loader}; firmware is one of "
            f"{', '.join(FIRMWARE_CHOICES)} and boot one of {', '.join(b.value for b in Loader)}"
        ) from error
    if chosen.loader is Loader.SYSTEMD_BOOT and chosen.firmware is Firmware.BIOS:
        raise InputError("--boot systemd-boot needs UEFI firmware: use --firmware uefi (systemd-boot is EFI only)")
    if chosen.loader is Loader.SYSTEMD_BOOT and chosen.secure_boot:
        raise InputError(
            "--boot systemd-boot with --firmware uefi-secureboot is not supported: Debian 12's "
            "systemd-boot is not signed, so Secure Boot would refuse it. Use --firmware uefi "
            "--boot systemd-boot, or --firmware uefi-secureboot --boot grub (signed shim and GRUB)"
        )
    return chosen
