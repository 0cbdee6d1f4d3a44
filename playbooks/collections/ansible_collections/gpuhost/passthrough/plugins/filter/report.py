"""gpuhost.passthrough.report_entry: one host's entry of the apply report, from its host variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def report_entry(hostvars: Mapping[str, Any], check_mode: bool = False) -> dict[str, Any]:
    planned = hostvars.get("gpuhost_plan_result") or {}
    plan = planned.get("plan") or {}
    verified = (hostvars.get("gpuhost_verify_result") or {}).get("verification")
    reboot = hostvars.get("gpuhost_verify_reboot") or {}
    if not planned:
        status = "unreachable-or-not-run"
    elif plan.get("refusals"):
        status = "refused"
    elif planned.get("failed"):
        status = "failed"
    elif verified is None:
        status = "not-verified"
    else:
        status = verified.get("status", "unknown")
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
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"report_entry": report_entry}
