"""The one-way layers of pyproject's [tool.importlinter] contract: kept by the tree, broken by an upward import."""

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
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract_and_is_named(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "gpuhost", tmp_path / "gpuhost", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "gpuhost" / "facts" / "upward.py").write_text("import gpuhost.cli.main  # noqa: F401\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "gpuhost.facts is not allowed to import gpuhost.cli" in result.stdout
    assert "gpuhost.facts.upward -> gpuhost.cli.main (l.1)" in result.stdout
