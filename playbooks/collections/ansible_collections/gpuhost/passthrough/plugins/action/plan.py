"""gpuhost.passthrough.plan: the desired state of this host, computed by gpuhost's Python planner."""

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
        try:
            from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import (
                gather_facts,
                gpuhost_variables,
            )

            from gpuhost.errors import GpuhostError
            from gpuhost.plan import PlanSettings, plan_host
            from gpuhost.transport import TransportError
        except ImportError as error:
            from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import MISSING_GPUHOST

            return {**result, "failed": True, "msg": f"{MISSING_GPUHOST} ({error})"}
        variables = gpuhost_variables(self, task_vars)
        try:
            settings = PlanSettings.from_variables(variables, f"inventory host {host}")
            facts = gather_facts(self, host)
        except (GpuhostError, TransportError) as error:
            return {**result, "failed": True, "msg": str(error)}
        plan = plan_host(host, facts, settings).to_json()
        result.update(changed=False, plan=plan, ansible_facts={"gpuhost_plan": plan})
        if plan["refusals"]:
            result["failed"] = True
            result["msg"] = "gpuhost refuses to configure this host; nothing was written:\n" + "\n".join(
                f"- {r['message']} Fix: {r['fix']}" for r in plan["refusals"]
            )
        else:
            result["msg"] = (
                f"{len(plan['functions'])} function(s) to vfio-pci by {plan['bind_by']}; "
                f"{plan['hugepages']['pages']} x 1 GiB huge pages; "
                + ("reboot needed: " + "; ".join(plan["reboot_reasons"]) if plan["reboot_needed"] else "no reboot")
            )
        return result
