"""`gpuhost rollback -i INVENTORY --limit HOST`: undo gpuhost apply on a host, then prove the old line is back.

Runs playbooks/rollback.yml (gpuhost's rollback plan, gpuhost.plan.rollback: remove gpuhost's
files, put back every file of the host's as apply recorded it under /var/lib/gpuhost, rebuild the
initramfs and the boot loader's entries as the host's boot loader calls for, reboot; the host's
lock held throughout), then reads each host with the audit and checks that /proc/cmdline is the command line
GRUB computes without gpuhost. The inventory is read once, before anything connects.
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
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, InputError
from gpuhost.rollout.engine import RollbackRequest
from gpuhost.rollout.environment import ansible_limit, rollout_targets
from gpuhost.rollout.report import HostOutcome, HostStatus
from gpuhost.targets import ConnectionDefaults, Target

if TYPE_CHECKING:
    from rich.console import Console


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="an Ansible inventory (YAML or INI)")
    parser.add_argument(
        "-l", "--limit", required=True, help="the host(s) to roll back (an Ansible pattern; required, on purpose)"
    )
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask; roll back at once")
    parser.add_argument(
        "--reboot-timeout", type=int, default=900, metavar="S", help="seconds a host may take to come back"
    )
    parser.add_argument(
        "--break-lock",
        action="store_true",
        help="remove the lock another run left on the host (it died: gpuhost names it and says when it is stale) "
        "and hold the host for this rollback",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print Ansible's own output")


def run(args: argparse.Namespace) -> int:
    from gpuhost.rollout import engine

    console = rollout_console()
    if not 30 <= args.reboot_timeout <= 86400:
        raise InputError("--reboot-timeout must be from 30 to 86400 seconds.")
    check_ansible_environment()
    selection = rollout_targets(args.inventory, args.limit, ConnectionDefaults())
    targets = list(selection.targets)
    limit = ansible_limit(selection, controller_play=False)
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError("gpuhost rollback asks before changing hosts; pass --yes to run unattended.")
        names = ", ".join(target.name for target in targets)
        answer = input(f"Remove gpuhost's configuration from {names} and reboot it? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            console.print("nothing changed")
            return EXIT_OK
    started = time.monotonic()
    request = RollbackRequest(
        inventory=args.inventory.resolve(),
        limit=limit,
        reboot_timeout=args.reboot_timeout,
        command=run_command("rollback", args),
        break_lock=args.break_lock,
    )
    progress = progress_printer(console, verbose=args.verbose, timed=False)
    failures = engine.rollback(request, targets, progress, ansible_printer() if args.verbose else None)
    return _check_hosts(targets, failures, time.monotonic() - started, console)


def _check_hosts(targets: list[Target], failures: dict[str, HostOutcome], seconds: float, console: Console) -> int:
    """Read each host back with the audit: is /proc/cmdline the line GRUB computes without gpuhost?"""
    from rich.table import Table

    from gpuhost.audit import audit_target
    from gpuhost.plan.verify import verify_rollback

    table = Table(title=f"gpuhost rollback ({seconds:.0f} s)")
    for column in ("host", "status", "detail"):
        table.add_column(column)
    unreachable = not_rolled_back = False
    for target in targets:
        failure = failures.get(target.name)
        if failure is not None:
            table.add_row(untrusted(target.name), failure.status.value, untrusted(failure.message))
            # Unreachable, or held by another run (nothing of this rollback touched it): 2, as apply.
            unreachable = unreachable or failure.status in (HostStatus.UNREACHABLE, HostStatus.LOCKED)
            not_rolled_back = True
            continue
        audit = audit_target(target)
        if audit.facts is None:
            table.add_row(untrusted(target.name), "unreachable", untrusted(audit.error or ""))
            unreachable = True
            continue
        result = verify_rollback(target.name, audit.facts)
        outcome = "rolled back" if result["ok"] else "not rolled back"
        table.add_row(untrusted(target.name), outcome, untrusted(result["summary"]))
        not_rolled_back = not_rolled_back or not result["ok"]
    console.print(table)
    if unreachable:  # as audit and plan: a host that could not be read is 2
        return EXIT_UNUSABLE
    return EXIT_FINDINGS if not_rolled_back else EXIT_OK
