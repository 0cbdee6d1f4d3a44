"""Whether the platform can be planned at all: the OS, the boot loader and its tools, the IOMMU, vfio-pci."""

from __future__ import annotations

import re
from collections.abc import Callable

from gpuhost.facts.model import BootloaderKind, HostFacts, VfioPci
from gpuhost.host_support import unsupported_host
from gpuhost.plan.model import KERNEL_CMDLINE_PATH, KernelCmdlineWriter
from gpuhost.problems import Severity, Stage, register

# Refusal codes: two words (gpuhost.inventory.plan_settings validates GPUHOST_TESTING_ONLY_FORCE_PAST_REFUSALS so).
REFUSE_HOST_UNSUPPORTED = register(
    "plan.host.unsupported",
    Stage.PLAN,
    Severity.ERROR,
    "gpuhost does not support the host's architecture, IOMMU or GPU family (the plan's only refusal then)",
)

REFUSE_BOOTLOADER_NOT_GRUB = register(
    "plan.bootloader.not_grub",
    Stage.PLAN,
    Severity.ERROR,
    "the host boots with grubby/BLS or an unknown loader: apply supports GRUB and systemd-boot",
)

REFUSE_NO_KERNEL_INSTALL = register(
    "plan.bootloader.no_kernel_install",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot without kernel-install or proxmox-boot-tool to write its entries",
)

REFUSE_OS_UNSUPPORTED = register(
    "plan.os.unsupported", Stage.PLAN, Severity.ERROR, "not Debian or Ubuntu (update-grub, initramfs-tools, apt)"
)

REFUSE_NO_UPDATE_GRUB = register(
    "plan.bootloader.no_update_grub", Stage.PLAN, Severity.ERROR, "GRUB without update-grub"
)

REFUSE_GRUB_SYNTAX = register(
    "plan.grub.syntax", Stage.PLAN, Severity.ERROR, "/etc/default/grub (or a drop-in) is not valid shell"
)

REFUSE_GRUB_UNREADABLE = register(
    "plan.grub.unreadable", Stage.PLAN, Severity.ERROR, "the GRUB command line could not be read (not root)"
)

REFUSE_IOMMU_ABSENT = register(
    "plan.iommu.absent",
    Stage.PLAN,
    Severity.ERROR,
    "no DMAR/IVRS ACPI table and no IOMMU groups: the IOMMU is off in the firmware",
)

REFUSE_VFIO_ABSENT = register("plan.vfio.absent", Stage.PLAN, Severity.ERROR, "the kernel has no vfio-pci")

REFUSE_NO_KERNEL_CMDLINE = register(
    "plan.bootloader.no_kernel_cmdline",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot without /etc/kernel/cmdline (nothing of the host's own to change and restore)",
)

_SUPPORTED_OS = re.compile(r"\b(debian|ubuntu)\b", re.IGNORECASE)

Refuse = Callable[[str, str, str, str], None]  # plan_host's `refuse(code, subject, message, fix)`


def check_platform(facts: HostFacts, refuse: Refuse) -> None:
    """Refuse what the platform cannot have planned: a host gpuhost does not support with that alone
    (its boot loader, OS and IOMMU are not asked about)."""
    unsupported = unsupported_host(facts)
    if unsupported is not None:
        refuse(REFUSE_HOST_UNSUPPORTED, unsupported.subject, f"{unsupported.message}.", unsupported.would)
        return
    loader = facts.bootloader
    if loader.kind not in (BootloaderKind.GRUB, BootloaderKind.SYSTEMD_BOOT):
        refuse(
            REFUSE_BOOTLOADER_NOT_GRUB,
            "bootloader",
            f"the host boots with {loader.kind} ({loader.evidence}); gpuhost apply supports GRUB and systemd-boot "
            "on Debian and Ubuntu only so far.",
            f"Set the kernel command line by hand ({loader.update_command or 'the bootloader tool'}) with the options "
            "`gpuhost plan` prints, or convert the host to GRUB.",
        )
    elif not facts.os_pretty_name or not _SUPPORTED_OS.search(facts.os_pretty_name):
        refuse(
            REFUSE_OS_UNSUPPORTED,
            "operating system",
            f"the host runs {facts.os_pretty_name or 'an unknown OS'}; gpuhost apply supports Debian and Ubuntu "
            "(update-grub, initramfs-tools, apt).",
            "Configure this host by hand with the options `gpuhost plan` prints.",
        )
    elif loader.kind is BootloaderKind.SYSTEMD_BOOT:
        if facts.firmware.kernel_cmdline_file is None:
            refuse(
                REFUSE_NO_KERNEL_CMDLINE,
                KERNEL_CMDLINE_PATH,
                f"the host boots with systemd-boot but has no {KERNEL_CMDLINE_PATH} (kernel-install then copies the "
                "running /proc/cmdline into every entry): there is no file of the host's own to change and to "
                "restore on rollback.",
                f"Write the host's kernel command line to {KERNEL_CMDLINE_PATH} (e.g. /proc/cmdline without initrd= "
                "and BOOT_IMAGE=), then run gpuhost apply again.",
            )
        if choose_kernel_cmdline_writer(facts) is None:
            refuse(
                REFUSE_NO_KERNEL_INSTALL,
                "bootloader",
                f"the host boots with systemd-boot ({loader.evidence}) but has neither kernel-install nor "
                "proxmox-boot-tool to write its loader entries from /etc/kernel/cmdline.",
                "Install the systemd-boot package (it brings kernel-install's hooks), then run gpuhost apply again.",
            )
    elif loader.update_command != "update-grub":
        refuse(
            REFUSE_NO_UPDATE_GRUB,
            "bootloader",
            "GRUB is configured but update-grub is not installed.",
            "Install the grub-pc or grub-efi-amd64 package.",
        )
    if facts.grub.syntax_error and loader.kind is BootloaderKind.GRUB:
        refuse(
            REFUSE_GRUB_SYNTAX,
            "/etc/default/grub",
            f"/etc/default/grub (or a drop-in) is not valid shell: {facts.grub.syntax_error}.",
            "Fix the file (update-grub sources it with sh and would fail too), then run gpuhost apply again.",
        )
    elif facts.grub.present and facts.grub.effective is None and loader.kind == BootloaderKind.GRUB:
        refuse(
            REFUSE_GRUB_UNREADABLE,
            "/etc/default/grub",
            "the GRUB command line could not be read (is the audit running as root?).",
            "Connect as root (ansible_user: root, or become).",
        )
    iommu = facts.iommu
    if not iommu.active and iommu.firmware_present is not True:
        refuse(
            REFUSE_IOMMU_ABSENT,
            "IOMMU",
            "the firmware reports no IOMMU (no DMAR or IVRS ACPI table) and the kernel has no IOMMU groups.",
            "Enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the BIOS/UEFI setup, then run gpuhost apply again.",
        )
    if facts.vfio_pci == VfioPci.ABSENT:
        refuse(
            REFUSE_VFIO_ABSENT,
            "kernel",
            f"the kernel {facts.kernel_release} has no vfio-pci (neither built in nor a module).",
            "Install a distribution kernel with VFIO (CONFIG_VFIO_PCI).",
        )


def choose_kernel_cmdline_writer(facts: HostFacts) -> KernelCmdlineWriter | None:
    """What rewrites a systemd-boot host's entries from /etc/kernel/cmdline (None: nothing can).

    proxmox-boot-tool where it manages the ESPs (/etc/kernel/proxmox-boot-uuids) and is installed: it
    copies kernels and entries to every ESP it lists, which kernel-install alone would not update.
    """
    if facts.firmware.proxmox_boot_tool and facts.bootloader.has_proxmox_boot_tool:
        return KernelCmdlineWriter.PROXMOX_BOOT_TOOL
    if facts.bootloader.has_kernel_install:
        return KernelCmdlineWriter.KERNEL_INSTALL
    return None
