"""`gpuhost apply`: show the plan, ask, then run playbooks/site.yml through ansible-runner.

Progress is one line per host and step; `-v` prints Ansible's own output instead. The playbooks
compute the same plan again on the hosts (gpuhost.passthrough.plan), so what runs is what
`ansible-playbook -i INVENTORY playbooks/site.yml` would run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuhost.cli.plan import describe_plan, plan_targets, playbook_path, validate_inventory_settings
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, InputError, MissingDependencyError

_SERIAL = re.compile(r"^(?:\d{1,4}%?)(?:,\d{1,4}%?)*$")
# Steps worth a progress line even when nothing changed.
_KEY_TASKS = ("planner", "Reboot", "Verify")


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
        type=Path,
        default=Path("gpuhost-apply-report.json"),
        help="JSON report path (default: ./%(default)s)",
    )
    parser.add_argument(
        "--no-trial",
        action="store_true",
        help="reboot straight into the new command line, without the one-shot GRUB trial entry "
        "(needed where GRUB cannot write /boot/grub/grubenv: /boot on RAID, LVM, btrfs or ZFS)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print Ansible's own output")


def _serial(text: str) -> list[int | str]:
    if not _SERIAL.match(text):
        raise InputError(f"--serial {text!r}: give batch sizes as N or N%, comma-separated (e.g. 1,20%).")
    return [item if item.endswith("%") else int(item) for item in text.split(",")]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    serial = _serial(args.serial)
    if not 0 <= args.max_fail_percentage <= 100:
        raise InputError("--max-fail-percentage must be from 0 to 100.")
    if not args.inventory.is_file():
        raise InputError(f"inventory {args.inventory} does not exist.")
    if not (args.yes or args.check):
        if not sys.stdin.isatty():
            raise InputError("gpuhost apply asks before changing hosts; pass --yes to run unattended.")
        plan_args = argparse.Namespace(
            hosts=[], inventory=args.inventory, limit=args.limit, from_snapshot=[], user=None, private_key=None,
            known_hosts=None, accept_new_host_keys=False, connect_timeout=15.0, gpus=None, role="host", forks=10,
        )  # fmt: skip
        outcomes = plan_targets(plan_args)
        for outcome in outcomes:
            if outcome.plan is None:
                console.print(f"[bold]{outcome.host}[/]: [red]cannot plan[/]: {outcome.error}")
                continue
            for line in describe_plan(outcome.plan):
                console.print(line) if line.startswith("[") else console.print(line, markup=False)
        if not any(o.plan and o.plan.applicable for o in outcomes):
            console.print("[red]no host can be configured[/]")
            return EXIT_FINDINGS
        answer = input(f"Apply to the hosts above (rolling, serial {args.serial})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            console.print("nothing changed")
            return EXIT_OK
    validate_inventory(args.inventory, args.limit)  # before Ansible connects anywhere
    report = run_playbook(
        inventory=args.inventory.resolve(),
        limit=args.limit,
        check=args.check,
        serial=serial,
        max_fail_percentage=args.max_fail_percentage,
        report=args.report.resolve(),
        verbose=args.verbose,
        console=console,
        trial=not args.no_trial,
    )
    return print_report(report, console)


def validate_inventory(inventory: Path, limit: str | None) -> None:
    """Every host's connection and gpuhost_* values, checked before anything connects (InputError)."""
    from gpuhost.targets import ConnectionDefaults, inventory_targets

    validate_inventory_settings(inventory, limit)
    inventory_targets(inventory, limit, ConnectionDefaults())  # the connection values


def run_playbook(
    *,
    inventory: Path,
    limit: str | None,
    check: bool,
    serial: list[int | str],
    max_fail_percentage: int,
    report: Path,
    verbose: bool,
    console: Any,
    trial: bool = True,
) -> dict[str, Any]:
    try:
        import ansible_runner
    except ImportError as error:
        raise MissingDependencyError("ansible-runner", "controller", "gpuhost apply") from error
    playbook = playbook_path()
    started = time.monotonic()
    current_task = {"name": ""}
    stopped: dict[str, tuple[str, str]] = {}  # host -> (outcome, message) of the failure that stopped it
    reached: set[str] = set()  # hosts whose batch began (the configure play ran a task on them)
    rebooted: set[str] = set()  # hosts a reboot task brought back (the report play may not run)
    in_run: set[str] = set()  # hosts of this run (the report play lists every inventory host)

    def on_event(event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        if kind == "playbook_on_task_start":
            current_task["name"] = str(data.get("task", ""))
            return True
        host = data.get("host")
        if not host:
            return True
        task = data.get("task") or current_task["name"]
        result = data.get("res", {}) or {}
        in_run.add(str(host))
        if str(data.get("play", "")).startswith(CONFIGURE_PLAY_PREFIX):
            reached.add(str(host))
        if kind == "runner_on_ok" and str(task).startswith("Reboot") and result.get("rebooted"):
            rebooted.add(str(host))
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            stopped.setdefault(str(host), stop_outcome(kind, str(task), result))
        if verbose:
            return True
        status = {
            "runner_on_failed": "[red]failed[/]",
            "runner_on_unreachable": "[red]unreachable[/]",
            "runner_on_ok": "[yellow]changed[/]" if result.get("changed") else "ok",
        }.get(kind)
        if status is None or (status == "ok" and not any(key in task for key in _KEY_TASKS)):
            return True
        detail = result.get("msg", "") if kind != "runner_on_ok" or any(k in task for k in _KEY_TASKS) else ""
        elapsed = time.monotonic() - started
        console.print(f"{elapsed:6.0f}s  [bold]{host}[/]  {status}  {task}" + (f": {detail}" if detail else ""))
        if result.get("changed") and result.get("diff"):
            for line in _diff_lines(result["diff"]):
                console.print(f"        {line}", markup=False)
        return True

    report.unlink(missing_ok=True)
    cmdline = "--check --diff" if check else "--diff"
    extravars = {
        "gpuhost_serial": serial,
        "gpuhost_max_fail_percentage": max_fail_percentage,
        "gpuhost_report_path": str(report),
    }
    if not trial:
        # Only --no-trial is an extra var: without it, an inventory's own gpuhost_trial_boot holds.
        extravars["gpuhost_trial_boot"] = False
    env = ansible_environment()
    with tempfile.TemporaryDirectory(prefix="gpuhost-apply-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            playbook=str(playbook),
            inventory=str(inventory),
            # The report play runs on the controller: a --limit must not leave it out.
            limit=f"{limit},localhost" if limit else None,
            extravars=extravars,
            cmdline=cmdline,
            envvars=env,
            event_handler=on_event,
            quiet=not verbose,
            suppress_env_files=True,
        )
        stats = runner.stats or {}  # read from the artifacts, before they go
    data: dict[str, Any] = {"schema": "gpuhost.apply/1", "hosts": {}}
    if report.is_file():
        data = json.loads(report.read_text())
    if not data.get("hosts"):
        # The report play did not run (the rollout was stopped): say what Ansible's recap knows.
        failed = {**stats.get("failures", {}), **stats.get("dark", {})}
        seen = set(stats.get("ok", {})) | set(failed)
        data["hosts"] = {
            host: {"status": "failed"}
            if host in failed
            else {"status": "not-reported"}
            if host in reached
            else {
                "status": "not reached",
                "message": "the rollout stopped before this host's batch: nothing was changed",
            }
            for host in sorted(seen - {"localhost"})
        }
    # Hosts that --limit left out: not part of this run, so not part of its report.
    if in_run:
        data["hosts"] = {host: entry for host, entry in data["hosts"].items() if host in in_run}
    for host, (outcome, message) in stopped.items():
        entry = data["hosts"].setdefault(host, {})
        if entry.get("status") != "refused":
            entry.update(status=outcome, message=message)
    for host in rebooted:
        data["hosts"].setdefault(host, {})["rebooted"] = True
    data["ansible_stats"] = stats
    data["ansible_rc"] = runner.rc
    data["ansible_status"] = runner.status
    data["seconds"] = round(time.monotonic() - started, 1)
    report.write_text(json.dumps(data, indent=2) + "\n")
    return data


# The name of site.yml's second play begins so: its tasks on a host mean that host's batch began.
CONFIGURE_PLAY_PREFIX = "Configure for passthrough"


def stop_outcome(kind: str, task: str, result: dict[str, Any]) -> tuple[str, str]:
    """What stopped a host, for apply's and rollback's reports: trial reverted, unreachable (also a
    reboot it never came back from, or a host key that changed) or failed, with Ansible's message."""
    message = str(result.get("msg") or result.get("stderr") or "").strip()
    if message.startswith("trial reverted"):
        return "trial reverted", message
    if kind == "runner_on_unreachable":
        return "unreachable", _host_key_message(message) or message
    if "planner" in task and "refuses to configure" in message:
        return "refused", message
    if task.startswith("Reboot") and ("Timed out" in message or "timed out" in message):
        return "unreachable", f"did not come back from the reboot within the timeout: {message}"
    return "failed", f"{task}: {message}"


def _host_key_message(message: str) -> str | None:
    """ssh's 30-line warning about a changed host key, said in one sentence with the fix (None: not that)."""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" not in message and "Host key verification failed" not in message:
        return None
    sent = re.search(r"(SHA256:[A-Za-z0-9+/=]+)", message)
    offending = re.search(r"Offending \S+ key in (\S+:\d+)", message)
    remove = re.search(r"(ssh-keygen -f .+ -R .+?)\s*$", message, re.MULTILINE)
    facts = [f"the host sent {sent.group(1)}"] if sent else []
    facts += [f"known_hosts has another key at {offending.group(1)}"] if offending else []
    return (
        "its SSH host key is not the one in known_hosts, so ssh refused to connect"
        + (f" ({'; '.join(facts)})" if facts else "")
        + ". If the host was reinstalled, check its new key out of band and replace the entry ("
        + (remove.group(1) if remove else "ssh-keygen -R HOST")
        + "); if it was not, someone may be intercepting the connection."
    )


def ansible_environment() -> dict[str, str]:
    """Environment of the ansible-playbook runs of apply and rollback."""
    return {
        "ANSIBLE_PIPELINING": "True",
        # ansible-runner turns host key checking off unless told otherwise: gpuhost never does.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_FORCE_COLOR": "False",
        "PYTHONPATH": _pythonpath(),
        # ansible-playbook is installed beside this interpreter (a venv run as .venv/bin/gpuhost
        # without activating it has no ansible-playbook on PATH).
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        # A short ControlPersist: the master inherits the runner's pty, which ends only when it exits.
        # ServerAlive: a session to a host that rebooted under it ends instead of hanging.
        "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=5s -o ServerAliveInterval=5 "
        "-o ServerAliveCountMax=6",
    }


def _diff_lines(diffs: Any) -> list[str]:
    """Ansible's --diff result (before/after texts) as unified diff lines."""
    import difflib

    lines: list[str] = []
    for diff in diffs if isinstance(diffs, list) else [diffs]:
        if not isinstance(diff, dict) or not isinstance(diff.get("after"), str):
            continue
        before = diff["before"] if isinstance(diff.get("before"), str) else ""
        lines.extend(
            line.rstrip("\n")
            for line in difflib.unified_diff(
                before.splitlines(keepends=True),
                diff["after"].splitlines(keepends=True),
                fromfile=str(diff.get("before_header", "before")),
                tofile=str(diff.get("after_header", "after")),
            )
        )
    return lines


def _pythonpath() -> str:
    """The action plugins import gpuhost on the controller: make this gpuhost importable there."""
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root


def print_report(report: dict[str, Any], console: Any) -> int:
    from rich.table import Table

    table = Table(title=f"gpuhost apply{' (check mode)' if report.get('check_mode') else ''}")
    for column in ("host", "status", "rebooted", "huge pages", "detail"):
        table.add_column(column)
    hosts = report.get("hosts", {})
    for name, entry in hosts.items():
        verification = entry.get("verification") or {}
        if entry.get("refusals"):
            detail = " ".join(r["message"] for r in entry["refusals"])
        else:
            detail = verification.get("summary") or entry.get("message") or ""
        table.add_row(
            name,
            entry.get("status", "?"),
            "yes" if entry.get("rebooted") else "no",
            "-" if entry.get("hugepages") is None else str(entry["hugepages"]),
            detail,
        )
    console.print(table)
    console.print(
        f"ansible: {report.get('ansible_status')} (rc {report.get('ansible_rc')}) in {report.get('seconds')} s"
    )
    good = report.get("ansible_rc") == 0 and all(
        e.get("status") == "ready" or (report.get("check_mode") and e.get("status") == "not-ready")
        for e in hosts.values()
    )
    return EXIT_OK if good and hosts else EXIT_FINDINGS
