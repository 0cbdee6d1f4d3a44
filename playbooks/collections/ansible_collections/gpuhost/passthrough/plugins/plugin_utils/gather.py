"""Facts of the play's host through the play's own connection (the controller runs gpuhost)."""

from __future__ import annotations

import base64
import shlex
import tempfile
from pathlib import Path
from typing import Any

# The archive is binary; Ansible hands stdout back as text, so it travels as base64. The exit
# status of the gather script (not of base64) is the command's, without pipefail (dash).
_WRAPPED = "exec 3>&1; status=$( { { %s; echo $? >&4; } | base64 -w 0 >&3; } 4>&1 ); exit $status"

# The one message of a collection installed where the gpuhost package is not (its first task says it).
MISSING_GPUHOST = (
    "the gpuhost.passthrough collection needs the gpuhost Python package (with its controller extra) in the "
    "Python that runs ansible-playbook: the controller, or the execution environment AWX/AAP runs the job in. "
    "Install it there (pip install 'gpuhost[controller]' from a gpuhost checkout or its wheel), or build the "
    "execution environment from gpuhost's execution-environment.yml, which installs it (docs/awx.md)."
)


class AnsibleConnectionTransport:
    """gpuhost's Transport protocol over an action plugin's connection."""

    def __init__(self, action: Any, host: str) -> None:
        self._action = action
        self._host = host
        self._round_trips = 0

    @property
    def description(self) -> str:
        return f"ansible://{self._host}"

    @property
    def round_trips(self) -> int:
        return self._round_trips

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 120.0) -> Any:
        from ansible.errors import AnsibleConnectionFailure

        from gpuhost.transport import CommandResult, TransportError

        self._round_trips += 1
        command = _WRAPPED % shlex.join(argv)
        try:
            result = self._action._low_level_execute_command(command, in_data=stdin, sudoable=True)
        except AnsibleConnectionFailure as error:
            # The audit reports it as the host's own error (as gpuhost audit does), not as a crash.
            raise TransportError("unreachable", f"{self._host}: {error}") from error
        stdout = result.get("stdout", "") or ""
        try:
            data = base64.b64decode(stdout.strip(), validate=True) if stdout.strip() else b""
        except ValueError:
            data = b""
        stderr = (result.get("stderr", "") or "").encode()
        return CommandResult(exit_status=int(result.get("rc", 1)), stdout=data, stderr=stderr)

    def close(self) -> None:
        pass


def gather_facts(action: Any, host: str) -> Any:
    """HostFacts of `host`, read with gpuhost's gather script through the action's connection."""
    from gpuhost.facts.build import build_facts
    from gpuhost.facts.gather import capture

    with tempfile.TemporaryDirectory(prefix="gpuhost-ansible-") as scratch:
        tree = capture(AnsibleConnectionTransport(action, host), Path(scratch) / "snapshot", host)
        return build_facts(tree)


def gpuhost_variables(action: Any, task_vars: dict[str, Any]) -> dict[str, Any]:
    """The host's gpuhost_* variables, templated; the BMC's vaulted password is not among them: it is
    decrypted only by gpuhost.passthrough.bmc_power_cycle, when the BMC is used."""
    return {
        key: action._templar.template(value)
        for key, value in task_vars.items()
        if key.startswith("gpuhost_") and key != "gpuhost_bmc_password"
    }
