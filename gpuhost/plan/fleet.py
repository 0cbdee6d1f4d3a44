"""Plan many hosts: read each with the audit's gatherer and plan it with its inventory settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuhost.audit import audit_fleet
from gpuhost.errors import GpuhostError, shortened
from gpuhost.plan.model import HostPlan
from gpuhost.plan.planner import plan_host
from gpuhost.targets import Target


@dataclass(frozen=True)
class PlanOutcome:
    host: str
    plan: HostPlan | None
    error: str | None  # unreachable, or what the planner could not read


def plan_fleet(targets: Sequence[Target], forks: int, require_rescue: bool = False) -> list[PlanOutcome]:
    """Every target's plan; its settings were validated when its configuration was read.
    `require_rescue`: apply --require-rescue, which reaches the playbook's planner as an extra var."""
    settings = {target.name: target.require_config().plan for target in targets}
    if require_rescue:
        settings = {name: replace(plan, require_rescue=True) for name, plan in settings.items()}
    outcomes = []
    for audit in audit_fleet(targets, forks):
        name = audit.target.name
        if audit.facts is None:
            outcomes.append(PlanOutcome(name, None, audit.error or "could not be read"))
            continue
        try:
            outcomes.append(PlanOutcome(name, plan_host(name, audit.facts, settings[name]), None))
        except GpuhostError as error:
            outcomes.append(PlanOutcome(name, None, shortened(str(error))))
    return outcomes
