"""Fixtures of the lab tests: one cached image, and lab hosts booted once per module, in parallel.

The image comes from $GPUHOST_LAB_IMAGE_DIR, else the user's lab cache (~/.cache/gpuhost/lab/
images), so that CI and developers reuse it across runs; building it needs root. Each topology
gets its own lab directory under pytest's tmp_path, so the tests never touch a user's own lab.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuhost.cli.main import main
from gpuhost.lab import fleet
from gpuhost.lab import image as lab_image
from gpuhost.lab.boot import BootMode
from gpuhost.lab.builder import ensure_image
from gpuhost.lab.image import Image
from gpuhost.lab.paths import IMAGE_DIR_ENV, LabPaths, default_lab_dir
from gpuhost.lab.state import VmRecord

from .rotation import current

# The extended lab set (tests/lab/rotation.py): of its modules, only the one this commit's count
# chooses is collected (or those GPUHOST_LAB_EXTENDED names); pytest's header says which.
collect_ignore = list(current().left_out)

TOPOLOGIES_UNDER_TEST = ("gpu-pair", "shared-group")
MEMORY_MIB = 2048
# The two lab groups run side by side (pytest-xdist -n 2): up to four TCG hosts boot at once.
BOOT_TIMEOUT = 900


def _timing(message: str) -> None:
    # Printed in the -s/-rA output so CI logs show the measured times.
    print(f"[lab timing] {message}", flush=True)


@pytest.fixture(scope="session")
def image_dir() -> Path:
    configured = os.environ.get(IMAGE_DIR_ENV)
    return Path(configured) if configured else default_lab_dir() / "images"


@pytest.fixture(scope="session")
def base_image(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Image:
    for program in ("qemu-system-x86_64", "qemu-img", "ssh"):
        if shutil.which(program) is None:
            pytest.skip(f"lab tests need {program} (apt-get install qemu-system-x86 qemu-utils openssh-client)")
    paths = LabPaths(root=tmp_path_factory.mktemp("lab-image"), images=image_dir)
    cached = lab_image.find_image(paths, "base")
    if cached is None and os.geteuid() != 0:
        pytest.skip(f"no cached lab image in {image_dir} and building one needs root")
    started = time.monotonic()
    built = ensure_image(paths, "base")
    _timing(f"image {'reused' if built.reused else 'built'} in {time.monotonic() - started:.1f} s: {built.disk}")
    return built


@dataclass(frozen=True)
class LabHost:
    topology: str
    paths: LabPaths
    record: VmRecord

    # Generous: with the lab modules side by side, a command in a TCG host can wait minutes for a core.
    def run(self, *command: str, timeout: float = 600) -> str:
        result = fleet.run_on(self.paths, self.record, list(command), timeout=timeout)
        assert result.returncode == 0, f"{command} on {self.topology}: {result.stderr}"
        return result.stdout


@pytest.fixture(scope="module")
def lab_hosts(
    base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LabHost]]:
    """One host per topology under test, booted in parallel; all stopped by `lab down` at the end."""
    labs = {name: LabPaths(root=tmp_path_factory.mktemp(name), images=image_dir) for name in TOPOLOGIES_UNDER_TEST}
    started = time.monotonic()
    try:
        for name, paths in labs.items():
            fleet.up(paths, hosts=1, topology=name, memory_mib=MEMORY_MIB, wait=False)
        with ThreadPoolExecutor(len(labs)) as pool:
            waits = {
                name: pool.submit(fleet.wait_for_ssh, paths, fleet.status(paths)[0].hosts, BOOT_TIMEOUT)
                for name, paths in labs.items()
            }
            for name, future in waits.items():
                future.result()
                _timing(
                    f"{name}: SSH up {time.monotonic() - started:.1f} s after start "
                    f"({len(labs)} hosts booting in parallel)"
                )
        yield {name: LabHost(name, paths, fleet.status(paths)[0].hosts[0]) for name, paths in labs.items()}
    finally:
        for paths in labs.values():
            fleet.down(paths)


def uefi_lab_host(boot: BootMode, image_dir: Path, root: Path) -> Iterator[LabPaths]:
    """One UEFI lab host booted the way `boot` says, in a lab under `root`; stopped at the end.
    Skips where OVMF, QEMU or (to build the image) root is missing."""
    if not boot.ovmf or not boot.ovmf.code.exists():
        pytest.skip("needs Debian's ovmf package (apt-get install ovmf)")
    for program in ("qemu-system-x86_64", "qemu-img", "ssh"):
        if shutil.which(program) is None:
            pytest.skip(f"lab tests need {program}")
    paths = LabPaths(root=root, images=image_dir)
    if lab_image.find_image(paths, "base", boot.layout) is None and os.geteuid() != 0:
        pytest.skip(f"no cached {boot.describe()} lab image in {image_dir} and building one needs root")
    started = time.monotonic()
    try:
        fleet.up(paths, hosts=1, memory_mib=MEMORY_MIB, boot=boot, timeout=BOOT_TIMEOUT)
        _timing(f"{boot.describe()} host up in {time.monotonic() - started:.0f} s")
        yield paths
    finally:
        fleet.down(paths)


def on_lab_host(lab: LabPaths, *command: str, stdin: str | None = None, timeout: float = 600) -> str:
    """Run a command on the lab's one host (lab-1) of a single-host module; its output, once it succeeded."""
    result = fleet.run_on(lab, fleet.find_host(lab, "lab-1"), list(command), stdin=stdin, timeout=timeout)
    assert result.returncode == 0, f"{command}: {result.stdout}{result.stderr}"
    return result.stdout


def audit_report(lab: LabPaths, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`gpuhost audit --json` of the lab's inventory: the report of its one host (the first line)."""
    capsys.readouterr()  # what came before (the module fixture's [lab timing] line, when it ran in this test)
    main(["audit", "-i", str(lab.inventory), "--json"])
    report: dict[str, Any] = json.loads(capsys.readouterr().out.splitlines()[0])
    return report


def qemu_processes_under(directory: Path) -> list[int]:
    """PIDs of processes whose command line mentions `directory` (to prove none is left)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(directory).encode() in cmdline and b"qemu-system" in cmdline:
            found.append(int(proc.name))
    return found
