"""`gpuhost rollback -i INVENTORY --limit HOST`: undo gpuhost apply on a host, then prove the old line is back.

Runs playbooks/rollback.yml (remove gpuhost's GRUB drop-in, trial entry and initramfs changes,
restore what apply backed up under /var/lib/gpuhost/backup, update-initramfs, update-grub,
reboot), then reads each host with the audit and checks that /proc/cmdline is the command line
GRUB computes without gpuhost.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

from gpuhost.cli.apply import ansible_environment, stop_outcome, validate_inventory
from gpuhost.cli.plan import playbook_path
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, InputError, MissingDependencyError
from gpuhost.plan.model import (
    APT_PIN_PATH,
    BACKUP_DIR,
    GRUB_DROPIN_PATH,
    INITRAMFS_MODULES_PATH,
    INITRAMFS_SCRIPT_PATH,
    TRIAL_GRUB_SCRIPT_PATH,
    TRIAL_SETTINGS_PATH,
)

# What apply writes and rollback removes; the role's defaults hold the same list for
# ansible-playbook without the CLI (tests/test_rollback.py keeps them equal).
REMOVED_FILES = (GRUB_DROPIN_PATH, TRIAL_SETTINGS_PATH, TRIAL_GRUB_SCRIPT_PATH, INITRAMFS_SCRIPT_PATH, APT_PIN_PATH)


def configure(parser: argparse.ArgumentParser) -> None:
    from pathlib import Path

    parser.add_argument("-i", "--inventory", type=Path, required=True, help="an Ansible inventory (YAML or INI)")
    parser.add_argument(
        "-l", "--limit", required=True, help="the host(s) to roll back (an Ansible pattern; required, on purpose)"
    )
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask; roll back at once")
    parser.add_argument(
        "--reboot-timeout", type=int, default=900, metavar="S", help="seconds a host may take to come back"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print Ansible's own output")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    if not args.inventory.is_file():
        raise InputError(f"inventory {args.inventory} does not exist.")
    if not 30 <= args.reboot_timeout <= 86400:
        raise InputError("--reboot-timeout must be from 30 to 86400 seconds.")
    validate_inventory(args.inventory, args.limit)
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError("gpuhost rollback asks before changing hosts; pass --yes to run unattended.")
        answer = input(f"Remove gpuhost's configuration from {args.limit} and reboot it? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            console.print("nothing changed")
            return EXIT_OK
    started = time.monotonic()
    failures = _run_rollback(args, console)
    ran = time.monotonic() - started
    return _check_hosts(args, failures, ran, console)


def _run_rollback(args: argparse.Namespace, console: Any) -> dict[str, str]:
    try:
        import ansible_runner
    except ImportError as error:
        raise MissingDependencyError("ansible-runner", "controller", "gpuhost rollback") from error
    failures: dict[str, str] = {}

    def on_event(event: dict[str, Any]) -> bool:
        data = event.get("event_data", {})
        host, kind = data.get("host"), event.get("event", "")
        result = data.get("res", {}) or {}
        if host and kind in ("runner_on_failed", "runner_on_unreachable"):
            failures.setdefault(str(host), stop_outcome(kind, str(data.get("task", "")), result)[1])
        status = {
            "runner_on_ok": "[yellow]changed[/]" if result.get("changed") else None,
            "runner_on_failed": "[red]failed[/]",
            "runner_on_unreachable": "[red]unreachable[/]",
        }.get(kind)
        if host and status and not args.verbose:
            console.print(f"[bold]{host}[/]  {status}  {data.get('task')}")
        return True

    extravars = {
        "gpuhost_rollback_removed_files": list(REMOVED_FILES),
        "gpuhost_rollback_initramfs_modules": INITRAMFS_MODULES_PATH,
        "gpuhost_rollback_backup_dir": BACKUP_DIR,
        "gpuhost_rollback_reboot_timeout": args.reboot_timeout,
    }
    with tempfile.TemporaryDirectory(prefix="gpuhost-rollback-") as private:
        ansible_runner.run(
            private_data_dir=private,
            playbook=str(playbook_path().parent / "rollback.yml"),
            inventory=str(args.inventory.resolve()),
            limit=args.limit,
            extravars=extravars,
            cmdline="--diff",
            envvars=ansible_environment(),
            event_handler=on_event,
            quiet=not args.verbose,
            suppress_env_files=True,
        )
    return failures


def _check_hosts(args: argparse.Namespace, failures: dict[str, str], seconds: float, console: Any) -> int:
    from rich.table import Table

    from gpuhost.audit import audit_target
    from gpuhost.plan.verify import verify_rollback
    from gpuhost.targets import ConnectionDefaults, inventory_targets

    table = Table(title=f"gpuhost rollback ({seconds:.0f} s)")
    for column in ("host", "status", "detail"):
        table.add_column(column)
    good = True
    for target in inventory_targets(args.inventory, args.limit, ConnectionDefaults()):
        if target.name in failures:
            table.add_row(target.name, "failed", failures[target.name])
            good = False
            continue
        audit = audit_target(target)
        if audit.facts is None:
            table.add_row(target.name, "unreachable", audit.error or "")
            good = False
            continue
        result = verify_rollback(target.name, audit.facts)
        table.add_row(target.name, "rolled back" if result["ok"] else "not rolled back", result["summary"])
        good = good and bool(result["ok"])
    console.print(table)
    return EXIT_OK if good else EXIT_FINDINGS
