"""gpuhost.passthrough.rollback_plan: what undoes gpuhost apply on this host, computed by gpuhost's
Python planner (gpuhost.plan.rollback) from the host's facts and what apply recorded there."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import AnsibleConnectionTransport
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
        from gpuhost.plan.rollback import BackupsUnreadable, parse_backups, plan_rollback, read_backups_command

        listing = AnsibleConnectionTransport(self, reading.host).run(["sh", "-c", read_backups_command()])
        try:
            backups = parse_backups(listing.stdout)
        except BackupsUnreadable as error:
            return {**result, "failed": True, "msg": f"{reading.host}: {error}"}
        plan = plan_rollback(reading.host, reading.facts, backups, reading.settings.verify_reboot_timeout).to_json()
        result.update(changed=False, plan=plan, ansible_facts={"gpuhost_rollback_plan": plan})
        result["msg"] = (
            f"{len(backups.copied)} file(s) to put back, {len(backups.absent)} path(s) apply made to remove, "
            f"gpuhost's own files and blocks removed; rebuilt on change: {', '.join(plan['rebuild'])}"
            + "".join(f"; {note}" for note in plan["notes"])
        )
        return result
