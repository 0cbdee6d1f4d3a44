"""The domain XML: a `DomainPlan` through the Jinja template (templates/domain.xml.j2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuhost.datafiles import require_data_dir
from gpuhost.facts.model import HostFacts
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.render.domain import DomainPlan, plan_domain

TEMPLATES_ENV = "GPUHOST_TEMPLATES"


def templates_dir() -> Path:
    """templates/ of the checkout, or of an install (<prefix>/share/gpuhost/templates)."""
    return require_data_dir("templates", "domain.xml.j2", env_var=TEMPLATES_ENV)


def render_plan(plan: DomainPlan, template_dir: Path | None = None) -> str:
    """The domain XML of a plan (templates/domain.xml.j2; every value XML-escaped)."""
    try:
        import jinja2
    except ImportError as error:
        from gpuhost.errors import MissingDependencyError

        raise MissingDependencyError("jinja2", "controller", "Rendering domain XML") from error
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir or templates_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return environment.get_template("domain.xml.j2").render(plan=plan, hex=_hex)


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
