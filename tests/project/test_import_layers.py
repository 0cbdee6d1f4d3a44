"""pyproject's [tool.importlinter] contracts, the one-way layers and the light guest side: kept by the
tree, broken by an upward import and by a controller library in the smoke-test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first: grimp then reads the package under `tree`, not the editable install's.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_package_keeps_its_layers() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract_and_is_named(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "gpuhost", tmp_path / "gpuhost", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "gpuhost" / "facts" / "upward.py").write_text("import gpuhost.cli.main  # noqa: F401\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "gpuhost.facts is not allowed to import gpuhost.cli" in result.stdout
    assert "gpuhost.facts.upward -> gpuhost.cli.main (l.1)" in result.stdout


def test_a_controller_library_in_the_smoke_test_breaks_its_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "gpuhost", tmp_path / "gpuhost", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    # Through another gpuhost module counts too: the inventory reads YAML.
    (tmp_path / "gpuhost" / "bench" / "heavy.py").write_text("import gpuhost.inventory.spec  # noqa: F401\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "the smoke-test (gpuhost.bench) imports no controller library BROKEN" in result.stdout
    assert "gpuhost.bench.heavy -> gpuhost.inventory.spec" in result.stdout
