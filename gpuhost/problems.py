"""One vocabulary for "something is wrong": a `Problem` with a registered code.

The audit's findings, the planner's refusals, render's conflicts, the playbook's verification and
the smoke-test's findings are all `Problem`s. Every code is registered once, next to the code that
produces it, with the stage that produces it and a one-line summary; the tables of
docs/reference/problem-codes.md are checked against this registry, and a test fails when a
registered code is produced by no test.

Registering is one line at module level:

    GROUP_SHARED = register("gpu.group.shared", Stage.AUDIT, Severity.ERROR, "several GPUs in one IOMMU group")

and a check then returns `Problem(GROUP_SHARED, ...)`-shaped values through its context helper.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Severity(str, enum.Enum):
    """How much a problem matters. An error blocks (NOT READY, refused, FAIL); a warning does not."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for the most severe: sort by it."""
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


class Stage(str, enum.Enum):
    """Which step of gpuhost produces a code (the problem-code table it belongs to)."""

    AUDIT = "audit"  # gpuhost audit: a finding about a host or guest
    PLAN = "plan"  # gpuhost plan/apply: a refusal, nothing is written to that host
    RENDER = "render"  # gpuhost render / guest up: a conflict, no domain XML is produced
    VERIFY = "verify"  # after apply's reboot: the host does not match its plan
    SMOKE_TEST = "smoke-test"  # gpuhost smoke-test: a finding about the GPU's health or performance

    @property
    def namespace(self) -> str | None:
        """The prefix of every code of this stage ('plan.'); None for the audit's, which name their
        subject (gpu.group.intruder, iommu.active) and may take no other stage's namespace."""
        return _NAMESPACES.get(self)


_NAMESPACES = {Stage.PLAN: "plan.", Stage.RENDER: "render.", Stage.VERIFY: "verify.", Stage.SMOKE_TEST: "smoke."}


@dataclass(frozen=True)
class ProblemCode:
    """A registered code: stable, documented, produced by at least one test."""

    code: str
    stage: Stage
    severity: Severity | None  # None: the severity depends on the case (documented in the summary)
    summary: str


_REGISTRY: dict[str, ProblemCode] = {}
REGISTRY: Mapping[str, ProblemCode] = MappingProxyType(_REGISTRY)


class UnregisteredCodeError(LookupError):
    """A programming error: a Problem was made with a code nobody registered."""


def register(code: str, stage: Stage, severity: Severity | None, summary: str) -> str:
    """Register `code` once (at import time) and return it, for use as a module constant.

    A code starts with its stage's namespace (plan.group.intruder), and an audit code with none of
    the others' (gpu.group.intruder), so the same words never name two stages' problems."""
    namespace = stage.namespace
    if namespace is not None and not code.startswith(namespace):
        raise ValueError(f"problem code {code!r} of stage {stage.value} must start with {namespace!r}")
    taken = next((other for other in _NAMESPACES.values() if code.startswith(other)), None)
    if namespace is None and taken is not None:
        raise ValueError(f"audit problem code {code!r} is in another stage's namespace {taken!r}")
    known = _REGISTRY.get(code)
    entry = ProblemCode(code, stage, severity, summary)
    if known is not None and known != entry:
        raise ValueError(f"problem code {code!r} is registered twice, differently: {known} and {entry}")
    _REGISTRY[code] = entry
    return code


def codes_of(stage: Stage) -> tuple[ProblemCode, ...]:
    return tuple(sorted((entry for entry in _REGISTRY.values() if entry.stage is stage), key=lambda e: e.code))


@dataclass(frozen=True)
class Problem:
    """One thing that is wrong (or worth knowing), about one subject of one host or GPU."""

    code: str  # a registered code, e.g. gpu.group.intruder
    severity: Severity
    subject: str  # what it is about: a PCI function, 'IOMMU', a file, a metric, ...
    message: str  # the fact, naming the host and the device or value
    remedy: str = ""  # what to do about it ('' when nothing needs doing)

    def __post_init__(self) -> None:
        entry = _REGISTRY.get(self.code)
        if entry is None:
            raise UnregisteredCodeError(f"problem code {self.code!r} is not registered (gpuhost.problems.register)")
        if entry.severity is not None and entry.severity is not self.severity:
            raise ValueError(
                f"problem code {self.code!r} is registered as {entry.severity.value}, not {self.severity.value}"
            )

    def __str__(self) -> str:
        return f"{self.message} Fix: {self.remedy}" if self.remedy else self.message

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "subject": self.subject,
            "message": self.message,
            "remedy": self.remedy,
        }


def errors(problems: Iterable[Problem]) -> tuple[Problem, ...]:
    return tuple(problem for problem in problems if problem.severity is Severity.ERROR)


# How many items a finding's message names before it says "and N more" (the JSON's fields and the
# table carry every address; a message naming 300 GPUs, once per GPU, made the report quadratic).
LISTED_LIMIT = 8


def listed(items: Iterable[str], limit: int = LISTED_LIMIT) -> str:
    """`items` comma-separated, at most `limit` of them, then how many were left out."""
    names = list(items)
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown
