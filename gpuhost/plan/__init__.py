"""The planner: what `gpuhost apply` makes true on a host, computed from its facts. Pure."""

from __future__ import annotations

from gpuhost.plan.model import HostPlan, PlanRefused
from gpuhost.plan.planner import plan_host
from gpuhost.plan.settings import PlanSettings

__all__ = ["HostPlan", "PlanRefused", "PlanSettings", "plan_host"]
