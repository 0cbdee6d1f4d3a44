"""gpuhost.passthrough.audit: `gpuhost audit` of the play's host, read-only, as the fact gpuhost_audit."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.host import HostReadError, audit_host


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # it writes nothing on the host, in check mode or not

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        try:
            audit = audit_host(self, task_vars or {})
        except HostReadError as error:
            return {**result, "failed": True, "msg": str(error)}
        # A host that could not be audited is not failed here: its object (with the error) must
        # become a fact first, as Ansible keeps no facts of a failed task; the playbook fails it next.
        result.update(changed=False, audit=audit, ansible_facts={"gpuhost_audit": audit})
        counts = audit["counts"]
        result["msg"] = (
            f"{audit['status']}: {audit['error']}"
            if audit["error"] is not None
            else f"{audit['status']} ({counts['error']} error(s), {counts['warning']} warning(s))"
        )
        return result
