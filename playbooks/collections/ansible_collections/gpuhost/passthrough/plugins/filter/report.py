"""gpuhost.passthrough.report_entry: one host's entry of the apply report, from its host variables;
gpuhost.passthrough.audit_lines: the audit playbook's report, as `gpuhost audit --json` prints it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def report_entry(hostvars: Mapping[str, Any], check_mode: bool = False) -> dict[str, Any]:
    _require_gpuhost()
    from gpuhost.rollout.report import HostStatus

    planned = hostvars.get("gpuhost_plan_result") or {}
    plan = planned.get("plan") or {}
    verified = (hostvars.get("gpuhost_verify_result") or {}).get("verification")
    reboot = hostvars.get("gpuhost_verify_reboot") or {}
    if not planned:
        status = HostStatus.UNREACHABLE_OR_NOT_RUN.value
    elif plan.get("refusals"):
        status = HostStatus.REFUSED.value
    elif planned.get("failed"):
        status = HostStatus.FAILED.value
    elif verified is None:
        status = HostStatus.NOT_VERIFIED.value
    else:
        status = verified.get("status", HostStatus.UNKNOWN.value)  # the verification's ready or not-ready
    return {
        "status": status,
        "message": planned.get("msg"),
        "refusals": plan.get("refusals", []),
        "reboot_needed": plan.get("reboot_needed"),
        "reboot_reasons": plan.get("reboot_reasons", []),
        "rebooted": bool(reboot.get("rebooted")) and not check_mode,  # check mode only says it would
        "reboot_seconds": reboot.get("elapsed"),
        "kernel_options": plan.get("kernel_options", []),
        "functions": [f.get("address") for f in plan.get("functions", [])],
        "hugepages": (plan.get("hugepages") or {}).get("pages"),
        "verification": verified,
        # A trial that never answered, power-cycled through the BMC: action, bmc, deadline_passed,
        # sent_at, answered_at (UTC; answered_at null: it never did). Absent otherwise.
        **(
            {"power_cycled": dict(hostvars["gpuhost_verify_power_cycle"])}
            if hostvars.get("gpuhost_verify_power_cycle")
            else {}
        ),
    }


def audit_lines(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> str:
    """One JSON object per host and line, in `hosts`' order: each host's gpuhost_audit fact, or, for a
    host the play never audited (Ansible could not reach it before the audit task), the object
    `gpuhost audit --json` prints for a host it could not reach."""
    lines = []
    for host in hosts:
        audit = (hostvars.get(host) or {}).get("gpuhost_audit")
        lines.append(json.dumps(dict(audit) if audit else _not_reached(str(host))) + "\n")
    return "".join(lines)


def _require_gpuhost() -> None:
    """gpuhost importable, or the filter fails with the message that says how to install it."""
    from ansible.errors import AnsibleFilterError
    from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.host import HostReadError, require_gpuhost

    try:
        require_gpuhost()
    except HostReadError as error:
        raise AnsibleFilterError(str(error)) from error


def _not_reached(host: str) -> dict[str, Any]:
    _require_gpuhost()
    from gpuhost.audit import audit_to_json, not_audited
    from gpuhost.checks.base import AuditPolicy
    from gpuhost.selection import GpuSelector
    from gpuhost.targets import SSH, Target

    where = f"inventory host {host}"
    target = Target(name=host, kind=SSH, policy=AuditPolicy(gpus=GpuSelector.parse(None, where)))
    message = f"{host}: Ansible did not reach the audit task on this host (unreachable, or a task before it failed)"
    return audit_to_json(not_audited(target, message, "unreachable"))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"report_entry": report_entry, "audit_lines": audit_lines}
