"""The domain XML: a `DomainPlan` through the Jinja template (templates/domain.xml.j2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuhost.facts.model import HostFacts
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.render.domain import DomainPlan, plan_domain
from gpuhost.templates import render_template

DOMAIN_TEMPLATE = "domain.xml.j2"  # an XML template: gpuhost.templates escapes every value
# The namespace of gpuhost's <metadata> in a domain: the host, and each passed GPU's (and NVSwitch's)
# host address with the guest address the guest sees it at.
METADATA_NS = "https://github.com/gpuhost/gpuhost/vm/1"


def render_plan(plan: DomainPlan) -> str:
    """The domain XML of a plan (templates/domain.xml.j2; every value XML-escaped)."""
    return render_template(DOMAIN_TEMPLATE, plan=plan, hex=_hex, metadata_ns=METADATA_NS)


def _hex(value: int, width: int = 2) -> str:
    return f"0x{value:0{width}x}"


def render_domain(
    facts: HostFacts,
    spec: VmSpec,
    policy: HostPolicy,
    *,
    host: str,
    taken: Mapping[str, str] | None = None,
    host_vms: Sequence[VmSpec] | None = None,
    cpus_taken: Mapping[int, str] | None = None,
) -> str:
    """Plan and render in one call: facts + VM spec + host policy -> domain XML."""
    return render_plan(
        plan_domain(facts, spec, policy, host=host, taken=taken, host_vms=host_vms, cpus_taken=cpus_taken)
    )
