"""The Jinja templates (templates/): one loader for the files apply writes and the domain XML.

The directory is $GPUHOST_TEMPLATES when set, else templates/ of the checkout or of a wheel
install (<prefix>/share/gpuhost/templates). Every template is rendered with the same settings;
only escaping depends on what the template makes: a domain XML (*.xml.j2) escapes every value,
because host text (device names, paths) is data there; the shell, GRUB, modprobe and loader
entry files are not XML, and every value they receive is validated before it gets there.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost.datafiles import require_data_dir

if TYPE_CHECKING:
    import jinja2

TEMPLATES_ENV = "GPUHOST_TEMPLATES"
# A file every templates/ holds: how a directory is recognised as one.
_MARKER = "domain.xml.j2"
# Templates whose values are escaped: the domain XML's (domain.xml.j2).
_ESCAPED_EXTENSIONS = ("xml.j2",)


def templates_dir() -> Path:
    """$GPUHOST_TEMPLATES, or templates/ of the checkout or of an install."""
    return _templates_dir(os.environ.get(TEMPLATES_ENV))


@cache
def _templates_dir(override: str | None) -> Path:  # `override`: the key, so a changed variable is read again
    return require_data_dir("templates", _MARKER, env_var=TEMPLATES_ENV)


@cache
def _environment(directory: Path) -> jinja2.Environment:
    try:
        import jinja2
    except ImportError as error:
        from gpuhost.errors import MissingDependencyError

        raise MissingDependencyError("jinja2", "controller", "Rendering gpuhost's templates") from error
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        autoescape=jinja2.select_autoescape(_ESCAPED_EXTENSIONS, disabled_extensions=(), default=False),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_template(name: str, **values: object) -> str:
    """Template `name` (a path under templates/, e.g. grub/gpuhost.cfg.j2) rendered with `values`."""
    return _environment(templates_dir()).get_template(name).render(**values)
