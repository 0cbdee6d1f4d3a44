"""Issue 42 class 1: every NVIDIA kernel module a host can load is found, however it was installed,
and the driver's version and flavour are read for both module kinds."""

from __future__ import annotations

import json
from pathlib import Path

from gpuhost.facts.model import ModuleOrigin, NvidiaFlavour
from gpuhost.facts.parsers import parse_nvidia_modules, parse_nvidia_release
from tests.hosts_as_they_come import SHAPES, shape_facts


def _written(shape: str, path: str) -> str:
    text: str = json.loads((SHAPES / shape / "case.json").read_text())["edit"][path]["write"]
    return text


def test_the_open_kernel_modules_version_line_gives_its_version_and_flavour():
    # Before: "NVIDIA UNIX Open Kernel Module for x86_64  550.120" read as driver version "for".
    line = _written("ubuntu-2404-drivers-550-server-open", "proc/driver/nvidia/version")
    assert parse_nvidia_release(line) == ("550.120", NvidiaFlavour.OPEN)
    # The form nixGL's issue 186 quotes from Ubuntu 24.04's nvidia-driver-565-open.
    quoted = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  "
        "(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024"
    )
    assert parse_nvidia_release(quoted) == ("565.57.01", NvidiaFlavour.OPEN)


def test_the_proprietary_version_line_still_reads():
    line = _written("ubuntu-2204-drivers-535", "proc/driver/nvidia/version")
    assert parse_nvidia_release(line) == ("535.183.01", NvidiaFlavour.PROPRIETARY)
    assert parse_nvidia_release("GCC version:  gcc version 12.3.0\n") == (None, None)


def test_ubuntu_precompiled_modules_are_found_for_every_installed_kernel(tmp_path: Path):
    facts = shape_facts("ubuntu-2204-drivers-535", tmp_path)
    nvidia = facts.nvidia
    names = {p.name for p in nvidia.packages or ()}
    # Before: none of Ubuntu's precompiled families was an NVIDIA package.
    assert {
        "linux-modules-nvidia-535-generic",
        "linux-modules-nvidia-535-5.15.0-113-generic",
        "linux-modules-nvidia-535-5.15.0-107-generic",
        "linux-objects-nvidia-535-5.15.0-113-generic",
        "linux-signatures-nvidia-5.15.0-107-generic",
    } <= names
    assert "linux-image-5.15.0-113-generic" not in names
    modules = nvidia.module_files or ()
    assert {m.kernel for m in modules} == {"5.15.0-113-generic", "5.15.0-107-generic"}
    assert len(modules) == 10 and {m.origin for m in modules} == {ModuleOrigin.PRECOMPILED}
    assert {m.flavour for m in modules} == {NvidiaFlavour.PROPRIETARY}
    assert {m.version for m in modules if m.name != "nvidia_uvm"} == {"535.183.01"}
    assert nvidia.loaded_version == "535.183.01" and nvidia.loaded_flavour is NvidiaFlavour.PROPRIETARY


def test_the_open_flavour_is_read_from_the_module_files_and_the_loaded_driver(tmp_path: Path):
    facts = shape_facts("ubuntu-2404-drivers-550-server-open", tmp_path)
    modules = facts.nvidia.module_files or ()
    assert {m.flavour for m in modules} == {NvidiaFlavour.OPEN} and len(modules) == 5
    assert facts.nvidia.loaded_version == "550.120" and facts.nvidia.loaded_flavour is NvidiaFlavour.OPEN
    assert "linux-modules-nvidia-550-server-open-generic" in {p.name for p in facts.nvidia.packages or ()}


def test_module_origins_and_in_tree_namesakes():
    text = (
        "module /lib/modules/6.1.0-50-amd64/updates/dkms/nvidia-current.ko\n"
        "module /lib/modules/6.1.0-50-amd64/updates/dkms/nvidia.ko\nlicense:        NVIDIA\n"
        "module /lib/modules/6.1.0-50-amd64/kernel/drivers/video/nvidia-uvm.ko\n"
        "module /lib/modules/6.1.0-50-amd64/kernel/drivers/platform/x86/nvidia-wmi-ec-backlight.ko\n"
        "module /lib/modules/6.1.0-50-amd64/extra/nvidia-drm.ko.xz\n"
    )
    found = {m.path.rsplit("/", 1)[-1]: m.origin for m in parse_nvidia_modules(text)}
    # The in-tree nvidia-wmi-ec-backlight is the kernel's own; Debian's DKMS build renames NVIDIA's
    # modules nvidia-current*, which are the driver's.
    assert found == {
        "nvidia-current.ko": ModuleOrigin.DKMS,
        "nvidia.ko": ModuleOrigin.DKMS,
        "nvidia-uvm.ko": ModuleOrigin.OTHER,
        "nvidia-drm.ko.xz": ModuleOrigin.OTHER,
    }
