"""The firmware and how the host boots: UEFI or BIOS, Secure Boot, the loader and its command line file."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext
from gpuhost.cmdline import IGNORED_FILE_KEYS, with_keys
from gpuhost.facts.model import ActiveLoader, BootloaderKind, Firmware, KernelCommandLine
from gpuhost.problems import Problem, Severity, Stage, register

FIRMWARE = register(
    "firmware", Stage.AUDIT, Severity.INFO, "UEFI or BIOS, Secure Boot, the ESP, the loader and its command line file"
)
FIRMWARE_UNKNOWN = register(
    "firmware.unknown",
    Stage.AUDIT,
    Severity.WARNING,
    "the firmware mode or the Secure Boot state could not be read",
)
SECURE_BOOT_UNSIGNED_MODULE = register(
    "firmware.secure_boot.unsigned_module",
    Stage.AUDIT,
    Severity.WARNING,
    "an unsigned out-of-tree module (e.g. NVIDIA DKMS) that Secure Boot will not let load",
)
CMDLINE_FILE_IGNORED = register(
    "bootloader.cmdline_ignored",
    Stage.AUDIT,
    Severity.WARNING,
    "passthrough options in a file the active boot loader never reads",
)


def check_firmware(ctx: CheckContext) -> Iterator[Problem]:
    firmware = ctx.facts.firmware
    if firmware.mode is None:
        yield ctx.finding(
            FIRMWARE_UNKNOWN,
            Severity.WARNING,
            "firmware",
            "whether the host booted by UEFI or BIOS is unknown (the gather script's existence list is missing), "
            "so Secure Boot and the boot loader are unknown too",
            "Audit the host with this gpuhost's gather script (gpuhost snapshot), as root.",
        )
    elif firmware.mode is Firmware.UEFI and firmware.secure_boot is None:
        yield ctx.finding(
            FIRMWARE_UNKNOWN,
            Severity.WARNING,
            "Secure Boot",
            "the host booted by UEFI but its SecureBoot EFI variable could not be read, so whether only signed "
            "kernel modules load is unknown",
            "Run the audit as root (efivarfs mounted at /sys/firmware/efi/efivars).",
        )
    where = []
    if firmware.esp:
        where.append(f"ESP {firmware.esp}")
    if firmware.proxmox_boot_tool:
        where.append("ESPs synced by proxmox-boot-tool")
    if firmware.loader_entry:
        where.append(f"entry {firmware.loader_entry}")
    if firmware.cmdline_source:
        where.append(f"kernel command line from {firmware.cmdline_source}")
    yield ctx.finding(FIRMWARE, Severity.INFO, "firmware", firmware.describe() + "".join(f"; {w}" for w in where))
    yield from _unsigned_modules(ctx)
    yield from _ignored_cmdline_files(ctx)


def _unsigned_modules(ctx: CheckContext) -> Iterator[Problem]:
    firmware = ctx.facts.firmware
    unsigned = [m for m in firmware.out_of_tree_modules or () if m.signer is None]
    if not unsigned or firmware.secure_boot is False:
        return
    names = ", ".join(sorted({m.name for m in unsigned}))
    state = "is enforcing" if firmware.secure_boot else "may be enforcing (its state is unknown)"
    yield ctx.finding(
        SECURE_BOOT_UNSIGNED_MODULE,
        Severity.WARNING,
        "Secure Boot",
        f"Secure Boot {state} and {len(unsigned)} out-of-tree module(s) are unsigned ({names}: "
        f"{', '.join(m.path for m in unsigned[:3])}{' ...' if len(unsigned) > 3 else ''}); the kernel refuses "
        "to load them (lockdown), so a host driver built by DKMS does not run",
        "vfio-pci is in-tree and signed, so passthrough is unaffected. For a driver the host itself needs: let "
        "DKMS sign it with its MOK key (/var/lib/dkms/mok.pub) and enroll that key with `mokutil --import`, or "
        "remove the driver (gpuhost apply removes a host NVIDIA driver).",
    )


def _ignored_cmdline_files(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    firmware = facts.firmware
    grub_line = facts.grub.effective
    kernel_cmdline = firmware.kernel_cmdline_file
    reads_kernel_cmdline = firmware.proxmox_boot_tool or firmware.loader is ActiveLoader.SYSTEMD_BOOT
    if reads_kernel_cmdline and grub_line is not None:
        yield from _ignored(
            ctx,
            "/etc/default/grub",
            grub_line,
            f"this host boots with {firmware.loader}, which never reads GRUB's configuration",
            "Put the options in /etc/kernel/cmdline and run "
            + (
                "proxmox-boot-tool refresh"
                if firmware.proxmox_boot_tool
                else "kernel-install add (or reinstall the kernel)"
            )
            + "; remove them from /etc/default/grub so that nobody edits the wrong file.",
        )
    grub_reads = facts.bootloader.kind is BootloaderKind.GRUB and not firmware.proxmox_boot_tool
    if grub_reads and kernel_cmdline is not None:
        yield from _ignored(
            ctx,
            "/etc/kernel/cmdline",
            kernel_cmdline,
            f"this host boots with {firmware.loader}, which takes its command line from /etc/default/grub; "
            "/etc/kernel/cmdline is read only by kernel-install for systemd-boot",
            "Put the options in GRUB_CMDLINE_LINUX (a drop-in in /etc/default/grub.d/) and run update-grub.",
        )


def _ignored(ctx: CheckContext, path: str, line: KernelCommandLine, why: str, remedy: str) -> Iterator[Problem]:
    options = with_keys(line.tokens, IGNORED_FILE_KEYS)
    if not options:
        return
    yield ctx.finding(
        CMDLINE_FILE_IGNORED,
        Severity.WARNING,
        path,
        f"{path} sets {' '.join(options)} but {why}: these options do not reach the kernel from there",
        remedy,
    )
