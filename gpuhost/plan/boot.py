"""The boot loaders: GRUB's drop-in and grubenv, systemd-boot's trial entry, the IOMMU flag an earlier apply set.

Which options go on the kernel command line, and what gpuhost claims of the host's own, is
gpuhost.cmdline's table; the planner puts the line together from it.
"""

from __future__ import annotations

import re

from gpuhost.cmdline import INTEL_IOMMU
from gpuhost.facts.model import BootloaderKind, HostFacts, KernelCommandLine, LoaderEntry, LoaderEntryFile
from gpuhost.inventory.plan_settings import PlanSettings
from gpuhost.plan.model import (
    KERNEL_INSTALL_REFRESH,
    PROXMOX_BOOT_TOOL_REFRESH,
    TRIAL_LOADER_ENTRY_ID,
    TRIAL_MARKER,
    KernelCmdlineWriter,
    SystemdBootPlan,
)
from gpuhost.plan.platform import Refuse
from gpuhost.problems import Severity, Stage, register
from gpuhost.templates import render_template

REFUSE_TRIAL_NO_LOADER_ENTRY = register(
    "plan.trial.no_loader_entry",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot: the entry that booted is not a loader entry file gpuhost can copy for the trial",
)

REFUSE_TRIAL_ENTRY_ORDER = register(
    "plan.trial.entry_order",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot: the default entry has no sort-key, so the trial entry could become the default",
)

REFUSE_TRIAL_PROXMOX = register(
    "plan.trial.proxmox_boot_tool",
    Stage.PLAN,
    Severity.ERROR,
    "proxmox-boot-tool copies the entries to ESPs that are not mounted: no trial entry (use --no-trial)",
)

# Where GRUB cannot write its environment block (grubenv): save_env fails there, so the one-shot
# next_entry that grub-reboot sets is never cleared and every boot would be a trial boot.
_GRUBENV_FILESYSTEMS = {"btrfs": "btrfs", "zfs": "ZFS"}

_GRUBENV_DEVICES = (
    (re.compile(r"^/dev/md"), "md RAID"),
    (re.compile(r"^/dev/(mapper/|dm-)"), "LVM or another device-mapper volume"),
)

# The options that turn a vendor's IOMMU on, where the kernel does not by itself (Intel's VT-d is off
# by default in many distribution kernels; AMD-Vi is on wherever the firmware has an IVRS table:
# amd_iommu= documents no "on", only off and tuning values, so nothing is added for AMD).
IOMMU_ON_OPTIONS = (INTEL_IOMMU.token(),)


def previous_gpuhost_options(facts: HostFacts) -> tuple[str, ...]:
    """What gpuhost's own files put on the command line at the last apply: the options of its GRUB
    drop-in, or (systemd-boot) /etc/kernel/cmdline, which apply rewrote."""
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        line = facts.firmware.kernel_cmdline_file
    else:
        line = facts.grub.gpuhost_options
    return line.tokens if line is not None else ()


def iommu_vendor_flag(facts: HostFacts, previous: tuple[str, ...]) -> str | None:
    """intel_iommu=on where the kernel did not turn the IOMMU on by itself, and where an earlier apply
    added it: the IOMMU is on now because of it, and the next boot needs it as much (issue 27.1: a
    second apply dropped it and said no reboot; the next reboot came up without an IOMMU)."""
    kept = next((option for option in IOMMU_ON_OPTIONS if option in previous), None)
    if kept is not None:
        return kept
    if not facts.iommu.active and facts.iommu.dmar_table:
        return INTEL_IOMMU.token()
    return None


def line_without_gpuhost_dropin(facts: HostFacts) -> KernelCommandLine | None:
    """GRUB_CMDLINE_LINUX_DEFAULT as the host's own files set it: the effective value without the
    options gpuhost's drop-in appended (read back from the drop-in itself)."""
    default = facts.grub.cmdline_linux_default
    ours = facts.grub.gpuhost_options
    if default is None or ours is None:
        return default
    return KernelCommandLine(tuple(token for token in default.tokens if token not in ours.tokens))


def grubenv_location(facts: HostFacts) -> tuple[str, str | None]:
    """Where /boot/grub lives ("/dev/vda1 (ext4)"), and why GRUB cannot write grubenv there (None: it can)."""
    if facts.mounts is None:
        return "an unknown filesystem", "as /proc/mounts could not be read"
    candidates = [m for m in facts.mounts if "/boot/grub/".startswith(m.target.rstrip("/") + "/")]
    if not candidates:
        return "an unknown filesystem", "as no mount holds it"
    mount = max(candidates, key=lambda m: len(m.target))
    where = f"{mount.source} ({mount.fstype}, mounted on {mount.target})"
    if mount.fstype in _GRUBENV_FILESYSTEMS:
        return where, f"a {_GRUBENV_FILESYSTEMS[mount.fstype]} filesystem"
    for pattern, kind in _GRUBENV_DEVICES:
        if pattern.match(mount.source):
            return where, f"a device on {kind}"
    return where, None


def plan_systemd_boot(
    facts: HostFacts,
    writer: KernelCmdlineWriter,
    desired: KernelCommandLine,
    settings: PlanSettings,
    rescue_options: tuple[str, ...],
    *,
    trial_wanted: bool,
    refuse: Refuse,
) -> SystemdBootPlan:
    firmware = facts.firmware
    booted = next((f for f in firmware.loader_entries if f.id == firmware.loader_entry), None)
    if trial_wanted and writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL:
        refuse(
            REFUSE_TRIAL_PROXMOX,
            "systemd-boot",
            "proxmox-boot-tool keeps the kernels and loader entries on ESPs that are not mounted and copies them "
            "there at each refresh: a trial entry written beside the default would not be on the ESP that boots.",
            "Run gpuhost apply --no-trial (or set gpuhost_trial_boot: false for this host) to reboot straight into "
            "the new command line, with the console or BMC at hand in case it does not boot.",
        )
    elif trial_wanted and (booted is None or booted.entry.linux is None or not _printable(booted.entry)):
        refuse(
            REFUSE_TRIAL_NO_LOADER_ENTRY,
            "systemd-boot",
            f"the running kernel was booted from the entry {firmware.loader_entry or '(unknown)'}, which is not a "
            f"loader entry file with a kernel under {', '.join(_entry_directories(firmware.loader_entries))}: "
            "gpuhost copies that entry for the trial boot.",
            "Boot the host from its kernel-install entry (bootctl list), or run gpuhost apply --no-trial.",
        )
    elif trial_wanted and booted is not None and booted.entry.sort_key is None and not firmware.loader_entry_default:
        refuse(
            REFUSE_TRIAL_ENTRY_ORDER,
            "systemd-boot",
            f"the entry {booted.id} has no sort-key and no default entry is set (LoaderEntryDefault): systemd-boot "
            f"would then order entries by name alone, and {TRIAL_LOADER_ENTRY_ID} could become the default, so a "
            "panicking trial kernel would boot again and again.",
            f"Set the default entry (bootctl set-default {booted.id}), or run gpuhost apply --no-trial.",
        )
    entry = booted.entry if booted is not None else None
    directory = booted.path.rsplit("/", 1)[0] if booted is not None else f"{firmware.esp or '/boot/efi'}/loader/entries"
    trial_options = (*desired.tokens, f"panic={settings.trial_panic_seconds}", TRIAL_MARKER, *rescue_options)
    return SystemdBootPlan(
        writer=writer,
        current_kernel_cmdline=None if firmware.kernel_cmdline_file is None else str(firmware.kernel_cmdline_file),
        kernel_cmdline=str(desired) + "\n",
        default_entry=booted.id if booted is not None else "",
        trial_entry_path=f"{directory}/{TRIAL_LOADER_ENTRY_ID}",
        refresh_command=PROXMOX_BOOT_TOOL_REFRESH
        if writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL
        else KERNEL_INSTALL_REFRESH,
        trial_entry=""
        if entry is None
        else render_template(
            "systemd-boot/gpuhost-trial.conf.j2",
            default_entry=booted.id if booted is not None else "",
            entry_id=TRIAL_LOADER_ENTRY_ID,
            panic=settings.trial_panic_seconds,
            marker=TRIAL_MARKER,
            testing_options=settings.trial_testing_options,
            title=entry.title or entry.version or "Linux",
            version=entry.version,
            linux=entry.linux,
            initrds=entry.initrds,
            options=str(KernelCommandLine((*trial_options, *settings.trial_testing_options))),
        ),
    )


def _printable(entry: LoaderEntry) -> bool:
    """No control characters in what the trial entry copies (the host's text goes back into a file)."""
    values = [entry.title or "", entry.version or "", entry.linux or "", *entry.initrds, *entry.options.tokens]
    return all(char.isprintable() for value in values for char in value)


def _entry_directories(entries: tuple[LoaderEntryFile, ...]) -> list[str]:
    return sorted({f.path.rsplit("/", 1)[0] for f in entries}) or ["the ESP's loader/entries"]
