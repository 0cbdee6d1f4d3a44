"""What both action plugins do first: make gpuhost importable, validate the host's gpuhost_*
variables and read its facts through the play's connection."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.gather import (
    MISSING_GPUHOST,
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


def read_host(action: Any, task_vars: dict[str, Any]) -> HostReading:
    """The host's validated settings and its facts; HostReadError with the reason otherwise."""
    host = str(task_vars.get("inventory_hostname", "host"))
    try:
        import_gpuhost()
        from gpuhost.errors import GpuhostError
        from gpuhost.plan import PlanSettings
        from gpuhost.transport import TransportError
    except ImportError as error:
        raise HostReadError(f"{MISSING_GPUHOST} ({error})") from error
    try:
        settings = PlanSettings.from_variables(gpuhost_variables(action, task_vars), f"inventory host {host}")
        facts = gather_facts(action, host)
    except (GpuhostError, TransportError) as error:
        raise HostReadError(str(error)) from error
    return HostReading(host, settings, facts)
