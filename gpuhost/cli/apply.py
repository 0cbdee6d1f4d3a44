"""`gpuhost apply`: show the plan, ask, then run playbooks/site.yml (gpuhost.rollout).

Progress is one line per host and step; `-v` prints Ansible's own output instead. The inventory
is read once: the plan, the checks before anything connects, and the per-host known_hosts
files all come from that one reading.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost.cli.common import (
    ansible_printer,
    check_ansible_environment,
    progress_printer,
    rollout_console,
    run_command,
)
from gpuhost.cli.text import untrusted
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, InputError
from gpuhost.inventory.bmc import check_password_source
from gpuhost.inventory.policy import Role
from gpuhost.metrics import apply_metrics, check_textfile_path, write_textfile
from gpuhost.output import check_outputs
from gpuhost.rollout.engine import ApplyRequest, rollout_options
from gpuhost.rollout.environment import ansible_limit, rollout_targets
from gpuhost.rollout.report import RolloutReport
from gpuhost.targets import ConnectionDefaults, Target

if TYPE_CHECKING:
    from rich.console import Console


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="an Ansible inventory (YAML or INI)")
    parser.add_argument("-l", "--limit", help="Ansible host pattern to limit the inventory to")
    parser.add_argument("--check", action="store_true", help="Ansible check mode with --diff: nothing changes")
    parser.add_argument("-y", "--yes", action="store_true", help="do not show the plan and ask; apply at once")
    parser.add_argument(
        "--serial",
        default="1,20%",
        metavar="N[%][,N[%]...]",
        help="hosts per rolling batch, Ansible's serial (default 1,20%%: one host, then 20%% at a time)",
    )
    parser.add_argument(
        "--max-fail-percentage",
        type=int,
        default=0,
        metavar="P",
        help="failed hosts allowed per batch before the rollout stops (default 0)",
    )
    parser.add_argument(
        "--report",
        default="gpuhost-apply-report.json",
        help="JSON report path (default: ./%(default)s)",
    )
    parser.add_argument(
        "--no-trial",
        action="store_true",
        help="reboot straight into the new command line, without the one-shot trial entry (GRUB or "
        "systemd-boot; needed where GRUB cannot write /boot/grub/grubenv: /boot on RAID, LVM, btrfs or ZFS, "
        "and on proxmox-boot-tool hosts)",
    )
    parser.add_argument(
        "--require-rescue",
        action="store_true",
        help="refuse a host whose reboot would have no watchdog armed (the BMC's, with ipmitool, or a "
        "hardware watchdog the host's own systemd pets) to reset a trial boot that hangs; the plan names such hosts",
    )
    parser.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write each host's outcome as Prometheus metrics to FILE (*.prom, atomically, for "
        "node_exporter's textfile collector; kept as it was when the rollout is interrupted, like --report)",
    )
    parser.add_argument(
        "--break-lock",
        action="store_true",
        help="remove the lock another run left on a host (it died: gpuhost names it and says when it is stale) "
        "and hold the host for this run; never needed while that run is still going",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print Ansible's own output")


def run(args: argparse.Namespace) -> int:
    from gpuhost.rollout import engine

    console = rollout_console()
    if args.prometheus is not None:
        check_textfile_path(args.prometheus)
    check_outputs([("--report", args.report), ("--prometheus", args.prometheus)], [("-i", args.inventory)])
    serial, max_fail_percentage = rollout_options(args.serial, args.max_fail_percentage)
    interactive = not (args.yes or args.check)
    if interactive and not sys.stdin.isatty():
        raise InputError("gpuhost apply asks before changing hosts; pass --yes to run unattended.")
    # The shell's ANSIBLE_* variables, then every host's connection and gpuhost_* values, checked
    # before anything connects; --check refuses what the real run would.
    check_ansible_environment()
    selection = rollout_targets(args.inventory, args.limit, ConnectionDefaults(role=Role.HOST))
    targets = list(selection.targets)
    limit = ansible_limit(selection, controller_play=True)
    for target in targets:
        bmc = target.require_config().bmc
        if bmc is not None:
            check_password_source(bmc, f"inventory host {target.name}")
    if interactive:
        declined = _ask(targets, args.serial, console, args.require_rescue)
        if declined is not None:
            return declined
    request = ApplyRequest(
        inventory=args.inventory.resolve(),
        limit=limit,
        check=args.check,
        serial=serial,
        max_fail_percentage=max_fail_percentage,
        report_path=Path(args.report).expanduser().resolve(),
        trial=not args.no_trial,
        require_rescue=args.require_rescue,
        command=run_command("apply", args),
        break_lock=args.break_lock,
    )
    progress = progress_printer(console, verbose=args.verbose, timed=True)
    report = engine.apply(request, targets, progress, ansible_printer() if args.verbose else None)
    print_report(report, console)
    if args.prometheus is not None and not report.canceled:
        write_textfile(args.prometheus, apply_metrics(report, time.time()))
    return report.exit_code()


def _ask(targets: list[Target], serial: str, console: Console, require_rescue: bool) -> int | None:
    """Show the plans and ask; the exit code when not going ahead (None: go ahead)."""
    from gpuhost.cli.views import print_plan_outcome
    from gpuhost.plan.fleet import plan_fleet

    outcomes = plan_fleet(targets, forks=10, require_rescue=require_rescue)
    for outcome in outcomes:
        print_plan_outcome(outcome, console)
    if not any(o.plan and o.plan.applicable for o in outcomes):
        console.print("[red]no host can be configured[/]")
        return EXIT_FINDINGS
    answer = input(f"Apply to the hosts above (rolling, serial {serial})? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        console.print("nothing changed")
        return EXIT_OK
    return None


def print_report(report: RolloutReport, console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"gpuhost apply{' (check mode)' if report.check_mode else ''}")
    for column in ("host", "status", "rebooted", "huge pages", "detail"):
        table.add_column(column)
    for name, entry in report.hosts.items():
        verification = entry.get("verification") or {}
        if entry.get("refusals"):
            detail = " ".join(r["message"] for r in entry["refusals"])
        else:
            detail = verification.get("summary") or entry.get("message") or ""
        table.add_row(
            untrusted(name),
            untrusted(entry.get("status", "?")),
            "yes" if entry.get("rebooted") else "no",
            "-" if entry.get("hugepages") is None else untrusted(entry["hugepages"]),
            untrusted(detail),
        )
    console.print(table)
    data = report.data
    console.print(
        untrusted(f"ansible: {data.get('ansible_status')} (rc {data.get('ansible_rc')}) in {data.get('seconds')} s")
    )
