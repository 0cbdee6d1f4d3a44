"""Printing helpers that several verbs share (plan shows the plans; apply shows them before it asks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuhost.cli.text import printable, untrusted
from gpuhost.plan.model import (
    BACKUP_DIR,
    GRUB_DROPIN_PATH,
    INITRAMFS_MODULES_PATH,
    INITRAMFS_SCRIPT_PATH,
    KERNEL_CMDLINE_PATH,
    TRIAL_ENTRY_ID,
    FileState,
    HostPlan,
    KernelCmdlineWriter,
)

if TYPE_CHECKING:
    from rich.console import Console

    from gpuhost.plan.fleet import PlanOutcome


def print_plan_outcome(outcome: PlanOutcome, console: Console, show_files: bool = False) -> None:
    """A host's plan, or why it has none (plan, and apply before it asks)."""
    if outcome.plan is None:
        console.print(f"[bold]{untrusted(outcome.host)}[/]: [red]cannot plan[/]: {untrusted(outcome.error)}")
        return
    for line in describe_plan(outcome.plan, show_files=show_files):
        console.print(printable(line), markup=False) if not line.startswith("[") else console.print(line)


def describe_rescue(plan: HostPlan) -> list[str]:
    """What brings the trial boot back if it hangs, strongest first, and for how long."""
    rescue = plan.rescue
    lines = [
        f"  rescue: the controller waits up to {rescue.controller_wait_s} s for the trial "
        "(the deadline or the BMC's timer, then one more boot); on the trial entry only: "
        + " ".join(rescue.kernel_options)
    ]
    lines.extend(f"    {r.describe()}" for r in rescue.rescues)
    if rescue.warning:
        uncaught = ", ".join(str(hang) for hang in rescue.uncaught)
        lines.append(f"  warning: {rescue.warning}" + (f" (not caught: {uncaught})" if uncaught else ""))
    return lines


def describe_plan(plan: HostPlan, show_files: bool = False) -> list[str]:
    """The plan as lines of text (rich markup only at the start of headline lines)."""
    if plan.refusals:
        lines = [f"[bold]{untrusted(plan.host)}[/]: [red]refused[/], nothing will be written"]
        lines += [f"  - {r.message}\n    fix: {r.remedy}" for r in plan.refusals]
        return lines
    lines = [
        f"[bold]{untrusted(plan.host)}[/]: "
        + ("[yellow]reboot needed[/]" if plan.reboot_needed else "[green]no reboot[/]")
    ]
    for function in plan.functions:
        lines.append(f"  vfio-pci <- {function.address} [{function.vendor_device}] (now: {function.driver or 'none'})")
    how = "vfio-pci.ids=" + ",".join(plan.vfio_ids) if plan.vfio_ids else "driver_override by address"
    lines.append(f"  binding: {how}")
    sdboot = plan.systemd_boot
    if sdboot is None:
        lines.append(f"  {GRUB_DROPIN_PATH}: adds {' '.join(plan.kernel_options)}")
        lines.append(f"    GRUB line now: {plan.current_grub_line or '(empty)'}")
        lines.append(f"    GRUB line then: {plan.desired_grub_line}")
    else:
        refresh = (
            "proxmox-boot-tool refresh"
            if sdboot.writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL
            else "kernel-install add for every installed kernel"
        )
        lines.append(f"  {KERNEL_CMDLINE_PATH}: adds {' '.join(plan.kernel_options)}; then {refresh}")
        lines.append(f"    now: {sdboot.current_kernel_cmdline or '(absent)'}")
        lines.append(f"    then: {sdboot.kernel_cmdline.strip()}")
    if plan.initramfs_modules:
        lines.append(f"  {INITRAMFS_MODULES_PATH}: {' '.join(plan.initramfs_modules)}; update-initramfs -u -k all")
    if plan.initramfs_script:
        early = f"driver_override for {' '.join(plan.override_addresses)}, " if plan.override_addresses else ""
        lines.append(f"  {INITRAMFS_SCRIPT_PATH}: {early}vfio-pci loaded before udev")
    lines.append(f"  huge pages: {plan.hugepages.pages} x 1 GiB ({plan.hugepages.rule})")
    if plan.hugepages.pages and len(plan.hugepages.per_node) > 1:
        nodes = ", ".join(f"node {node}: {count}" for node, count in plan.hugepages.per_node)
        lines.append(f"    per NUMA node: {nodes} ({plan.hugepages.kernel_option}; {plan.hugepages.placement})")
    lines.append(f"  host driver: {plan.driver_removal.note}")
    if plan.backup_files:
        lines.append(
            f"  recorded under {BACKUP_DIR} before the first change, a copy or a note that it is absent "
            f"(gpuhost rollback puts each back as it was): {' '.join(plan.backup_files)}"
        )
    lines.extend(f"  reboot: {reason}" for reason in plan.reboot_reasons)
    if plan.reboot_needed and plan.trial.enabled and sdboot is not None:
        lines.append(
            f"  boot: trial first, the loader entry {sdboot.trial_entry_path} (a copy of {sdboot.default_entry} with "
            f"the new options and panic={plan.trial.panic_seconds}) booted once by bootctl set-oneshot; "
            f"{KERNEL_CMDLINE_PATH} and the entries change only once it verified"
        )
    elif plan.reboot_needed and plan.trial.enabled:
        lines.append(
            f"  boot: trial first, the one-shot GRUB entry '{TRIAL_ENTRY_ID}' with panic={plan.trial.panic_seconds}; "
            f"the default only once it verified (/boot/grub: {plan.trial.boot_filesystem})"
        )
    elif plan.reboot_needed:
        lines.append("  boot: straight into the new command line (no trial: --no-trial or gpuhost_trial_boot: false)")
    if plan.trial_now:
        lines.extend(describe_rescue(plan))
    lines.extend(f"  note: {note}" for note in plan.notes)
    if show_files:
        lines.extend(describe_files(plan))
    return lines


# Why a phase's changes are made, for --show-files.
_PHASES = (
    ("configure", "before the reboot"),
    ("commit", "once the trial boot verified"),
    ("revert", "when the trial boot did not verify"),
)


def describe_files(plan: HostPlan) -> list[str]:
    """Every file change of the plan (plan.files, what `--json` lists and apply carries out), phase by
    phase, with the whole content of each file written: what --show-files prints."""
    lines: list[str] = []
    for phase, when in _PHASES:
        for change in getattr(plan.files, phase):
            if change.state is FileState.ABSENT:
                lines.append(f"  --- {change.path} ({phase}, {when}): deleted")
                continue
            if change.state is FileState.DIRECTORY:
                lines.append(f"  --- {change.path} ({phase}, {when}): a directory, mode {change.mode}")
                continue
            what = "gpuhost's block, the rest of the file kept" if change.state is FileState.BLOCK else "mode"
            what = f"{what} {change.mode}" if change.state is FileState.PRESENT else what
            lines.append(f"  --- {change.path} ({phase}, {when}): {what}")
            lines.extend("  | " + line for line in change.content.splitlines())
    return lines
