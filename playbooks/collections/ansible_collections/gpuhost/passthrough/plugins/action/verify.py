"""gpuhost.passthrough.verify: read the host again and judge it against its plan with the audit's checks."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = str(task_vars.get("inventory_hostname", "host"))
        plan = self._task.args.get("plan")
        enforce = bool(self._task.args.get("enforce", True))
        if not isinstance(plan, dict):
            return {**result, "failed": True, "msg": "verify needs plan: the gpuhost.passthrough.plan result"}
        try:
            from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import (
                gather_facts,
                gpuhost_variables,
            )

            from gpuhost.errors import GpuhostError
            from gpuhost.plan import PlanSettings
            from gpuhost.plan.verify import verify_host
            from gpuhost.transport import TransportError
        except ImportError as error:
            from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import MISSING_GPUHOST

            return {**result, "failed": True, "msg": f"{MISSING_GPUHOST} ({error})"}
        try:
            settings = PlanSettings.from_variables(gpuhost_variables(self, task_vars), f"inventory host {host}")
            facts = gather_facts(self, host)
        except (GpuhostError, TransportError) as error:
            return {**result, "failed": True, "msg": str(error)}
        verification = verify_host(host, facts, settings, plan)
        result.update(changed=False, verification=verification, ansible_facts={"gpuhost_verification": verification})
        result["msg"] = verification["summary"]
        if enforce and not verification["ok"]:
            result["failed"] = True
        return result
