"""`gpuhost plan`: what `gpuhost apply` would change on each host, and why. Changes nothing."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from gpuhost.cli.common import add_target_options, positive_int, resolve_targets
from gpuhost.cli.text import make_console, printable, untrusted
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, InputError
from gpuhost.plan import HostPlan
from gpuhost.plan.fleet import PlanOutcome, plan_fleet
from gpuhost.plan.model import (
    BACKUP_DIR,
    GRUB_DROPIN_PATH,
    INITRAMFS_MODULES_PATH,
    INITRAMFS_SCRIPT_PATH,
    KERNEL_CMDLINE_PATH,
    TRIAL_ENTRY_ID,
    KernelCmdlineWriter,
)

if TYPE_CHECKING:
    from rich.console import Console


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser, snapshots=True)
    parser.add_argument("--json", action="store_true", help="print the plans as JSON (schema gpuhost.plan/1)")
    parser.add_argument("--forks", type=positive_int, default=10, help="hosts read in parallel (default 10)")
    parser.add_argument("--show-files", action="store_true", help="print the full content of the files written")


def exit_code(outcomes: list[PlanOutcome]) -> int:
    if any(outcome.plan is None for outcome in outcomes):
        return EXIT_UNUSABLE
    return EXIT_FINDINGS if any(outcome.plan and outcome.plan.refusals for outcome in outcomes) else EXIT_OK


def run(args: argparse.Namespace) -> int:
    outcomes = plan_fleet(resolve_targets(args), args.forks)
    if args.json:
        data = [
            outcome.plan.to_json() if outcome.plan else {"host": outcome.host, "error": outcome.error}
            for outcome in outcomes
        ]
        # One write of the finished text: Ctrl-C while json.dump streams would leave half a document.
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        from gpuhost.rollout.environment import playbook_path

        print_plans(outcomes, show_files=args.show_files)
        try:
            playbook = playbook_path()
        except InputError as error:
            print(f"note: gpuhost apply cannot run: {error}")
        else:
            print(f"gpuhost apply runs {playbook}; without the CLI: ansible-playbook -i INVENTORY {playbook}")
    return exit_code(outcomes)


def print_plans(outcomes: list[PlanOutcome], show_files: bool = False) -> None:
    console = make_console(soft_wrap=True, fixed_width=False)
    for outcome in outcomes:
        print_plan_outcome(outcome, console, show_files=show_files)
        if outcome.plan is not None:
            console.print()


def print_plan_outcome(outcome: PlanOutcome, console: Console, show_files: bool = False) -> None:
    """A host's plan, or why it has none (plan, and apply before it asks)."""
    if outcome.plan is None:
        console.print(f"[bold]{untrusted(outcome.host)}[/]: [red]cannot plan[/]: {untrusted(outcome.error)}")
        return
    for line in describe_plan(outcome.plan, show_files=show_files):
        console.print(printable(line), markup=False) if not line.startswith("[") else console.print(line)


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
            f"  backed up to {BACKUP_DIR} first (gpuhost rollback restores them): {' '.join(plan.backup_files)}"
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
    lines.extend(f"  note: {note}" for note in plan.notes)
    if show_files and sdboot is not None:
        lines.append(f"  --- {KERNEL_CMDLINE_PATH}")
        lines.extend("  | " + line for line in sdboot.kernel_cmdline.splitlines())
        if plan.reboot_needed and plan.trial.enabled:
            lines.append(f"  --- {sdboot.trial_entry_path}")
            lines.extend("  | " + line for line in sdboot.trial_entry.splitlines())
    elif show_files:
        lines.append(f"  --- {GRUB_DROPIN_PATH}")
        lines.extend("  | " + line for line in plan.grub_dropin.splitlines())
    if show_files and plan.initramfs_script:
        lines.append(f"  --- {INITRAMFS_SCRIPT_PATH}")
        lines.extend("  | " + line for line in plan.initramfs_script.splitlines())
    return lines
