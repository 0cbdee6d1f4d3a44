"""gpuhost.passthrough.bmc_power_cycle: power-cycle the play's host once through its BMC (gpuhost_bmc).

An action plugin: it runs on the controller (or AWX's execution environment), where the BMC's
network is, and reads the password itself from the host's variables (a vaulted
gpuhost_bmc_password) or the controller's environment (gpuhost_bmc.password_env). The password is
never a task argument, so it cannot reach Ansible's output, a callback or a log; no message or
result here carries it.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.host import HostReadError, require_gpuhost


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False  # the host is down: only the BMC is talked to

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = str(task_vars.get("inventory_hostname", "host"))
        try:
            require_gpuhost()
        except HostReadError as error:
            return {**result, "failed": True, "msg": str(error)}
        from gpuhost.errors import GpuhostError
        from gpuhost.inventory.bmc import BMC_VARIABLE, PASSWORD_VARIABLE, bmc_password, parse_bmc, password_marker
        from gpuhost.transport.bmc import DEFAULT_TIMEOUT_S, BmcError, power_cycle

        where = f"inventory host {host}"
        timeout = float(self._task.args.get("timeout", DEFAULT_TIMEOUT_S))
        try:
            variables = {
                BMC_VARIABLE: self._templar.template(task_vars.get(BMC_VARIABLE)),
                # Whether it is set, and how (vaulted, or in clear: refused, as the CLI refuses it, also for
                # a playbook run without gpuhost's CLI); the value itself is decrypted below.
                PASSWORD_VARIABLE: None
                if task_vars.get(PASSWORD_VARIABLE) is None
                else password_marker(task_vars.get(PASSWORD_VARIABLE)),
            }
            endpoint = parse_bmc(variables, where)
            if endpoint is None:
                return {**result, "failed": True, "bmc_error": "not configured", "msg": f"{where}: no {BMC_VARIABLE}."}
            if self._task.check_mode:
                return {**result, "changed": True, "msg": f"would power-cycle {host} through {endpoint.url}"}
            vaulted = None if endpoint.password_env else self._templar.template(task_vars.get(PASSWORD_VARIABLE))
            password = bmc_password(endpoint, None if vaulted is None else str(vaulted), where)
            cycle = power_cycle(endpoint, password, host, timeout)
        except BmcError as error:
            return {**result, "failed": True, "bmc_error": error.kind.value, "msg": str(error)}
        except GpuhostError as error:
            return {**result, "failed": True, "bmc_error": "invalid gpuhost_bmc", "msg": str(error)}
        return {
            **result,
            "changed": True,
            "action": cycle.action,
            "protocol": endpoint.protocol.value,
            "bmc": endpoint.url,
            "state_before": cycle.state_before.value,
            "sent_at": cycle.sent_at.isoformat(timespec="seconds"),
            "msg": f"{cycle.action} sent to {endpoint.url} at {cycle.sent_at.isoformat(timespec='seconds')}",
        }
