"""Typed outcomes of a rollout: per-host status and apply's report (schema gpuhost.apply/1).

The report's JSON keys and status strings are read by tests/lab/test_faults_lab.py and
playbooks/molecule: they stay exactly as they are; the enum only names them once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhost.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNUSABLE

REPORT_SCHEMA = "gpuhost.apply/1"
# ansible-runner's status of a run stopped by Ctrl-C (it handles SIGINT itself).
CANCELED = "canceled"


class HostStatus(str, enum.Enum):
    """A host's status in apply's report: the report play's (filter/report.py) and the engine's."""

    READY = "ready"
    NOT_READY = "not-ready"
    REFUSED = "refused"
    FAILED = "failed"
    NOT_VERIFIED = "not-verified"
    UNREACHABLE_OR_NOT_RUN = "unreachable-or-not-run"
    # The engine's own, from Ansible's events and recap when the report play did not say.
    UNREACHABLE = "unreachable"
    TRIAL_REVERTED = "trial reverted"
    LOCKED = "locked"  # another run holds the host (gpuhost.hostlock): refused at once, untouched
    NOT_REPORTED = "not-reported"
    NOT_REACHED = "not reached"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, value: object) -> HostStatus:
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN


class TaskResult(str, enum.Enum):
    """What one task did on one host, for progress lines."""

    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class HostOutcome:
    """What stopped a host (a failed or unreachable task), with the message a person reads."""

    status: HostStatus
    message: str


@dataclass(frozen=True)
class TaskProgress:
    """One progress line: a task's result on a host, `seconds` into the run."""

    seconds: float
    host: str
    result: TaskResult
    task: str
    detail: str = ""
    diff: tuple[str, ...] = ()  # unified diff lines of a changed file (--diff)


@dataclass(frozen=True)
class RolloutReport:
    """apply's report: `data` is the JSON written to --report (schema gpuhost.apply/1)."""

    data: Mapping[str, Any]

    @property
    def hosts(self) -> Mapping[str, Mapping[str, Any]]:
        hosts: Mapping[str, Mapping[str, Any]] = self.data.get("hosts", {})
        return hosts

    @property
    def check_mode(self) -> bool:
        return bool(self.data.get("check_mode"))

    @property
    def canceled(self) -> bool:
        """Stopped by Ctrl-C, SIGTERM or SIGHUP: the report says where each host was (a run that reached
        no host writes none, and the last one stays); the exit code is 130."""
        return self.data.get("ansible_status") == CANCELED

    @property
    def seconds(self) -> float | None:
        """How long the rollout ran (None in a report that does not say)."""
        seconds = self.data.get("seconds")
        return float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None

    def status(self, host: str) -> HostStatus:
        return HostStatus.of(self.hosts[host].get("status"))

    def rebooted(self, host: str) -> bool:
        return self.hosts[host].get("rebooted") is True

    def exit_code(self) -> int:
        """0 every host ready (check mode: ready or not-ready), 2 a host could not be reached (as
        audit and plan) or another run holds it, 130 interrupted (Ctrl-C), else 1; a run that
        reported no host is 1 too."""
        if self.canceled:
            return EXIT_INTERRUPTED
        statuses = [self.status(host) for host in self.hosts]
        if HostStatus.UNREACHABLE in statuses or HostStatus.LOCKED in statuses:
            return EXIT_UNUSABLE
        accepted = {HostStatus.READY, HostStatus.NOT_READY} if self.check_mode else {HostStatus.READY}
        good = self.data.get("ansible_rc") == 0 and all(status in accepted for status in statuses)
        return EXIT_OK if good and statuses else EXIT_FINDINGS
