"""Issue 42 class 1: a driver from Ubuntu's precompiled packages (ubuntu-drivers) is removed like any
other: the plan names each package and module file, the apt pin keeps every family out, and the
verification looks in every kernel's tree."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
from fnmatch import fnmatchcase
from pathlib import Path

from gpuhost.facts.build import NVIDIA_PACKAGE_PREFIXES
from gpuhost.facts.parsers import parse_cmdline, parse_nvidia_modules
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.files import APT_PIN
from gpuhost.plan.verify import verify_host
from tests.hosts_as_they_come import shape_facts
from tests.render.test_domain import _with_1g_pages

VARIABLES = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}
SETTINGS = PlanSettings.from_variables(VARIABLES, "inventory host ubuntu")


def _pinned(package: str) -> bool:
    line = next(line for line in APT_PIN.splitlines() if line.startswith("Package:"))
    return any(fnmatchcase(package, glob) for glob in line.split()[1:])


def test_the_plan_names_every_precompiled_package_and_module_file(tmp_path: Path):
    facts = shape_facts("ubuntu-2204-drivers-535", tmp_path)
    removal = plan_host("ubuntu", facts, SETTINGS).driver_removal
    # Before: only the nvidia-*/libnvidia-* packages; the modules of both kernels were left to apt's
    # dependency chain, which the plan never stated.
    assert {
        "linux-modules-nvidia-535-generic",
        "linux-modules-nvidia-535-5.15.0-107-generic",
        "linux-modules-nvidia-535-5.15.0-113-generic",
        "linux-objects-nvidia-535-5.15.0-107-generic",
        "linux-objects-nvidia-535-5.15.0-113-generic",
        "linux-signatures-nvidia-5.15.0-107-generic",
        "linux-signatures-nvidia-5.15.0-113-generic",
        "nvidia-driver-535",
    } <= set(removal.packages)
    assert len(removal.module_files) == 10
    assert "/lib/modules/5.15.0-107-generic/kernel/nvidia-535/nvidia.ko" in removal.module_files
    for path in removal.module_files:
        assert path in removal.note
    assert removal.needed and removal.pin and removal.module_globs


def test_the_apt_pin_covers_every_nvidia_package_family_and_no_kernel():
    # Before: linux-modules-nvidia-535-generic followed the next kernel upgrade back in.
    for prefix in NVIDIA_PACKAGE_PREFIXES:
        if prefix == "kmod-nvidia":
            continue  # RHEL's (rpm): apply runs on Debian and Ubuntu only
        assert _pinned(f"{prefix}535-generic"), prefix
    for package in ("linux-modules-nvidia-550-server-open-generic", "linux-signatures-nvidia-6.8.0-45-generic"):
        assert _pinned(package)
    for package in ("linux-image-generic", "linux-modules-6.8.0-45-generic", "linux-generic-hwe-22.04"):
        assert not _pinned(package)


def test_verification_fails_while_a_module_is_left_for_any_kernel(tmp_path: Path):
    facts = shape_facts("ubuntu-2404-drivers-550-server-open", tmp_path)
    plan = plan_host("ubuntu", facts, SETTINGS).require_applicable().to_json()
    pci = tuple(
        dataclasses.replace(f, driver="vfio-pci") if f.address.startswith("0000:01:00.") else f for f in facts.pci
    )
    cmdline = parse_cmdline(f"{facts.cmdline} {' '.join(plan['kernel_options'])}")
    loaded = dataclasses.replace(facts.modules, loaded=frozenset(m for m in facts.modules.loaded if "nvidia" not in m))
    booted = _with_1g_pages(dataclasses.replace(facts, pci=pci, cmdline=cmdline, modules=loaded), 1)
    # A module of another kernel than the running one, which no package owns any more.
    other_kernel = parse_nvidia_modules("module /lib/modules/6.8.0-40-generic/kernel/nvidia-550srv/nvidia.ko\n")
    left = dataclasses.replace(
        booted, nvidia=dataclasses.replace(booted.nvidia, packages=(), module_files=other_kernel)
    )
    verification = verify_host("ubuntu", left, SETTINGS, plan)
    assert [p.code for p in verification.problems] == ["verify.host_driver.module_left"]
    assert "/lib/modules/6.8.0-40-generic/kernel/nvidia-550srv/nvidia.ko" in verification.summary
    unlisted = dataclasses.replace(left, nvidia=dataclasses.replace(left.nvidia, module_files=None))
    assert [p.code for p in verify_host("ubuntu", unlisted, SETTINGS, plan).problems] == [
        "verify.host_driver.module_left"
    ]
    gone = dataclasses.replace(left, nvidia=dataclasses.replace(left.nvidia, module_files=()))
    assert verify_host("ubuntu", gone, SETTINGS, plan).ok


def _apt_policy(tmp_path: Path, package: str, preferences: Path | None) -> str:
    """`apt-cache policy PACKAGE` of this machine's apt against a one-package local repository (a flat
    repository of real .debs made with dpkg-deb), with the given preferences file or none."""
    state = tmp_path / "state"
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    options = [
        f"-oDir::State={state}",
        "-oDir::State::status=/dev/null",
        f"-oDir::Cache={state / 'cache'}",
        f"-oDir::Etc::sourcelist={tmp_path / 'repo' / 'sources.list'}",
        "-oDir::Etc::sourceparts=/nonexistent",
        f"-oDir::Etc::preferences={preferences or '/dev/null'}",
        "-oDir::Etc::preferencesparts=/nonexistent",
    ]
    subprocess.run(["apt-get", *options, "update"], check=True, capture_output=True)
    return subprocess.run(["apt-cache", *options, "policy", package], check=True, capture_output=True, text=True).stdout


def test_the_pin_leaves_apt_no_candidate_for_a_precompiled_metapackage(tmp_path: Path):
    # Real apt and dpkg-deb: the metapackage ubuntu-drivers installs, offered by a repository.
    repo = tmp_path / "repo"
    package = tmp_path / "pkg"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: linux-modules-nvidia-535-generic\nVersion: 5.15.0-113.123\nArchitecture: all\n"
        "Maintainer: gpuhost tests <tests@gpuhost.invalid>\nDescription: stand-in metapackage\n"
    )
    repo.mkdir()
    deb = repo / "meta.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(package), str(deb)], check=True, capture_output=True
    )
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    (repo / "Packages").write_text(f"{control}Filename: ./meta.deb\nSize: {deb.stat().st_size}\nSHA256: {digest}\n\n")
    (repo / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    unpinned = _apt_policy(tmp_path, "linux-modules-nvidia-535-generic", None)
    assert "Candidate: 5.15.0-113.123" in unpinned
    pin = tmp_path / "gpuhost-no-nvidia-driver"
    pin.write_text(APT_PIN)
    # Before: the pin named no linux-modules-nvidia-* package, and the candidate stayed.
    assert "Candidate: (none)" in _apt_policy(tmp_path, "linux-modules-nvidia-535-generic", pin)
