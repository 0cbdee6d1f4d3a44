"""How a lab host boots: its firmware (BIOS, UEFI, UEFI with Secure Boot).

The firmware decides the QEMU command line (SeaBIOS, or OVMF's code and a per-host copy of its
variable store) and the disk (an MBR disk with BIOS GRUB, or a GPT disk with an EFI system
partition holding shim + GRUB). UEFI and UEFI with Secure Boot boot the same disk: Debian's shim,
GRUB and kernel are all signed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from gpuhost.errors import InputError


class Firmware(enum.Enum):
    BIOS = "bios"
    UEFI = "uefi"
    UEFI_SECUREBOOT = "uefi-secureboot"


class DiskLayout(enum.Enum):
    """What the image's disk holds; one cached image per layout and variant."""

    BIOS_GRUB = "bios-grub"  # MBR, one ext4 partition, GRUB in the MBR gap
    EFI_SHIM_GRUB = "efi-shim-grub"  # GPT, ESP with shim + signed GRUB at \\EFI\\BOOT, ext4 root


# Debian 12's `ovmf` package. The Secure Boot build needs SMM; its variable store has Microsoft's
# keys enrolled (PK/KEK/db), so shim (signed by Microsoft's UEFI CA) is trusted and enforcing.
OVMF_DIR = Path("/usr/share/OVMF")


@dataclass(frozen=True)
class OvmfFiles:
    code: Path  # read-only firmware
    vars_template: Path  # copied per host: the firmware writes its variables there
    needs_smm: bool


OVMF_FILES: dict[Firmware, OvmfFiles] = {
    Firmware.UEFI: OvmfFiles(OVMF_DIR / "OVMF_CODE_4M.fd", OVMF_DIR / "OVMF_VARS_4M.fd", needs_smm=False),
    Firmware.UEFI_SECUREBOOT: OvmfFiles(
        OVMF_DIR / "OVMF_CODE_4M.ms.fd", OVMF_DIR / "OVMF_VARS_4M.ms.fd", needs_smm=True
    ),
}


@dataclass(frozen=True)
class BootMode:
    firmware: Firmware

    @property
    def layout(self) -> DiskLayout:
        return DiskLayout.BIOS_GRUB if self.firmware is Firmware.BIOS else DiskLayout.EFI_SHIM_GRUB

    @property
    def ovmf(self) -> OvmfFiles | None:
        return OVMF_FILES.get(self.firmware)

    def describe(self) -> str:
        return f"{self.firmware.value} + grub"


BIOS_GRUB = BootMode(Firmware.BIOS)


def boot_mode(firmware: str) -> BootMode:
    """The boot mode for `lab up --firmware F`."""
    try:
        return BootMode(Firmware(firmware))
    except ValueError as error:
        raise InputError(
            f"unknown --firmware {firmware}; it is one of {', '.join(f.value for f in Firmware)}"
        ) from error
