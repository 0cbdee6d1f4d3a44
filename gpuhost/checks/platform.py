"""CPU virtualization, the IOMMU, the kernel command line and the bootloader."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext, Finding, Severity
from gpuhost.facts.model import BOOTLOADER_GRUB, BOOTLOADER_UNKNOWN

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

_IRQ_REMAPPING_ON = ("enabled irq remapping", "interrupt remapping enabled")
_IRQ_REMAPPING_OFF = (
    "irq remapping was disabled",
    "not enabling interrupt remapping",
    "failed to enable irq remapping",
)


def check_cpu(ctx: CheckContext) -> Iterator[Finding]:
    cpu = ctx.facts.cpu
    if cpu is None:
        yield ctx.unreadable("cpu.unknown", "CPU", "/proc/cpuinfo", "CPU virtualization support is unknown")
        return
    if cpu.has_virtualization:
        return
    inside_vm = (
        " This host is itself a virtual machine: its hypervisor must expose nested virtualization."
        if (cpu.is_virtual_machine)
        else ""
    )
    yield ctx.finding(
        "cpu.virtualization",
        ERROR,
        "CPU",
        f"the CPU flags ({cpu.vendor or 'unknown vendor'}) show neither vmx (Intel VT-x) nor svm (AMD-V), "
        f"so KVM cannot run guests.{inside_vm}",
        "Enable Intel VT-x or AMD SVM in the BIOS/UEFI setup.",
    )


def check_iommu(ctx: CheckContext) -> Iterator[Finding]:
    facts = ctx.facts
    iommu = facts.iommu
    vendor = facts.cpu.vendor if facts.cpu else None
    firmware_name = "AMD-Vi (IVRS)" if vendor == "AuthenticAMD" else "VT-d (DMAR)"
    if iommu.firmware_present is False:
        yield ctx.finding(
            "iommu.firmware",
            ERROR,
            "IOMMU",
            f"the firmware publishes no IOMMU table (neither DMAR nor IVRS in the ACPI tables): {firmware_name} is off",
            f"Enable {firmware_name.split(' ')[0]} (IOMMU) in the BIOS/UEFI setup, and 'Above 4G decoding' with it.",
        )
    elif iommu.firmware_present is None:
        yield ctx.finding(
            "iommu.firmware.unknown",
            INFO,
            "IOMMU",
            "the ACPI table list could not be read; firmware IOMMU support unknown",
        )
    if iommu.active:
        yield ctx.finding(
            "iommu.active",
            INFO,
            "IOMMU",
            f"the IOMMU is active: {len(iommu.groups)} IOMMU groups, units {', '.join(iommu.units) or 'unlisted'}",
        )
    else:
        cmdline = facts.cmdline
        flag = "amd_iommu=on" if vendor == "AuthenticAMD" else "intel_iommu=on"
        if iommu.firmware_present and cmdline is not None and not cmdline.has(flag.split("=")[0]):
            remedy = (
                f"The firmware has an IOMMU but the kernel did not enable it: add {flag} to the kernel command line."
            )
        elif cmdline is not None and any(v == "off" for v in cmdline.values(flag.split("=")[0])):
            remedy = f"The kernel command line turns the IOMMU off ({flag.split('=')[0]}=off): remove that option."
        else:
            remedy = f"Enable {firmware_name.split(' ')[0]} in the firmware, then {flag} if the kernel still does not."
        yield ctx.finding(
            "iommu.active",
            ERROR,
            "IOMMU",
            "the kernel has no IOMMU groups (/sys/kernel/iommu_groups is empty), so no device can be passed through",
            remedy,
        )
        return
    log = facts.kernel_log
    if log is None:
        yield ctx.finding(
            "iommu.interrupt_remapping.unknown",
            INFO,
            "IOMMU",
            "the kernel log could not be read, so interrupt remapping is unknown",
            "Run the audit as root (or a user allowed to read dmesg) to check interrupt remapping.",
        )
    elif log.matching(*_IRQ_REMAPPING_OFF) or not log.matching(*_IRQ_REMAPPING_ON):
        yield ctx.finding(
            "iommu.interrupt_remapping",
            WARNING,
            "IOMMU",
            "the kernel log does not show interrupt remapping enabled; without it vfio refuses MSI interrupts "
            "unless allow_unsafe_interrupts is set",
            "Enable x2APIC and interrupt remapping in the firmware; do not set allow_unsafe_interrupts in production.",
        )


def check_command_line(ctx: CheckContext) -> Iterator[Finding]:
    cmdline = ctx.facts.cmdline
    if cmdline is None:
        yield ctx.unreadable(
            "cmdline.unknown", "kernel command line", "/proc/cmdline", "the kernel options are unknown"
        )
        return
    if cmdline.has("pcie_acs_override"):
        yield ctx.finding(
            "cmdline.acs_override",
            WARNING,
            "kernel command line",
            f"pcie_acs_override={cmdline.value('pcie_acs_override')} is set: it makes the kernel pretend devices are "
            "isolated when the hardware does not isolate them, so a guest may reach other devices' memory",
            "Not for production: move the GPU to a slot with its own IOMMU group instead, and remove the option.",
        )
    grub_line = ctx.facts.grub.effective
    if grub_line is not None:
        wanted = _passthrough_options(grub_line.tokens)
        running = _passthrough_options(cmdline.tokens)
        if wanted != running:
            missing = sorted(wanted - running)
            extra = sorted(running - wanted)
            detail = []
            if missing:
                detail.append(f"GRUB has {' '.join(missing)} which the running kernel lacks")
            if extra:
                detail.append(f"the running kernel has {' '.join(extra)} which GRUB no longer sets")
            yield ctx.finding(
                "cmdline.pending_reboot",
                WARNING,
                "kernel command line",
                "the GRUB configuration and the running kernel disagree: " + "; ".join(detail),
                "Run update-grub (if not done) and reboot to take the GRUB command line into use.",
            )


# Options whose difference between GRUB and /proc/cmdline means a reboot is pending.
_PASSTHROUGH_KEYS = (
    "vfio-pci.ids",
    "modprobe.blacklist",
    "iommu",
    "intel_iommu",
    "amd_iommu",
    "hugepages",
    "hugepagesz",
    "default_hugepagesz",
    "pci",
    "pcie_aspm",
    "nomodeset",
    "pcie_acs_override",
    "video",
)


def _passthrough_options(tokens: tuple[str, ...]) -> frozenset[str]:
    return frozenset(token for token in tokens if token.split("=", 1)[0] in _PASSTHROUGH_KEYS)


def check_bootloader(ctx: CheckContext) -> Iterator[Finding]:
    facts = ctx.facts
    loader = facts.bootloader
    if facts.grub.syntax_error:
        yield ctx.finding(
            "bootloader.grub_syntax",
            ERROR,
            "/etc/default/grub",
            f"/etc/default/grub (or a drop-in) is not valid shell: {facts.grub.syntax_error}",
            "Fix the file: update-grub sources it with sh and would fail too.",
        )
    if loader.kind == BOOTLOADER_GRUB:
        firmware = {True: "UEFI", False: "BIOS", None: "unknown firmware"}[loader.efi]
        yield ctx.finding(
            "bootloader",
            INFO,
            "bootloader",
            f"GRUB ({firmware}); kernel command line from /etc/default/grub"
            + (f" and {len(facts.grub.dropins)} drop-in(s)" if facts.grub.dropins else ""),
        )
    elif loader.kind == BOOTLOADER_UNKNOWN:
        yield ctx.finding(
            "bootloader.unknown",
            WARNING,
            "bootloader",
            f"the bootloader could not be identified ({loader.evidence})",
            "gpuhost apply edits the kernel command line through GRUB; check how this host boots.",
        )
    else:
        yield ctx.finding(
            "bootloader.unsupported",
            WARNING,
            "bootloader",
            f"the host boots with {loader.kind} ({loader.evidence}); gpuhost apply supports GRUB only",
            f"Set the kernel command line with {loader.update_command} by hand, or convert the host to GRUB.",
        )
