"""Run gpuhost.passthrough.site (apply) or .rollback through ansible-runner; its events become typed outcomes.

The engine never prints: progress goes to a callback as TaskProgress, the result comes back as
a RolloutReport (apply) or per-host HostOutcomes (rollback). The playbooks compute the same plan
again on the hosts (gpuhost.passthrough.plan), so what runs is what
`ansible-playbook -i INVENTORY gpuhost.passthrough.site` (or an AWX job template) would run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhost.errors import GpuhostError, InputError, MissingDependencyError, shortened
from gpuhost.hostlock import LOCKED_PREFIX
from gpuhost.output import write_output
from gpuhost.rollout.environment import (
    ROLLBACK_PLAYBOOK,
    SITE_PLAYBOOK,
    ansible_environment,
    inventory_sources,
    known_hosts_inventory,
)
from gpuhost.rollout.hostkeys import host_key_message
from gpuhost.rollout.report import (
    CANCELED,
    REPORT_SCHEMA,
    HostOutcome,
    HostStatus,
    RolloutReport,
    TaskProgress,
    TaskResult,
)
from gpuhost.targets import Target

# The name of gpuhost.passthrough.site's second play begins so: its tasks on a host mean that host's batch began.
CONFIGURE_PLAY_PREFIX = "Configure for passthrough"
# Steps of apply worth a progress line even when nothing changed.
APPLY_KEY_TASKS = ("planner", "Reboot", "Verify")
# gpuhost_verify's fact on a host its BMC power-cycled (action, bmc, deadline_passed, sent_at,
# answered_at): the report's `power_cycled`, whether the trial then committed or was reverted.
POWER_CYCLE_FACT = "gpuhost_verify_power_cycle"
# How often a run checks for Ctrl-C (ansible-runner's pexpect_timeout; its default is 5 s).
CANCEL_CHECK_SECONDS = 0.5
# What cancels a run as Ctrl-C does: SIGHUP is the terminal closing under it (an SSH session that
# dropped), SIGTERM a service manager or kill. Each stops ansible-playbook and all it started.
CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After Ctrl-C, how long ansible-playbook has to stop its workers before its process group is killed.
CANCEL_GRACE_SECONDS = 3.0
_SERIAL = re.compile(r"[0-9]{1,4}%?(?:,[0-9]{1,4}%?)*")

Progress = Callable[[TaskProgress], None]


@dataclass(frozen=True)
class ApplyRequest:
    inventory: Path
    limit: tuple[str, ...]  # ansible_limit(): exact host patterns, one per line of a limit file
    check: bool
    serial: tuple[int | str, ...]
    max_fail_percentage: int
    report_path: Path
    trial: bool = True  # False: --no-trial
    require_rescue: bool = False  # --require-rescue
    command: str = ""  # written in each host's lock (gpuhost.hostlock): who holds the host
    break_lock: bool = False  # --break-lock


@dataclass(frozen=True)
class RollbackRequest:
    inventory: Path
    limit: tuple[str, ...]  # ansible_limit()
    reboot_timeout: int
    command: str = ""  # written in each host's lock
    break_lock: bool = False  # --break-lock


def parse_serial(text: str) -> tuple[int | str, ...]:
    """--serial '1,20%' -> (1, '20%'), Ansible's serial. Ansible reads a batch of 0 (or 0%) as every
    remaining host at once, which is no rolling at all: each batch is at least one host, at most 100%."""
    fix = "give batch sizes as N or N%, comma-separated, each at least 1 host and at most 100% (e.g. 1,20%)"
    if not _SERIAL.fullmatch(text):
        raise InputError(f"--serial {text!r}: {fix}.")
    batches = tuple(item if item.endswith("%") else int(item) for item in text.split(","))
    for batch in batches:
        size = int(batch[:-1]) if isinstance(batch, str) else batch
        if size < 1 or (isinstance(batch, str) and size > 100):
            raise InputError(
                f"--serial {text!r}: a batch of {batch} {'is no host' if size < 1 else 'is over 100%'}; {fix}."
            )
    return batches


def rollout_options(serial: str, max_fail_percentage: int) -> tuple[tuple[int | str, ...], int]:
    """apply's rollout options, validated together before anything connects: Ansible's serial
    (parse_serial) and max_fail_percentage."""
    batches = parse_serial(serial)
    if not 0 <= max_fail_percentage <= 100:
        raise InputError(f"--max-fail-percentage {max_fail_percentage}: give a percentage from 0 to 100.")
    return batches, max_fail_percentage


def stop_outcome(kind: str, task: str, result: Mapping[str, Any]) -> HostOutcome:
    """What stopped a host, for apply's and rollback's reports: trial reverted, unreachable (also a
    reboot it never came back from, or a host key that changed) or failed, with Ansible's message."""
    # A failed command's stderr can be megabytes: the report and the table quote a bounded part.
    message = shortened(_result_message(result))
    if message.startswith("trial reverted"):
        return HostOutcome(HostStatus.TRIAL_REVERTED, message)
    if message.startswith(LOCKED_PREFIX):  # another run holds the host: nothing of this run touched it
        return HostOutcome(HostStatus.LOCKED, message)
    if kind == "runner_on_unreachable":
        return HostOutcome(HostStatus.UNREACHABLE, host_key_message(message) or message)
    if result.get("bmc_error"):  # the rescue of a trial reboot: the host is down and its BMC did not help
        return HostOutcome(
            HostStatus.UNREACHABLE,
            f"did not come back from the trial reboot by its deadline, and power-cycling it through its BMC "
            f"failed: {message}",
        )
    if "planner" in task and "refuses to configure" in message:
        return HostOutcome(HostStatus.REFUSED, message)
    if task.startswith("Reboot") and ("Timed out" in message or "timed out" in message):
        return HostOutcome(HostStatus.UNREACHABLE, f"did not come back from the reboot within the timeout: {message}")
    return HostOutcome(HostStatus.FAILED, f"{task}: {message}")


def _result_message(result: Mapping[str, Any]) -> str:
    """A task result's message. A loop's says only 'All items completed': each item's result holds the
    cause (rollback's first task loops over files, and a changed host key stops its first item)."""
    message = str(result.get("msg") or result.get("stderr") or "").strip()
    items = result.get("results")
    if isinstance(items, list):
        stopped = [
            item
            for item in items
            if isinstance(item, Mapping) and (item.get("unreachable") or item.get("failed")) and item.get("msg")
        ]
        if stopped:
            return str(stopped[0]["msg"]).strip()
    return message


class EventTracker:
    """ansible-runner's events of one run -> what stopped each host, which hosts it reached and
    rebooted, and progress lines (failures, changes, and `key_tasks` even when unchanged)."""

    def __init__(
        self, progress: Progress, key_tasks: tuple[str, ...] = (), echo: Callable[[str], None] | None = None
    ) -> None:
        self.progress = progress
        # -v: each event's own text (Ansible's output), for the CLI to escape and print. Not
        # ansible-runner's printing: that passed the inventory's and the hosts' bytes on raw.
        self.echo = echo
        self.key_tasks = key_tasks
        self.started = time.monotonic()
        self.task = ""
        self.stopped: dict[str, HostOutcome] = {}  # the failure that stopped each host
        self._stopped_task: dict[str, str] = {}  # the task of each of those failures
        self.reached: set[str] = set()  # hosts whose batch began (the configure play ran a task on them)
        self.rebooted: set[str] = set()  # hosts a reboot task brought back (the report play may not run)
        # Hosts power-cycled through their BMC (gpuhost_verify's fact): a reverted trial stops its host,
        # so the report play never writes that host's entry, and the CLI's must still say it.
        self.power_cycled: dict[str, dict[str, Any]] = {}
        self.in_run: set[str] = set()  # hosts of this run (the report play lists every inventory host)
        self.playbook_pid: int | None = None  # ansible-playbook's own process (it emits playbook_on_start)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        if self.echo is not None and event.get("stdout"):
            self.echo(str(event["stdout"]))
        if kind == "playbook_on_start" and isinstance(event.get("pid"), int):
            self.playbook_pid = event["pid"]
        if kind == "playbook_on_task_start":
            self.task = str(data.get("task", ""))
            return True
        host = str(data.get("host") or "")
        if not host:
            return True
        task = str(data.get("task") or self.task)
        result = data.get("res", {}) or {}
        self.in_run.add(host)
        if str(data.get("play", "")).startswith(CONFIGURE_PLAY_PREFIX):
            self.reached.add(host)
        if kind == "runner_on_ok" and task.startswith("Reboot") and result.get("rebooted"):
            self.rebooted.add(host)
        cycle = (result.get("ansible_facts") or {}).get(POWER_CYCLE_FACT) if kind == "runner_on_ok" else None
        if isinstance(cycle, Mapping):
            self.power_cycled[host] = dict(cycle)
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            # The trial reboot's failure is rescued (the BMC's power cycle, gpuhost_verify): what the
            # rescue ends with, a failure or a task that ran, is the host's outcome instead.
            if host not in self.stopped or self._stopped_task.get(host, "").startswith("Reboot"):
                self.stopped[host] = stop_outcome(kind, task, result)
                self._stopped_task[host] = task
        elif kind == "runner_on_ok" and self._stopped_task.get(host, "").startswith("Reboot"):
            del self.stopped[host], self._stopped_task[host]
        line = self._progress(kind, host, task, result)
        if line is not None:
            self.progress(line)
        return True

    def _progress(self, kind: str, host: str, task: str, result: Mapping[str, Any]) -> TaskProgress | None:
        key = any(name in task for name in self.key_tasks)
        if kind == "runner_on_failed":
            outcome = TaskResult.FAILED
        elif kind == "runner_on_unreachable":
            outcome = TaskResult.UNREACHABLE
        elif kind == "runner_on_ok" and result.get("changed"):
            outcome = TaskResult.CHANGED
        elif kind == "runner_on_ok" and key:
            outcome = TaskResult.OK
        else:
            return None
        detail = str(result.get("msg", "")) if outcome is not TaskResult.CHANGED or key else ""
        diff = tuple(_diff_lines(result["diff"])) if result.get("changed") and result.get("diff") else ()
        return TaskProgress(time.monotonic() - self.started, host, outcome, task, detail, diff)


def apply(
    request: ApplyRequest, targets: Sequence[Target], progress: Progress, echo: Callable[[str], None] | None = None
) -> RolloutReport:
    """Run gpuhost.passthrough.site on the hosts `targets` (the inventory read once, validated) and write the report."""
    # The playbook writes beside the report; the report itself is replaced, whole, only by a run
    # that was not canceled, so Ctrl-C never turns the last report into an empty one.
    final_report = request.report_path
    report = final_report.with_name(f".{final_report.name}.partial")
    tracker = EventTracker(progress, APPLY_KEY_TASKS, echo)
    report.unlink(missing_ok=True)
    extravars: dict[str, Any] = {
        "gpuhost_serial": list(request.serial),
        "gpuhost_max_fail_percentage": request.max_fail_percentage,
        "gpuhost_report_path": str(report),
    }
    if not request.trial:
        # Only --no-trial is an extra var: without it, an inventory's own gpuhost_trial_boot holds.
        extravars["gpuhost_trial_boot"] = False
    if request.require_rescue:
        extravars["gpuhost_require_rescue"] = True
    extravars.update(_lock_variables(request.command, request.break_lock))
    stats, rc, status = run_playbook(
        SITE_PLAYBOOK,
        request.inventory,
        request.limit,
        extravars,
        "--check --diff" if request.check else "--diff",
        targets,
        tracker,
    )
    data: dict[str, Any] = {"schema": REPORT_SCHEMA, "hosts": {}}
    if report.is_file():
        data = json.loads(report.read_text())
    if not data.get("hosts"):
        data["hosts"] = _recap_hosts(stats, tracker.reached)
    if status == CANCELED:
        data["hosts"] = _interrupted_hosts(tracker)
    # Hosts that --limit left out: not part of this run, so not part of its report.
    if tracker.in_run:
        data["hosts"] = {host: entry for host, entry in data["hosts"].items() if host in tracker.in_run}
    for host, outcome in tracker.stopped.items():
        entry = data["hosts"].setdefault(host, {})
        if entry.get("status") != HostStatus.REFUSED.value:
            entry.update(status=outcome.status.value, message=outcome.message)
    for host in tracker.rebooted:
        data["hosts"].setdefault(host, {})["rebooted"] = True
    for host, cycle in tracker.power_cycled.items():
        data["hosts"].setdefault(host, {}).setdefault("power_cycled", cycle)
    data["ansible_stats"] = stats
    data["ansible_rc"] = rc
    data["ansible_status"] = status
    data["seconds"] = round(time.monotonic() - tracker.started, 1)
    report.unlink(missing_ok=True)
    # A canceled run that reached no host changed nothing: the last report stays.
    if status != CANCELED or data["hosts"]:
        write_output(final_report, json.dumps(data, indent=2) + "\n", "--report")
    return RolloutReport(data)


def _interrupted_hosts(tracker: EventTracker) -> dict[str, dict[str, Any]]:
    """Each host of a canceled run (Ctrl-C, SIGTERM, SIGHUP): what stopped it, else where the run was."""
    trial = tracker.task.startswith("Reboot")
    hosts: dict[str, dict[str, Any]] = {}
    for host in sorted(tracker.in_run - {"localhost"}):
        if host not in tracker.reached:
            message = "the run was interrupted before this host's batch: nothing was changed"
            hosts[host] = {"status": HostStatus.NOT_REACHED.value, "message": message}
        elif trial:
            message = (
                "the run was interrupted while this host rebooted into its trial: it is left to its rescue (the "
                "trial boots once; an unverified trial reverts at its deadline, or by the watchdog the plan armed). "
                "Audit it once it is back."
            )
            hosts[host] = {"status": HostStatus.NOT_REPORTED.value, "message": message}
        else:
            message = f"the run was interrupted during this host's batch (at task {tracker.task!r}); audit it"
            hosts[host] = {"status": HostStatus.NOT_REPORTED.value, "message": message}
    return hosts


def _recap_hosts(stats: Mapping[str, Any], reached: set[str]) -> dict[str, dict[str, str]]:
    """The report play did not run (the rollout was stopped): what Ansible's recap knows."""
    failed = {**stats.get("failures", {}), **stats.get("dark", {})}
    seen = set(stats.get("ok", {})) | set(failed)
    hosts: dict[str, dict[str, str]] = {}
    for host in sorted(seen - {"localhost"}):
        if host in failed:
            hosts[host] = {"status": HostStatus.FAILED.value}
        elif host in reached:
            hosts[host] = {"status": HostStatus.NOT_REPORTED.value}
        else:
            hosts[host] = {
                "status": HostStatus.NOT_REACHED.value,
                "message": "the rollout stopped before this host's batch: nothing was changed",
            }
    return hosts


def rollback(
    request: RollbackRequest, targets: Sequence[Target], progress: Progress, echo: Callable[[str], None] | None = None
) -> dict[str, HostOutcome]:
    """Run gpuhost.passthrough.rollback on `targets`; what stopped each host that failed (the others ran through)."""
    tracker = EventTracker(progress, echo=echo)
    # What is undone is gpuhost.passthrough.rollback_plan's (gpuhost.plan.rollback), on the host.
    extravars = {
        "gpuhost_verify_reboot_timeout": request.reboot_timeout,
        **_lock_variables(request.command, request.break_lock),
    }
    _, _, status = run_playbook(
        ROLLBACK_PLAYBOOK,
        request.inventory,
        request.limit,
        extravars,
        "--diff",
        targets,
        tracker,
    )
    if status == CANCELED:  # Ctrl-C: no host may be read back and called rolled back
        raise KeyboardInterrupt
    return dict(tracker.stopped)


def _lock_variables(command: str, break_lock: bool) -> dict[str, Any]:
    """The host lock's extra vars: the command it names, and --break-lock."""
    variables: dict[str, Any] = {"gpuhost_run_command": command} if command else {}
    if break_lock:
        variables["gpuhost_break_lock"] = True
    return variables


def run_playbook(
    playbook: str | Path,
    inventory: Path,
    limit: Sequence[str],
    extravars: Mapping[str, Any],
    cmdline: str,
    targets: Sequence[Target],
    tracker: EventTracker,
) -> tuple[dict[str, Any], int, str]:
    """Run `playbook` (a collection playbook's name, or a file) on the hosts of `targets` with
    gpuhost's Ansible environment and their known_hosts files; `tracker` sees every event.
    Ansible's recap (stats), return code, status."""
    try:
        import ansible_runner
    except ImportError as error:
        raise MissingDependencyError("ansible-runner", "controller", "Running the playbooks") from error
    if not limit:  # an empty limit is no limit to Ansible: every host
        raise InputError("no hosts selected: nothing to run the playbook on.")
    environment = dict(ansible_environment())
    with _private_directory() as private, _ctrl_c_cancels(tracker) as cancel:
        # A limit file: its lines are read as they are, not split at ',' or ':' as a --limit argument is.
        limit_file = Path(private) / "limit"
        limit_file.write_text("\n".join(limit))
        wrapper = _stdin_closed(Path(private), environment["PATH"])
        if wrapper is not None:
            environment["PATH"] = f"{wrapper}{os.pathsep}{environment['PATH']}"
        runner = ansible_runner.run(
            private_data_dir=private,
            playbook=str(playbook),
            inventory=inventory_sources(inventory.resolve(), known_hosts_inventory(targets), Path(private)),
            limit=f"@{limit_file}",
            extravars=dict(extravars),
            cmdline=cmdline,
            envvars=environment,
            event_handler=tracker,
            quiet=True,  # -v: the tracker's echo prints Ansible's output, escaped
            suppress_env_files=True,
            cancel_callback=cancel,
            settings={"pexpect_timeout": CANCEL_CHECK_SECONDS},  # how often `cancel` is asked
        )
        stats: dict[str, Any] = runner.stats or {}  # read from the artifacts, before they go
        if runner.rc not in (0, None) and tracker.playbook_pid is None and not cancel.requested:
            # ansible-playbook stopped before its first event: its own error line is the only cause.
            said = _ansible_error(runner)
            if said:
                raise GpuhostError(f"ansible-playbook stopped before it ran anything: {said}")
        # ansible-playbook may stop on its own after our SIGTERM, before the runner asks `cancel`.
        return stats, runner.rc, CANCELED if cancel.requested else runner.status


@contextmanager
def _private_directory() -> Iterator[str]:
    """The run's own directory (ansible-runner's artifacts, the limit file); a temporary directory
    that cannot be made is said as such, with the fix, not as a traceback."""
    try:
        directory = tempfile.TemporaryDirectory(prefix="gpuhost-rollout-")
    except OSError as error:
        raise InputError(
            f"cannot make a temporary directory for the Ansible run ({error}; TMPDIR="
            f"{os.environ.get('TMPDIR', 'unset')}). Set TMPDIR to a writable directory."
        ) from error
    with directory as private:
        yield private


def _stdin_closed(directory: Path, path: str) -> Path | None:
    """A directory whose `ansible-playbook` runs the real one with its standard input closed
    (/dev/null): ansible-runner gives it a terminal, at which a prompt (a pause, a vars_prompt)
    would wait for a person no one is; without one, Ansible goes on without asking. The run's own
    directory, or (a temporary directory mounted noexec) one under ~/.cache/gpuhost; None where no
    such directory can run it (Ansible's own prompts stay off: rollout_environment)."""
    import hashlib
    import shlex
    import shutil

    real = shutil.which("ansible-playbook", path=path)
    if real is None:
        raise MissingDependencyError("ansible-core", "controller", "Running the playbooks")
    text = f'#!/bin/sh\nexec {shlex.quote(real)} "$@" </dev/null\n'
    cache = Path.home() / ".cache/gpuhost/stdin-closed" / hashlib.sha256(text.encode()).hexdigest()[:16]
    for candidate in (directory / "bin", cache):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
            if os.statvfs(candidate).f_flag & os.ST_NOEXEC:
                continue
            staged = candidate / f".ansible-playbook.{os.getpid()}"
            staged.write_text(text)
            staged.chmod(0o700)
            staged.replace(candidate / "ansible-playbook")  # whole, for a run beside this one
        except OSError:
            continue
        return candidate
    return None


def _ansible_error(runner: Any) -> str:
    """Why ansible-playbook stopped before it ran anything: its ERROR lines (the locale, an unwritable
    temporary directory, a bad option), else its last line."""
    try:
        text = runner.stdout.read()
    except (OSError, ValueError, AttributeError):
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR", "[ERROR]"))]
    return shortened(" ".join(errors or lines[-1:]))


class _Cancel:
    """ansible-runner's cancel_callback for Ctrl-C, stopping the run the way Ansible stops itself.

    ansible-runner's own handling SIGKILLs ansible-playbook's process group, but Ansible's workers
    run in sessions of their own (setsid), so the task in progress and its ssh went on running for
    the task's whole length. ansible-playbook's SIGTERM handler signals every worker's process group;
    it gets CANCEL_GRACE_SECONDS for that before the runner kills what is left."""

    def __init__(self, tracker: EventTracker) -> None:
        self.tracker = tracker
        self.requested = False
        self._terminated_at: float | None = None

    def request(self, signum: int, frame: object) -> None:
        self.requested = True

    def __call__(self) -> bool:
        if not self.requested:
            return False
        pid = self.tracker.playbook_pid
        if pid is None:  # no event yet: nothing of the playbook ran, the runner may kill it at once
            return True
        if self._terminated_at is None:
            self._terminated_at = time.monotonic()
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                return True
        return time.monotonic() - self._terminated_at >= CANCEL_GRACE_SECONDS


@contextmanager
def _ctrl_c_cancels(tracker: EventTracker) -> Iterator[_Cancel]:
    """SIGINT (and SIGTERM, SIGHUP) cancel the run instead of raising KeyboardInterrupt in the middle of
    ansible-runner, which would leave the playbook running; the handlers are restored afterwards."""
    cancel = _Cancel(tracker)
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers; none to set
        yield cancel
        return
    previous = {number: signal.signal(number, cancel.request) for number in CANCEL_SIGNALS}
    try:
        yield cancel
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


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
