"""gpuhost.passthrough.verify: read the host again and judge it against its plan with the audit's checks."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.host import HostReadError, read_host


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        plan = self._task.args.get("plan")
        enforce = bool(self._task.args.get("enforce", True))
        if not isinstance(plan, dict):
            return {**result, "failed": True, "msg": "verify needs plan: the gpuhost.passthrough.plan result"}
        try:
            reading = read_host(self, task_vars or {})
        except HostReadError as error:
            return {**result, "failed": True, "msg": str(error)}
        from gpuhost.plan.verify import verify_host

        verification = verify_host(reading.host, reading.facts, reading.settings, plan).to_json()
        result.update(changed=False, verification=verification, ansible_facts={"gpuhost_verification": verification})
        result["msg"] = verification["summary"]
        if enforce and not verification["ok"]:
            result["failed"] = True
        return result
