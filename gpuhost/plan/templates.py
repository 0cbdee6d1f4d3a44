"""The plan's Jinja templates (templates/): the files apply writes, rendered on the controller."""

from __future__ import annotations

from functools import cache


@cache
def _environment() -> object:
    import jinja2

    from gpuhost.datafiles import require_data_dir

    return jinja2.Environment(
        # templates/ of the checkout, or of a wheel install (<prefix>/share/gpuhost/templates).
        loader=jinja2.FileSystemLoader(str(require_data_dir("templates", "grub/gpuhost.cfg.j2"))),
        autoescape=False,  # noqa: S701 - shell and GRUB files, not HTML; every value is validated
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_template(name: str, **values: object) -> str:
    import jinja2

    environment = _environment()
    assert isinstance(environment, jinja2.Environment)
    return environment.get_template(name).render(**values)
