"""gpuhost.passthrough.plan: the desired state of this host, computed by gpuhost's Python planner."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.host import HostReadError, read_host


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        try:
            reading = read_host(self, task_vars or {})
        except HostReadError as error:
            return {**result, "failed": True, "msg": str(error)}
        from gpuhost.plan import plan_host

        plan = plan_host(reading.host, reading.facts, reading.settings).to_json()
        result.update(changed=False, plan=plan, ansible_facts={"gpuhost_plan": plan})
        if plan["refusals"]:
            result["failed"] = True
            result["msg"] = "gpuhost refuses to configure this host; nothing was written:\n" + "\n".join(
                f"- {r['message']} Fix: {r['remedy']}" for r in plan["refusals"]
            )
        else:
            result["msg"] = (
                f"{len(plan['functions'])} function(s) to vfio-pci by {plan['bind_by']}; "
                f"{plan['hugepages']['pages']} x 1 GiB huge pages; "
                + ("reboot needed: " + "; ".join(plan["reboot_reasons"]) if plan["reboot_needed"] else "no reboot")
            )
        return result
