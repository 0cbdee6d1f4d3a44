"""What the action plugins do first: make gpuhost importable, validate the host's gpuhost_*
variables and read its facts through the play's connection."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import (
    MISSING_GPUHOST,
    AnsibleConnectionTransport,
    gather_facts,
    gpuhost_variables,
)

# playbooks/collections/ansible_collections/gpuhost/passthrough/plugins/plugin_utils/host.py: in
# a checkout, the repository root (with gpuhost/) is 7 levels up. An installed gpuhost is found
# first; the checkout only serves `ansible-playbook playbooks/site.yml` run with a Python that
# does not have gpuhost installed.
_CHECKOUT_ROOT = Path(__file__).resolve().parents[7]


class HostReadError(Exception):
    """The host cannot be planned or verified; the message says why and the fix."""


@dataclass(frozen=True)
class HostReading:
    host: str
    settings: Any  # gpuhost.plan.PlanSettings
    facts: Any  # gpuhost.facts.model.HostFacts


def import_gpuhost() -> None:
    """Import gpuhost, from the checkout these playbooks are in when it is not installed."""
    if importlib.util.find_spec("gpuhost") is None and (_CHECKOUT_ROOT / "gpuhost" / "__init__.py").is_file():
        sys.path.append(str(_CHECKOUT_ROOT))


def require_gpuhost() -> None:
    """gpuhost importable, or HostReadError with the one message that says how to install it."""
    try:
        import_gpuhost()
        import gpuhost.audit
        import gpuhost.plan  # noqa: F401
    except ImportError as error:
        raise HostReadError(f"{MISSING_GPUHOST} ({error})") from error


def audit_host(action: Any, task_vars: dict[str, Any]) -> dict[str, Any]:
    """`gpuhost audit --json`'s object for the play's host: the same gather (one command through the
    play's connection) and the same checks (gpuhost.audit.audit_target). A host whose gpuhost_*
    variables are invalid gets its error in the object, as one the audit could not reach does."""
    require_gpuhost()
    from ansible.errors import AnsibleError

    from gpuhost.audit import audit_target, audit_to_json, not_audited
    from gpuhost.checks.base import AuditPolicy
    from gpuhost.errors import GpuhostError
    from gpuhost.selection import GpuSelector
    from gpuhost.targets import LOCAL, SSH, ConnectionDefaults, Target, host_config

    host = str(task_vars.get("inventory_hostname", "host"))
    kind = LOCAL if getattr(action._connection, "transport", "ssh") == "local" else SSH
    where = f"inventory host {host}"
    try:
        variables = gpuhost_variables(action, task_vars)
        config = host_config(variables, ConnectionDefaults(), where)
    except (GpuhostError, AnsibleError) as error:  # AnsibleError: a variable that does not template
        unconfigured = Target(name=host, kind=kind, policy=AuditPolicy(gpus=GpuSelector.parse(None, where)))
        return audit_to_json(not_audited(unconfigured, str(error), "input"))
    target = Target(name=host, kind=kind, policy=config.audit, variables=variables, config=config)
    return audit_to_json(audit_target(target, AnsibleConnectionTransport(action, host)))


def read_host(action: Any, task_vars: dict[str, Any]) -> HostReading:
    """The host's validated settings and its facts; HostReadError with the reason otherwise."""
    host = str(task_vars.get("inventory_hostname", "host"))
    require_gpuhost()
    from ansible.errors import AnsibleConnectionFailure

    from gpuhost.errors import GpuhostError
    from gpuhost.plan import PlanSettings
    from gpuhost.transport import TransportError

    try:
        settings = PlanSettings.from_variables(gpuhost_variables(action, task_vars), f"inventory host {host}")
        facts = gather_facts(action, host)
    except (GpuhostError, TransportError) as error:
        if isinstance(error.__cause__, AnsibleConnectionFailure):
            # A host the play's connection cannot reach (down, or its host key changed) is Ansible's
            # UNREACHABLE, as under any module: apply reports it unreachable, not failed. The audit
            # playbook keeps it as the host's own error instead (audit_host), as gpuhost audit does.
            raise error.__cause__ from None
        raise HostReadError(str(error)) from error
    return HostReading(host, settings, facts)
