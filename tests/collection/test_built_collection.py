"""The collection gpuhost.passthrough checked as Galaxy and an AWX execution environment would see it.

`ansible-galaxy collection build` of the checkout's collection, installed from the tarball into an
empty collections path; Ansible's own `ansible-test sanity` on that installed copy (local Python, no
containers); its modules' documentation through ansible-doc; `ansible-builder create` on the
execution environment definition, with the context's own introspection and pip resolving gpuhost to
the wheel the context carries. Each step prints its time ([collection timing]).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpuhost
from gpuhost.rollout.environment import AUDIT_PLAYBOOK, SITE_PLAYBOOK
from tests.helpers import COLLECTION

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EE_DEFINITION = ROOT / "execution-environment.yml"
# ansible-test's sanity tests that must run (among the 24 of ansible-core 2.19): those with
# packages of their own run in virtual environments ansible-test makes and caches under
# ~/.ansible/test, with pip put there by tests/ansible_test_get_pip.py instead of the get-pip.py it
# would download from ci-files.testing.ansible.com (which this machine cannot reach).
SANITY_MUST_RUN = (
    "ansible-doc",
    "compile",
    "import",
    "pep8",
    "pylint",
    "runtime-metadata",
    "validate-modules",
    "yamllint",
)
GET_PIP = Path(__file__).resolve().parents[1] / "ansible_test_get_pip.py"


def _timed(label: str, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    print(f"[collection timing] {label}: {time.monotonic() - started:.1f} s", flush=True)
    assert result.returncode == 0, f"{label} failed (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("collection-build")
    _timed(
        "ansible-galaxy collection build",
        [str(BIN / "ansible-galaxy"), "collection", "build", str(COLLECTION), "--output-path", str(output)],
    )
    (built,) = output.glob("gpuhost-passthrough-*.tar.gz")
    return built


@pytest.fixture(scope="module")
def installed(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty collections path with the tarball installed; returns the collections path."""
    path = tmp_path_factory.mktemp("collections")
    _timed(
        "ansible-galaxy collection install",
        [str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(path), str(tarball)],
    )
    return path


def test_the_collection_version_is_gpuhosts() -> None:
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())
    assert galaxy["version"] == gpuhost.__version__, "galaxy.yml's version must be gpuhost/__init__.py's"
    assert "repository" not in galaxy or "example" not in str(galaxy["repository"])
    requirements = (COLLECTION / "requirements.txt").read_text()
    assert f"gpuhost[controller]=={gpuhost.__version__}\n" in requirements
    # The execution environment installs this version's wheel and tarball.
    definition = EE_DEFINITION.read_text()
    assert f"gpuhost-{gpuhost.__version__}-py3-none-any.whl" in definition
    assert f"gpuhost-passthrough-{gpuhost.__version__}.tar.gz" in definition


def test_the_tarball_carries_the_roles_playbooks_and_plugins(installed: Path) -> None:
    copy = installed / "ansible_collections" / "gpuhost" / "passthrough"
    for path in (
        "playbooks/site.yml",
        "playbooks/rollback.yml",
        "playbooks/audit.yml",
        "roles/gpuhost_vfio/tasks/main.yml",
        "roles/gpuhost_rollback/tasks/main.yml",
        "plugins/action/audit.py",
        "meta/runtime.yml",
        "requirements.txt",
        "bindep.txt",
        "MANIFEST.json",
    ):
        assert (copy / path).is_file(), path
    assert yaml.safe_load((copy / "meta/runtime.yml").read_text())["requires_ansible"]
    manifest = json.loads((copy / "MANIFEST.json").read_text())["collection_info"]
    assert manifest["version"] == gpuhost.__version__ and manifest["repository"] is None


def _offline_pip_bootstrap() -> None:
    """Where ansible-test keeps its pip bootstrap script (get_pip_<pip version>.py), this one,
    unless a bootstrap is there already (a downloaded get-pip.py is as good)."""
    from ansible_test._internal.python_requirements import get_venv_packages

    version = get_venv_packages(type("Python", (), {"version": "3"})())["pip"]  # the same pin on every Python
    cache = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{version.replace('.', '_')}.py"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GET_PIP, cache)


def test_ansible_test_sanity_passes_on_the_installed_collection(installed: Path) -> None:
    """Every sanity test of the installed ansible-test, as Galaxy's and Automation Hub's reviewers
    run them, on the installed copy; the only ignores are in its tests/sanity/ignore-*.txt (the
    modules are Apache-2.0, not GPLv3)."""
    _offline_pip_bootstrap()
    copy = installed / "ansible_collections" / "gpuhost" / "passthrough"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = _timed(
        "ansible-test sanity",
        [str(BIN / "ansible-test"), "sanity", "--python", python, "--local", "--color", "no"],
        cwd=copy,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    output = result.stdout + result.stderr
    ran = re.findall(r'Running sanity test "([^"]+)"', output)
    print(f"[collection] ansible-test sanity ran {len(ran)} tests: {', '.join(ran)}")
    assert set(SANITY_MUST_RUN) <= set(ran), output
    assert result.returncode == 0, output[-6000:]


@pytest.mark.parametrize("module", ["plan", "verify", "audit", "bmc_power_cycle"])
def test_each_module_is_documented_for_ansible_doc(module: str, installed: Path) -> None:
    result = _timed(
        f"ansible-doc {module}",
        [str(BIN / "ansible-doc"), "--json", "-t", "module", f"gpuhost.passthrough.{module}"],
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(installed)},
    )
    doc = json.loads(result.stdout)[f"gpuhost.passthrough.{module}"]["doc"]
    assert doc["short_description"] and doc["description"]


@pytest.mark.parametrize("playbook", [AUDIT_PLAYBOOK, SITE_PLAYBOOK])
def test_without_the_gpuhost_package_the_first_task_says_how_to_install_it(
    playbook: str, installed: Path, tmp_path: Path
) -> None:
    """The installed collection run by a Python with Ansible but without gpuhost (an execution
    environment built without it): the first task fails on each host with one message."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    fresh = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # This environment's packages as a plain path: its .pth files (gpuhost's editable install) are
    # not processed, so Ansible imports and gpuhost does not.
    (Path(fresh) / "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHONPATH", "ANSIBLE_"))}
    probe = subprocess.run(
        [str(python), "-c", "import ansible, gpuhost"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert "No module named 'gpuhost'" in probe.stderr, probe
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"hosts": {"gpu01": {"ansible_connection": "local", "ansible_python_interpreter": str(python)}}}}
        )
    )
    result = subprocess.run(
        [str(python), str(BIN / "ansible-playbook"), "-i", str(inventory), playbook],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**env, "ANSIBLE_COLLECTIONS_PATH": str(installed), "ANSIBLE_NOCOLOR": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    # One failed task on the host, with the message (Ansible 2.19 also echoes it as an [ERROR] line).
    fatal = [line for line in result.stdout.splitlines() if line.startswith("fatal:")]
    assert len(fatal) == 1 and "needs the gpuhost Python package" in fatal[0], output
    assert "execution-environment.yml" in output and "pip install 'gpuhost[controller]'" in output
    assert fatal[0].startswith("fatal: [gpu01]:"), output
    first_task = re.search(r"^TASK \[(.+?)\]", result.stdout, re.MULTILINE)
    assert first_task is not None and "fatal" in result.stdout[first_task.end() :].split("TASK [", 1)[0], output


def test_ansible_builder_create_makes_a_context_that_installs_gpuhost(tarball: Path, tmp_path: Path) -> None:
    """`ansible-builder create` on execution-environment.yml, with this checkout's wheel and tarball in
    dist/ as the file says; then what the builder stage runs: the context's own introspection over
    the collection installed from the context's requirements.yml, and pip resolving the combined
    requirements (no index: only what the context carries) to the wheel."""
    source = tmp_path / "source"
    (source / "dist").mkdir(parents=True)
    shutil.copy2(EE_DEFINITION, source / EE_DEFINITION.name)
    shutil.copy2(tarball, source / "dist" / tarball.name)
    _timed(
        "pip wheel (gpuhost)",
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
            "wheel",
            "--no-deps",
            "-w",
            str(source / "dist"),
            str(_tracked_copy(tmp_path / "checkout")),
        ],
    )
    context = tmp_path / "context"
    _timed(
        "ansible-builder create",
        [str(BIN / "ansible-builder"), "create", "-f", EE_DEFINITION.name, "-c", str(context)],
        cwd=source,
    )
    build = context / "_build"
    containerfile = (context / "Containerfile") if (context / "Containerfile").exists() else (context / "Dockerfile")
    builder_stage = containerfile.read_text().split("FROM base AS builder", 1)[1].split("FROM base AS final", 1)[0]
    # additional_build_files reach the galaxy stage's /build only: the builder stage needs the wheel.
    assert "COPY _build/gpuhost /build/gpuhost" in builder_stage.split("RUN /output/scripts/assemble", 1)[0]

    def in_context(text: str) -> str:
        return text.replace("/build/", f"{build}/")

    requirements_yml = tmp_path / "requirements.yml"
    requirements_yml.write_text(in_context((build / "requirements.yml").read_text()))
    collections = tmp_path / "ee-collections"
    _timed(
        "ansible-galaxy collection install (the context's requirements.yml)",
        [str(BIN / "ansible-galaxy"), "collection", "install", "-r", str(requirements_yml), "-p", str(collections)],
    )
    user_pip = tmp_path / "user-requirements.txt"
    user_pip.write_text(in_context((build / "requirements.txt").read_text()))
    combined = tmp_path / "combined-requirements.txt"
    _timed(
        "introspect (the context's script)",
        [
            sys.executable,
            str(build / "scripts" / "introspect.py"),
            "introspect",
            str(collections),
            f"--user-pip={user_pip}",
            f"--exclude-pip-reqs={build / 'exclude-requirements.txt'}",
            f"--write-pip={combined}",
            f"--write-bindep={tmp_path / 'combined-bindep.txt'}",
        ],
    )
    lines = [line.split("#")[0].strip() for line in combined.read_text().splitlines() if line.split("#")[0].strip()]
    gpuhost_lines = [line for line in lines if line.lower().startswith("gpuhost")]
    # Only the wheel: the collection's `gpuhost[controller]==` line (PyPI's gpuhost is another project) is excluded.
    assert len(gpuhost_lines) == 1 and " @ file://" in gpuhost_lines[0], lines
    report = tmp_path / "pip-report.json"
    _timed(
        "pip install --dry-run (the combined requirements)",
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
            "install",
            "--dry-run",
            "--no-index",
            "--no-deps",
            "--ignore-installed",
            "--report",
            str(report),
            *gpuhost_lines,
        ],
    )
    (install,) = json.loads(report.read_text())["install"]
    assert install["metadata"]["name"] == "gpuhost" and install["metadata"]["version"] == gpuhost.__version__
    assert "ansible-runner" in " ".join(install["metadata"]["requires_dist"])  # the controller extra's
    assert install["download_info"]["url"].endswith(f"_build/gpuhost/gpuhost-{gpuhost.__version__}-py3-none-any.whl")


def _tracked_copy(destination: Path) -> Path:
    """The working tree's tracked and new files (not .venv or build output): pip builds the copy."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        origin = ROOT / name
        if origin.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    return destination


def _batches() -> Any:
    sys.path.insert(0, str(COLLECTION.parents[2]))
    try:
        from ansible_collections.gpuhost.passthrough.plugins.filter.batches import batches
    finally:
        sys.path.remove(str(COLLECTION.parents[2]))
    return batches


@pytest.mark.parametrize(
    ("value", "expected"),
    [([1, "20%"], [1, "20%"]), ("1,20%", [1, "20%"]), (" 2 , 50% ", [2, "50%"]), ("5", [5]), (3, [3])],
)
def test_gpuhost_serial_reads_a_list_from_apply_and_text_from_a_survey(value: object, expected: list[object]) -> None:
    assert _batches()(value) == expected
    site = yaml.safe_load((COLLECTION / "playbooks/site.yml").read_text())
    (configure,) = [play for play in site if str(play.get("name", "")).startswith("Configure for passthrough")]
    assert "gpuhost.passthrough.batches" in configure["serial"]


@pytest.mark.parametrize("value", ["", "1;20%", "0", "one", "20%%", [], True])
def test_a_gpuhost_serial_that_is_no_batch_list_is_refused_with_the_fix(value: object) -> None:
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match=r"comma-separated \(e\.g\. 1,20%\)"):
        _batches()(value)
