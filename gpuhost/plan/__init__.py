"""The planner: what `gpuhost apply` makes true on a host, computed from its facts. Pure."""

from __future__ import annotations

from gpuhost.inventory.plan_settings import PlanSettings
from gpuhost.plan.model import HostPlan, PlanRefused
from gpuhost.plan.planner import plan_host

__all__ = ["HostPlan", "PlanRefused", "PlanSettings", "plan_host"]
