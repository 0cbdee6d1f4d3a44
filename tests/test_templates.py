"""gpuhost.templates: one loader for plan's files and render's domain XML, $GPUHOST_TEMPLATES honoured by both."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.datafiles import CHECKOUT_ROOT
from gpuhost.errors import InputError
from gpuhost.templates import TEMPLATES_ENV, render_template, templates_dir

HOST_TEXT = "GA100 <rev a1> & 'B'"


@pytest.fixture
def own_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A templates/ of one's own, as $GPUHOST_TEMPLATES names it: an XML template and a GRUB file."""
    (tmp_path / "grub").mkdir()
    (tmp_path / "domain.xml.j2").write_text("<description>{{ text }}</description>\n")
    (tmp_path / "grub" / "gpuhost.cfg.j2").write_text("# {{ text }}\n")
    monkeypatch.setenv(TEMPLATES_ENV, str(tmp_path))
    return tmp_path


def test_the_checkout_templates_serve_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEMPLATES_ENV, raising=False)
    assert templates_dir() == CHECKOUT_ROOT / "templates"


def test_plan_and_render_templates_both_come_from_gpuhost_templates(own_templates: Path) -> None:
    assert templates_dir() == own_templates
    assert render_template("grub/gpuhost.cfg.j2", text="mine") == "# mine\n"
    assert render_template("domain.xml.j2", text="mine") == "<description>mine</description>\n"


def test_xml_escapes_host_text_and_the_grub_file_takes_it_as_validated(own_templates: Path) -> None:
    assert render_template("domain.xml.j2", text=HOST_TEXT) == (
        "<description>GA100 &lt;rev a1&gt; &amp; &#39;B&#39;</description>\n"
    )
    assert render_template("grub/gpuhost.cfg.j2", text=HOST_TEXT) == f"# {HOST_TEXT}\n"


def test_a_missing_value_is_an_error_not_an_empty_string(own_templates: Path) -> None:
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        render_template("grub/gpuhost.cfg.j2")


def test_a_gpuhost_templates_without_the_templates_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEMPLATES_ENV, str(tmp_path))
    with pytest.raises(InputError, match=TEMPLATES_ENV):
        templates_dir()
