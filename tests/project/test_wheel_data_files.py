"""A wheel carries the playbooks and templates, and an installed gpuhost finds them in share/gpuhost.

Builds a wheel of the working tree (`pip wheel --no-deps`), installs it into a fresh venv
(`--no-deps`; the dependencies come from the test's own environment, appended after the fresh
site-packages so that the installed gpuhost, not the checkout, is imported) and runs the installed
`gpuhost plan` from outside the checkout. No VM; about half a minute (pip fetches setuptools for
the isolated build).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.helpers import SNAPSHOTS

ROOT = Path(__file__).resolve().parents[2]
# What the playbooks and the planner need at run time; playbooks/molecule/ is the scenario's test.
SHIPPED = ("playbooks", "templates/grub", "templates/initramfs")


def _git_files(*args: str) -> list[str]:
    result = subprocess.run(["git", "-C", str(ROOT), "ls-files", *args], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def _shipped_files() -> list[str]:
    """The tracked files a wheel must carry (relative to the repository root)."""
    return [
        path
        for path in _git_files("--", *SHIPPED)
        if not path.startswith("playbooks/molecule/") and "__pycache__" not in path
    ]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel of the working tree installed; returns the venv."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    # A copy of the working tree (tracked and new files, not ignored ones): the build never
    # writes into the checkout, where others may be building at the same time.
    for name in _git_files("--cached", "--others", "--exclude-standard"):
        origin = ROOT / name
        if origin.is_file():
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(work / "dist"), str(source)], check=True)
    (wheel,) = (work / "dist").glob("gpuhost-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True)
    fresh = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path line: appended after the fresh site-packages, and its own .pth files (the
    # checkout's editable install) are not processed.
    (Path(fresh) / "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    print(f"[wheel timing] wheel built and installed in {time.monotonic() - started:.1f} s", flush=True)
    return venv


def _run(venv: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("PYTHONPATH", "GPUHOST_", "ANSIBLE_"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_installs_every_playbook_and_template_file(installed: Path) -> None:
    share = installed / "share" / "gpuhost"
    shipped = _shipped_files()
    assert "playbooks/site.yml" in shipped and "templates/grub/gpuhost.cfg.j2" in shipped
    missing = [path for path in shipped if not (share / path).is_file()]
    assert not missing, f"not in the wheel: {missing}; list their directories in pyproject's data-files"
    differing = [path for path in shipped if (share / path).read_bytes() != (ROOT / path).read_bytes()]
    assert not differing, differing
    assert not (share / "playbooks" / "molecule").exists()


def test_the_installed_gpuhost_plan_finds_its_templates_and_playbook(installed: Path, tmp_path: Path) -> None:
    where = _run(
        installed, str(installed / "bin" / "python"), "-c", "import gpuhost; print(gpuhost.__file__)", cwd=tmp_path
    )
    assert where.stdout.startswith(str(installed)), where  # the wheel's gpuhost, not the checkout's
    snapshot = str(SNAPSHOTS / "lab-gpu-pair-fresh")
    plan = _run(
        installed, "gpuhost", "plan", "--from-snapshot", snapshot, "--gpus", "1234:1111", "--show-files", cwd=tmp_path
    )
    assert plan.returncode == 0, plan.stderr
    # Rendered from the installed templates/grub and templates/initramfs.
    assert "GRUB line then: console=tty0 console=ttyS0,115200n8 vfio-pci.ids=1234:1111,8086:293e" in plan.stdout
    assert "--- /etc/initramfs-tools/scripts/init-top/gpuhost-vfio" in plan.stdout
    playbook = installed / "share" / "gpuhost" / "playbooks" / "site.yml"
    assert f"gpuhost apply runs {playbook};" in plan.stdout, plan.stdout[-500:]


def test_the_installed_playbook_resolves_its_roles_and_collection(installed: Path, tmp_path: Path) -> None:
    playbook = installed / "share" / "gpuhost" / "playbooks" / "site.yml"
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    if not ansible_playbook.is_file():
        pytest.fail(f"{ansible_playbook} is missing: install gpuhost[controller]")
    # Syntax check loads every role and resolves every module and action by name: the
    # gpuhost.passthrough actions must come from the playbook-adjacent collection of the install.
    check = _run(installed, str(ansible_playbook), "-i", "localhost,", "--syntax-check", str(playbook), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
