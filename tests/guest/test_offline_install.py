"""The cuda step of `gpuhost guest up` run for real, offline: a local Debian repository built here
with dpkg-deb and dpkg-scanpackages (packages standing in for NVIDIA's, with their names and
versions), installed from by the real apt-get and dpkg, into a tree of its own (apt's Dir and
dpkg's --root): this machine's package state is never touched, and no network is used.

What runs is provision.install_cuda, the function the guest step calls, over a LocalTransport; only
its PackageRoot differs from a guest's ('/').
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

from gpuhost.guest import provision
from gpuhost.inventory import pins
from gpuhost.transport import CommandResult
from gpuhost.transport.local import LocalTransport

KERNEL = os.uname().release
# name, version, Depends: the driver metapackage of two branches over a dependency that exists
# in both (only the apt preference keeps it on the pinned branch), two toolkits, and the headers.
PACKAGES = (
    ("nvidia-open", "550.54.15-1", "nvidia-kernel-open-dkms (>= 550.54.15)"),
    ("nvidia-open", "570.86.15-1", "nvidia-kernel-open-dkms (>= 570.86.15)"),
    ("nvidia-kernel-open-dkms", "550.54.15-1", ""),
    ("nvidia-kernel-open-dkms", "570.86.15-1", ""),
    ("cuda-toolkit-12-4", "12.4.0-1", ""),
    ("cuda-toolkit-12-4", "12.4.1-1", ""),
    ("cuda-toolkit-12-6", "12.6.3-1", ""),
    (f"linux-headers-{KERNEL}", "1.0-1", ""),
)
# Fabric Manager as NVIDIA's packaging names it up to branch 580 (nvidia-fabricmanager-<branch> at
# the driver's version, see gpuhost.inventory.pins): the driver's version, an older and a newer one of
# the branch (neither may be taken), and another branch's.
FABRIC_MANAGER_PACKAGES = (
    ("nvidia-fabricmanager-550", "550.54.14-1", ""),
    ("nvidia-fabricmanager-550", "550.54.15-1", ""),
    ("nvidia-fabricmanager-550", "550.90.07-1", ""),
    ("nvidia-fabricmanager-570", "570.86.15-1", ""),
)
# Nothing answers at TEST-NET-1: were the tree's own sources used, apt would say so.
UNUSED_SOURCE = "http://192.0.2.1/debian"


def build_package(
    workdir: Path, out: Path, name: str, version: str, depends: str, files: Mapping[str, str] | None = None
) -> None:
    """A stand-in .deb: its control file and `files` (path -> text), else a doc file with its version."""
    tree = workdir / f"{name}_{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    control = (
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: gpuhost tests <tests@example.invalid>\n"
    )
    if depends:
        control += f"Depends: {depends}\n"
    control += f"Description: stand-in for {name} {version}\n"
    (tree / "DEBIAN" / "control").write_text(control)
    for path, text in (files or {f"/usr/share/doc/{name}/version": version + "\n"}).items():
        (tree / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tree / path.lstrip("/")).write_text(text)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(out / f"{name}_{version}_all.deb")],
        check=True,
        capture_output=True,
    )


def build_repository(
    base: Path, packages: Iterable[tuple[str, str, str]], files: Mapping[str, Mapping[str, str]] | None = None
) -> Path:
    """A flat repository in `base`/repo: the stand-in .debs (name, version, Depends; `files` by
    package name) and the Packages index dpkg-scanpackages writes."""
    repo = base / "repo"
    repo.mkdir()
    for name, version, depends in packages:
        build_package(base / "build", repo, name, version, depends, (files or {}).get(name))
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True, text=True
    )
    (repo / "Packages").write_text(index.stdout)
    return repo


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"), PACKAGES + FABRIC_MANAGER_PACKAGES)


@pytest.fixture(scope="module")
def repository_without_fabric_manager(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo-no-fm"), PACKAGES)


def empty_tree(root: Path) -> Path:
    """What apt and dpkg need of a system without packages, plus a sources.list that must stay unused."""
    for directory in (
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "etc/apt/apt.conf.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/info",
        "var/log/apt",
    ):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").touch()
    (root / "etc/apt/sources.list").write_text(f"deb {UNUSED_SOURCE} bookworm main\n")
    return root


class Log:
    def __init__(self) -> None:
        self.commands: list[tuple[list[str], CommandResult]] = []

    def __call__(self, argv: list[str], result: CommandResult) -> None:
        self.commands.append((argv, result))

    def output(self) -> str:
        return "".join((result.stdout + result.stderr).decode(errors="replace") for _, result in self.commands)


@pytest.fixture
def system_state() -> Iterator[None]:
    """This machine's dpkg database is the same after the test as before."""
    status = Path("/var/lib/dpkg/status")
    before = hashlib.sha256(status.read_bytes()).hexdigest() if status.exists() else None
    yield
    after = hashlib.sha256(status.read_bytes()).hexdigest() if status.exists() else None
    assert before == after


def install(
    root: Path, pin: pins.CudaPin, repo_url: str, log: Log, lock_timeout: float = 60, fabric_manager: bool = False
) -> provision.CudaInstall:
    return provision.install_cuda(
        LocalTransport(),
        pin,
        log=log,
        timeout=300,
        lock_timeout=lock_timeout,
        local_repo=repo_url,
        root=provision.PackageRoot(str(root)),
        fabric_manager=fabric_manager,
    )


def installed(root: Path) -> dict[str, str]:
    text = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return pins.parse_dpkg_query(text)


def test_offline_install_takes_the_pinned_branch_and_toolkit_from_the_local_repository(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    log = Log()
    done = install(root, pins.CudaPin("12.4.1", 550), f"file://{repository}", log)
    assert done.installed == ("cuda-toolkit-12-4=12.4.1*", "nvidia-open=550.*", f"linux-headers-{KERNEL}")
    assert installed(root) == {
        "cuda-toolkit-12-4": "12.4.1-1",
        "nvidia-open": "550.54.15-1",
        # 570's satisfies nvidia-open's dependency too and is newer: the preference kept it on 550.
        "nvidia-kernel-open-dkms": "550.54.15-1",
        f"linux-headers-{KERNEL}": "1.0-1",
    }
    assert (root / "usr/share/doc/nvidia-open/version").read_text() == "550.54.15-1\n"
    assert done.after.driver_version == "550.54.15" and done.describe().startswith("driver 550.54.15")
    # Only the local repository was read: the tree's sources.list never was.
    assert UNUSED_SOURCE.split("//")[1] not in log.output()
    assert (root / "etc/apt/sources.list.d/gpuhost-package-repo.list").read_text() == (
        f"deb [trusted=yes] file://{repository}/ ./\n"
    )


def test_a_guest_that_has_the_pinned_versions_is_left_as_it_is(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    pin = pins.CudaPin("12.4", 550)
    install(root, pin, f"file://{repository}", Log())
    log = Log()
    again = install(root, pin, f"file://{repository}", log)
    assert again.installed == () and "prebuilt image" in again.describe()
    assert not any("apt-get" in argv for argv, _ in log.commands)


def test_a_guest_with_another_branch_is_reported_not_replaced(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    install(root, pins.CudaPin("12.4", 550), f"file://{repository}", Log())
    with pytest.raises(
        provision.InstalledVersionError, match=r"already has driver 550\.54\.15.*pins driver branch 570"
    ):
        install(root, pins.CudaPin("12.4", 570), f"file://{repository}", Log())
    with pytest.raises(provision.InstalledVersionError, match=r"cuda-toolkit-12-4 12\.4\.1-1.*CUDA 12\.6"):
        install(root, pins.CudaPin("12.6", 570), f"file://{repository}", Log())
    assert installed(root)["nvidia-open"] == "550.54.15-1"


def test_a_branch_the_repository_lacks_is_an_error_not_the_newest(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    with pytest.raises(provision.RemoteCommandError, match=r"Version '560\.\*' for 'nvidia-open' was not found"):
        install(root, pins.CudaPin("12.4", 560), f"file://{repository}", Log())
    assert "nvidia-open" not in installed(root)


def test_a_held_dpkg_lock_is_waited_for_then_named(repository: Path, tmp_path: Path, system_state: None) -> None:
    root = empty_tree(tmp_path / "guest")
    # As unattended-upgrades holds it: apt's frontend lock, taken with the fcntl lock apt uses.
    with (root / "var/lib/dpkg/lock-frontend").open("w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        with pytest.raises(
            provision.RemoteCommandError,
            match=rf"dpkg's lock stayed held for 2 s \(it is held by process {os.getpid()} .*dpkg_lock",
        ):
            install(root, pins.CudaPin("12.4", 550), f"file://{repository}", Log(), lock_timeout=2)


def test_a_repository_on_the_host_is_copied_into_the_guest_and_installed_from(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    log = Log()
    copy = tmp_path / "guest-copy"
    url = provision.copy_package_repo(
        LocalTransport(), LocalTransport(), str(repository), log=log, timeout=120, dest=str(copy)
    )
    assert url == f"file://{copy}"
    assert sorted(path.name for path in copy.iterdir()) == sorted(path.name for path in repository.iterdir())
    done = install(root, pins.CudaPin("12.4", 550), url, log)
    assert installed(root)["nvidia-open"] == "550.54.15-1" and done.installed


def test_a_host_directory_without_an_index_is_refused(tmp_path: Path) -> None:
    (tmp_path / "nvidia-open_550.54.15-1_all.deb").write_bytes(b"")
    with pytest.raises(provision.InputError, match=r"no Packages index.*dpkg-scanpackages"):
        provision.copy_package_repo(LocalTransport(), LocalTransport(), str(tmp_path), log=Log(), timeout=60)


# Fabric Manager: what `gpuhost guest up` installs when the VM is given the NVSwitches.


def test_fabric_manager_of_the_driver_version_is_installed_beside_the_driver(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    log = Log()
    done = install(root, pins.CudaPin("12.4.1", 550), f"file://{repository}", log, fabric_manager=True)
    have = installed(root)
    # Exactly the driver's version: neither the newer 550.90.07 the branch preference would
    # favour for a bare name, nor the older 550.54.14.
    assert have["nvidia-fabricmanager-550"] == "550.54.15-1" == have["nvidia-open"]
    assert "nvidia-fabricmanager-570" not in have
    assert done.installed[-1] == "nvidia-fabricmanager-550=550.54.15-1"
    assert done.describe() == (
        "driver 550.54.15, toolkit cuda-toolkit-12-4 12.4.1-1, Fabric Manager nvidia-fabricmanager-550 "
        f"550.54.15-1 from file://{repository}"
    )
    assert UNUSED_SOURCE.split("//")[1] not in log.output()


def test_a_guest_without_nvswitches_gets_no_fabric_manager(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    install(root, pins.CudaPin("12.4", 550), f"file://{repository}", Log())
    assert not any(name.startswith("nvidia-fabricmanager") for name in installed(root))


def test_a_prebuilt_image_with_the_matching_fabric_manager_is_left_as_it_is(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    pin = pins.CudaPin("12.4", 550)
    install(root, pin, f"file://{repository}", Log(), fabric_manager=True)
    log = Log()
    again = install(root, pin, f"file://{repository}", log, fabric_manager=True)
    assert again.installed == () and again.describe() == (
        "prebuilt image: driver 550.54.15, toolkit cuda-toolkit-12-4 12.4.1-1, Fabric Manager "
        "nvidia-fabricmanager-550 550.54.15-1, install skipped"
    )
    assert not any("apt-get" in argv for argv, _ in log.commands)


def test_a_prebuilt_image_without_fabric_manager_gets_only_fabric_manager(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    pin = pins.CudaPin("12.4", 550)
    install(root, pin, f"file://{repository}", Log())
    done = install(root, pin, f"file://{repository}", Log(), fabric_manager=True)
    assert done.installed == ("nvidia-fabricmanager-550=550.54.15-1",)
    assert installed(root)["nvidia-fabricmanager-550"] == "550.54.15-1"


def test_a_fabric_manager_of_another_version_is_reported_not_replaced(
    repository: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    pin = pins.CudaPin("12.4", 550)
    install(root, pin, f"file://{repository}", Log())
    # The image's Fabric Manager is one release older than its driver, as after a driver-only update.
    older = provision.apt_argv(
        provision.PackageRoot(str(root)),
        local=True,
        lock_timeout=60,
        args=["install", "-y", "nvidia-fabricmanager-550=550.54.14-1"],
    )
    subprocess.run(older, check=True, capture_output=True)
    log = Log()
    with pytest.raises(
        provision.InstalledVersionError,
        match=r"driver 550\.54\.15, .*Fabric Manager nvidia-fabricmanager-550 550\.54\.14-1.*does not replace",
    ):
        install(root, pin, f"file://{repository}", log, fabric_manager=True)
    assert installed(root)["nvidia-fabricmanager-550"] == "550.54.14-1"
    assert not any("apt-get" in argv for argv, _ in log.commands)


def test_a_repository_without_fabric_manager_is_a_clear_error(
    repository_without_fabric_manager: Path, tmp_path: Path, system_state: None
) -> None:
    root = empty_tree(tmp_path / "guest")
    url = f"file://{repository_without_fabric_manager}"
    with pytest.raises(
        provision.MissingPackageError,
        match=rf"^{url} has no Fabric Manager at the driver's version 550\.54\.15 \(nvidia-fabricmanager-550 or "
        r"nvidia-fabricmanager; it has no version of either\).*error 802",
    ):
        install(root, pins.CudaPin("12.4", 550), url, Log(), fabric_manager=True)
    assert "nvidia-fabricmanager-550" not in installed(root)
