"""`gpuhost render`: libvirt domain XML with a host's GPUs passed through, validated.

Pure: (host facts, VM spec from `gpuhost_vms` (gpuhost.inventory.spec), host policy) -> XML text, from
templates/domain.xml.j2; `validate_domain_xml` runs libvirt's own schema check on it.
"""

from __future__ import annotations

from gpuhost.render.domain import DomainPlan, RenderRefused, plan_domain
from gpuhost.render.validate import InvalidDomainError, Validation, validate_domain_xml
from gpuhost.render.xml import render_domain, render_plan

__all__ = [
    "DomainPlan",
    "InvalidDomainError",
    "RenderRefused",
    "Validation",
    "plan_domain",
    "render_domain",
    "render_plan",
    "validate_domain_xml",
]
