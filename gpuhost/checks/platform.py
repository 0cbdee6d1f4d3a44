"""CPU virtualization, the IOMMU, the kernel command line and the bootloader."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext
from gpuhost.cmdline import AMD_IOMMU, INTEL_IOMMU, IOMMU, PCIE_ACS_OVERRIDE, PENDING_REBOOT_KEYS, with_keys
from gpuhost.facts.model import BootloaderKind
from gpuhost.host_support import unsupported_host
from gpuhost.problems import Problem, Severity, Stage, register

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

HOST_UNSUPPORTED = register(
    "host.unsupported",
    Stage.AUDIT,
    Severity.ERROR,
    "gpuhost does not support the host's architecture, IOMMU or GPU family (the audit's only finding then)",
)
CPU_UNKNOWN = register(
    "cpu.unknown", Stage.AUDIT, Severity.WARNING, "/proc/cpuinfo unreadable: CPU virtualization support unknown"
)
CPU_VIRTUALIZATION = register("cpu.virtualization", Stage.AUDIT, Severity.ERROR, "no vmx/svm in the CPU flags")
IOMMU_FIRMWARE = register(
    "iommu.firmware", Stage.AUDIT, Severity.ERROR, "no DMAR/IVRS ACPI table: VT-d/AMD-Vi off in the firmware"
)
IOMMU_FIRMWARE_UNKNOWN = register(
    "iommu.firmware.unknown",
    Stage.AUDIT,
    Severity.INFO,
    "the ACPI table list is unreadable: firmware IOMMU support unknown",
)
IOMMU_ACTIVE = register(
    "iommu.active",
    Stage.AUDIT,
    None,
    "IOMMU active (info), or no IOMMU groups (error; fix: remove iommu=off, or intel_iommu=on on Intel)",
)
IOMMU_INTERRUPT_REMAPPING = register(
    "iommu.interrupt_remapping", Stage.AUDIT, Severity.WARNING, "the kernel log shows no interrupt remapping"
)
IOMMU_INTERRUPT_REMAPPING_UNKNOWN = register(
    "iommu.interrupt_remapping.unknown",
    Stage.AUDIT,
    Severity.INFO,
    "the kernel log is unreadable: interrupt remapping unknown",
)
CMDLINE_UNKNOWN = register(
    "cmdline.unknown", Stage.AUDIT, Severity.WARNING, "/proc/cmdline unreadable: kernel options unknown"
)
CMDLINE_ACS_OVERRIDE = register(
    "cmdline.acs_override", Stage.AUDIT, Severity.WARNING, "pcie_acs_override is set (not for production)"
)
CMDLINE_PENDING_REBOOT = register(
    "cmdline.pending_reboot",
    Stage.AUDIT,
    Severity.WARNING,
    "GRUB's passthrough options differ from the running kernel's",
)
BOOTLOADER_GRUB_SYNTAX = register(
    "bootloader.grub_syntax", Stage.AUDIT, Severity.ERROR, "/etc/default/grub (or a drop-in) is not valid shell"
)
BOOTLOADER_GRUB_FOUND = register("bootloader", Stage.AUDIT, Severity.INFO, "GRUB, UEFI or BIOS, and its drop-ins")
BOOTLOADER_UNIDENTIFIED = register(
    "bootloader.unknown", Stage.AUDIT, Severity.WARNING, "the bootloader could not be identified"
)
BOOTLOADER_UNSUPPORTED = register(
    "bootloader.unsupported",
    Stage.AUDIT,
    Severity.WARNING,
    "grubby/BLS: gpuhost apply supports GRUB and systemd-boot",
)

_IRQ_REMAPPING_ON = ("enabled irq remapping", "interrupt remapping enabled")
_IRQ_REMAPPING_OFF = (
    "irq remapping was disabled",
    "not enabling interrupt remapping",
    "failed to enable irq remapping",
)


def check_supported(ctx: CheckContext) -> Iterator[Problem]:
    """One error on a host gpuhost does not support (gpuhost.host_support); run_checks then gives no
    other finding, whose advice (VT-x, VT-d, x2APIC, 1 GiB pages) would be for another machine."""
    unsupported = unsupported_host(ctx.facts)
    if unsupported is not None:
        yield ctx.finding(HOST_UNSUPPORTED, ERROR, unsupported.subject, unsupported.message, unsupported.would)


def check_cpu(ctx: CheckContext) -> Iterator[Problem]:
    cpu = ctx.facts.cpu
    if cpu is None:
        yield ctx.unreadable(CPU_UNKNOWN, "CPU", "/proc/cpuinfo", "CPU virtualization support is unknown")
        return
    if cpu.has_virtualization:
        return
    inside_vm = (
        " This host is itself a virtual machine: its hypervisor must expose nested virtualization."
        if (cpu.is_virtual_machine)
        else ""
    )
    yield ctx.finding(
        CPU_VIRTUALIZATION,
        ERROR,
        "CPU",
        f"the CPU flags ({cpu.vendor or 'unknown vendor'}) show neither vmx (Intel VT-x) nor svm (AMD-V), "
        f"so KVM cannot run guests.{inside_vm}",
        "Enable Intel VT-x or AMD SVM in the BIOS/UEFI setup.",
    )


def check_iommu(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    iommu = facts.iommu
    vendor = facts.cpu.vendor if facts.cpu else None
    firmware_name = "AMD-Vi (IVRS)" if vendor == "AuthenticAMD" else "VT-d (DMAR)"
    if iommu.firmware_present is False:
        yield ctx.finding(
            IOMMU_FIRMWARE,
            ERROR,
            "IOMMU",
            f"the firmware publishes no IOMMU table (neither DMAR nor IVRS in the ACPI tables): {firmware_name} is off",
            f"Enable {firmware_name.split(' ')[0]} (IOMMU) in the BIOS/UEFI setup, and 'Above 4G decoding' with it.",
        )
    elif iommu.firmware_present is None:
        yield ctx.finding(
            IOMMU_FIRMWARE_UNKNOWN,
            INFO,
            "IOMMU",
            "the ACPI table list could not be read; firmware IOMMU support unknown",
        )
    if iommu.active:
        yield ctx.finding(
            IOMMU_ACTIVE,
            INFO,
            "IOMMU",
            f"the IOMMU is active: {len(iommu.groups)} IOMMU groups, units {', '.join(iommu.units) or 'unlisted'}",
        )
    else:
        cmdline = facts.cmdline
        amd = vendor == "AuthenticAMD"
        # What turns the IOMMU off on the command line, checked first: the fix is to remove it. AMD-Vi is
        # on by default and amd_iommu= documents no 'on' value; Intel's VT-d needs intel_iommu=on.
        offs = [
            f"{key}={value}"
            for key in (IOMMU.key, AMD_IOMMU.key if amd else INTEL_IOMMU.key)
            for value in (cmdline.values(key) if cmdline is not None else [])
            if value == "off"
        ]
        if offs:
            remedy = f"The kernel command line turns the IOMMU off ({' '.join(offs)}): remove {' and '.join(offs)}."
        elif amd:
            remedy = (
                "AMD-Vi is on by default wherever the firmware has it: enable IOMMU (AMD-Vi) and SVM in the "
                "BIOS/UEFI setup, and check the kernel log for AMD-Vi errors."
            )
        elif iommu.firmware_present and cmdline is not None and not cmdline.has(INTEL_IOMMU.key):
            remedy = (
                "The firmware has an IOMMU but the kernel did not enable it: add intel_iommu=on to the kernel "
                "command line."
            )
        else:
            enable = firmware_name.split(" ")[0]
            remedy = f"Enable {enable} in the firmware, then intel_iommu=on if the kernel still does not."
        yield ctx.finding(
            IOMMU_ACTIVE,
            ERROR,
            "IOMMU",
            "the kernel has no IOMMU groups (/sys/kernel/iommu_groups is empty), so no device can be passed through",
            remedy,
        )
        return
    log = facts.kernel_log
    if log is None:
        yield ctx.finding(
            IOMMU_INTERRUPT_REMAPPING_UNKNOWN,
            INFO,
            "IOMMU",
            "the kernel log could not be read, so interrupt remapping is unknown",
            "Run the audit as root (or a user allowed to read dmesg) to check interrupt remapping.",
        )
    elif log.matching(*_IRQ_REMAPPING_OFF) or not log.matching(*_IRQ_REMAPPING_ON):
        yield ctx.finding(
            IOMMU_INTERRUPT_REMAPPING,
            WARNING,
            "IOMMU",
            "the kernel log does not show interrupt remapping enabled; without it vfio refuses MSI interrupts "
            "unless allow_unsafe_interrupts is set",
            "Enable x2APIC and interrupt remapping in the firmware; do not set allow_unsafe_interrupts in production.",
        )


def check_command_line(ctx: CheckContext) -> Iterator[Problem]:
    cmdline = ctx.facts.cmdline
    if cmdline is None:
        yield ctx.unreadable(CMDLINE_UNKNOWN, "kernel command line", "/proc/cmdline", "the kernel options are unknown")
        return
    if cmdline.has(PCIE_ACS_OVERRIDE.key):
        yield ctx.finding(
            CMDLINE_ACS_OVERRIDE,
            WARNING,
            "kernel command line",
            f"pcie_acs_override={cmdline.value(PCIE_ACS_OVERRIDE.key)} is set: it makes the kernel pretend devices are "
            "isolated when the hardware does not isolate them, so a guest may reach other devices' memory",
            "Not for production: move the GPU to a slot with its own IOMMU group instead, and remove the option.",
        )
    grub_line = ctx.facts.grub.effective
    # Only a GRUB host's next boot takes GRUB's line; elsewhere /etc/default/grub is a leftover
    # (bootloader.cmdline_ignored says so), not a pending change.
    if grub_line is not None and ctx.facts.bootloader.kind is BootloaderKind.GRUB:
        wanted = frozenset(with_keys(grub_line.tokens, PENDING_REBOOT_KEYS))
        running = frozenset(with_keys(cmdline.tokens, PENDING_REBOOT_KEYS))
        if wanted != running:
            missing = sorted(wanted - running)
            extra = sorted(running - wanted)
            detail = []
            if missing:
                detail.append(f"GRUB has {' '.join(missing)} which the running kernel lacks")
            if extra:
                detail.append(f"the running kernel has {' '.join(extra)} which GRUB no longer sets")
            yield ctx.finding(
                CMDLINE_PENDING_REBOOT,
                WARNING,
                "kernel command line",
                "the GRUB configuration and the running kernel disagree: " + "; ".join(detail),
                "Run update-grub (if not done) and reboot to take the GRUB command line into use.",
            )


def check_bootloader(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    loader = facts.bootloader
    if facts.grub.syntax_error:
        yield ctx.finding(
            BOOTLOADER_GRUB_SYNTAX,
            ERROR,
            "/etc/default/grub",
            f"/etc/default/grub (or a drop-in) is not valid shell: {facts.grub.syntax_error}",
            "Fix the file: update-grub sources it with sh and would fail too.",
        )
    if loader.kind == BootloaderKind.GRUB:
        firmware = {True: "UEFI", False: "BIOS", None: "unknown firmware"}[loader.efi]
        yield ctx.finding(
            BOOTLOADER_GRUB_FOUND,
            INFO,
            "bootloader",
            f"GRUB ({firmware}); kernel command line from /etc/default/grub"
            + (f" and {len(facts.grub.dropins)} drop-in(s)" if facts.grub.dropins else ""),
        )
    elif loader.kind == BootloaderKind.UNKNOWN:
        yield ctx.finding(
            BOOTLOADER_UNIDENTIFIED,
            WARNING,
            "bootloader",
            f"the bootloader could not be identified ({loader.evidence})",
            "gpuhost apply edits the kernel command line through GRUB; check how this host boots.",
        )
    elif loader.kind != BootloaderKind.SYSTEMD_BOOT:
        # systemd-boot: the firmware finding names it and the file its command line comes from.
        yield ctx.finding(
            BOOTLOADER_UNSUPPORTED,
            WARNING,
            "bootloader",
            f"the host boots with {loader.kind} ({loader.evidence}); gpuhost apply supports GRUB and systemd-boot",
            f"Set the kernel command line with {loader.update_command} by hand, or convert the host to GRUB.",
        )
