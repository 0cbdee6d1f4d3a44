"""Pinned driver branches and CUDA toolkits: the table of what NVIDIA ships, the refusals a VM
entry gets before anything boots, the host's (inventory's) defaults, what a guest has installed
(read from a real guest's dpkg-query and /sys/module output), per-VM timeouts and package_repo."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.errors import InputError
from gpuhost.guest.lifecycle import Timeouts
from gpuhost.inventory import pins
from gpuhost.inventory.spec import find_vm, parse_vm
from gpuhost.targets import ConnectionDefaults, inventory_targets
from tests.helpers import FIXTURES

STACK = FIXTURES / "guest-stack"


def vm(**values: object) -> dict[str, object]:
    entry: dict[str, object] = {"name": "train-1", "vcpus": 4, "memory": "16G", "gpus": ["gpu0"]}
    entry.update(values)
    return entry


# --- the table and the pins -----------------------------------------------------------------------


def test_every_toolkit_in_the_table_needs_a_listed_branch() -> None:
    table = pins.driver_table()
    assert table.minimum_driver["12.4"] == "550.54.14" and table.minimum_driver["13.0"] == "580.65.06"
    for minimum in table.minimum_driver.values():
        assert pins.driver_branch_of(minimum) in table.branches


def test_a_vm_without_a_branch_gets_the_one_its_toolkit_shipped_with() -> None:
    spec = parse_vm(vm(cuda_version="12.4.1"), "inventory host gpu01: gpuhost_vms[0]")
    assert spec.driver_branch == 550
    assert spec.cuda_pin == pins.CudaPin("12.4.1", 550)
    assert spec.cuda_pin.toolkit_request == "cuda-toolkit-12-4=12.4.1*"
    assert spec.cuda_pin.driver_request == "nvidia-open=550.*"
    assert pins.CudaPin("12.6", 570).toolkit_request == "cuda-toolkit-12-6"
    assert parse_vm(vm(), "x").cuda_pin is None


def test_a_newer_branch_is_accepted_and_written_as_an_apt_preference() -> None:
    spec = parse_vm(vm(cuda_version="12.4", driver_branch="570.86.15"), "x")
    assert spec.driver_branch == 570
    assert spec.cuda_pin is not None
    preferences = spec.cuda_pin.apt_preferences()
    assert "Pin: version 570.*\nPin-Priority: 1001\n" in preferences and "/^(lib)?nvidia-/" in preferences


def test_a_combination_nvidia_does_not_ship_is_refused_naming_the_vm_values_and_fix() -> None:
    with pytest.raises(InputError) as caught:
        parse_vm(vm(cuda_version="12.8", driver_branch=550), "inventory host gpu01: gpuhost_vms[0]")
    message = str(caught.value)
    assert "gpu01" in message and "train-1" in message
    assert "cuda_version 12.8 with driver_branch 550" in message and "needs driver 570.26 or newer" in message
    assert "Set driver_branch to 570 or newer" in message


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"cuda_version": "12.7"}, "cuda_version 12.7 is not in gpuhost's table"),
        ({"cuda_version": "12.4", "driver_branch": 55}, "55 is not a driver branch"),
        ({"cuda_version": "12.4", "driver_branch": 590}, "driver branch 590 is not one NVIDIA released"),
        ({"cuda_version": "12.4", "driver_branch": "550; reboot"}, "is not a driver branch"),
        ({"cuda_version": "12.4", "driver_branch": True}, "is not a driver branch"),
        ({"driver_branch": 550}, "without cuda_version"),
    ],
)
def test_bad_pins_are_refused(values: dict[str, object], expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        parse_vm(vm(**values), "x")


def test_the_host_or_inventory_sets_the_pins_every_vm_takes(tmp_path: Path) -> None:
    variables = {
        "gpuhost_guest_cuda_version": "12.6",
        "gpuhost_guest_driver_branch": 565,
        "gpuhost_vms": [vm(), vm(name="train-2", driver_branch=570)],
    }
    assert find_vm(variables, "train-1", "x").cuda_pin == pins.CudaPin("12.6", 565)
    assert find_vm(variables, "train-2", "x").cuda_pin == pins.CudaPin("12.6", 570)  # its own wins
    with pytest.raises(
        InputError,
        match=r"gpuhost_guest_cuda_version 12\.8 with gpuhost_guest_driver_branch 565: "
        r".*Set gpuhost_guest_driver_branch to 570",
    ):
        find_vm({**variables, "gpuhost_guest_cuda_version": "12.8"}, "train-1", "x")
    # Set once for the inventory (all: vars:), read through Ansible's inventory like any host variable.
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n"
        "  vars:\n"
        "    gpuhost_guest_cuda_version: '12.4'\n"
        "    gpuhost_guest_driver_branch: 550\n"
        "  hosts:\n"
        "    gpu01:\n"
        "      ansible_host: 10.0.0.11\n"
        "      gpuhost_vms: [{name: train-1, vcpus: 4, memory: 16G, gpus: [gpu0]}]\n"
    )
    (target,) = inventory_targets(inventory, None, ConnectionDefaults())
    (spec,) = target.require_config().vms
    assert spec.cuda_pin == pins.CudaPin("12.4", 550)


# --- what a guest has -----------------------------------------------------------------------------


def test_a_real_guests_driver_and_toolkits_are_read() -> None:
    stack = pins.parse_installed(
        (STACK / "dpkg-query.txt").read_text(), (STACK / "sys-module-nvidia-version.txt").read_text()
    )
    # The loaded module's version; the runtime and config packages are no toolkit, 'un' is not installed.
    assert stack == pins.InstalledStack("580.159.04", {})
    assert pins.parse_dpkg_query((STACK / "dpkg-query.txt").read_text())["cuda-cudart-13-0"] == "13.0.96-1"
    assert "cuda-cudart-11-2" not in pins.parse_dpkg_query((STACK / "dpkg-query.txt").read_text())
    assert stack.driver(pins.CudaPin("13.0", 580)) is pins.Match.PINNED
    assert stack.driver(pins.CudaPin("12.4", 550)) is pins.Match.OTHER
    assert stack.toolkit(pins.CudaPin("13.0", 580)) is pins.Match.ABSENT
    assert stack.describe() == "driver 580.159.04, toolkit none"


def test_without_a_loaded_module_the_driver_package_tells_and_a_patch_pin_is_exact() -> None:
    dpkg = "nvidia-open\t550.54.15-1\tii \ncuda-toolkit-12-4\t12.4.0-1\tii \n"
    stack = pins.parse_installed(dpkg, "")
    assert stack.driver_version == "550.54.15"
    assert stack.toolkit(pins.CudaPin("12.4", 550)) is pins.Match.PINNED
    assert stack.toolkit(pins.CudaPin("12.4.1", 550)) is pins.Match.OTHER
    assert stack.toolkit(pins.CudaPin("12.6", 560)) is pins.Match.OTHER
    assert pins.parse_installed("", "").driver(pins.CudaPin("12.4", 550)) is pins.Match.ABSENT


# --- package_repo and timeouts --------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["http://10.0.0.5/cuda-12.4-local", "https://mirror.internal:8443/nvidia/", "file:///srv/cuda", "/srv/mirror/cuda"],
)
def test_package_repo_accepts_urls_and_host_paths(value: str) -> None:
    assert parse_vm(vm(cuda_version="12.4", package_repo=value), "x").package_repo == value


@pytest.mark.parametrize(
    "value", ["ftp://10.0.0.5/repo", "http://10.0.0.5/$(id)", "http://host/a b", "srv/cuda", "/srv/../etc", 5]
)
def test_package_repo_refuses_other_values(value: object) -> None:
    with pytest.raises(InputError, match="package_repo"):
        parse_vm(vm(cuda_version="12.4", package_repo=value), "x")


def test_timeouts_scale_with_gpus_and_memory_and_a_vm_overrides_a_step() -> None:
    base = Timeouts()
    big = base.for_guest(4, 512 * 1024, (), "x")
    # 4 GPUs at 60 s and 8 x 64 GiB at 30 s on each boot step; the smoke-test 300 s per further GPU.
    assert big.address == base.address + 480 and big.ssh == base.ssh + 480 and big.start == base.start + 480
    assert big.smoke_test == base.smoke_test + 900
    assert base.for_guest(0, 1024, (), "x").address == base.address + 30
    spec = parse_vm(vm(timeouts={"address": 1200, "dpkg_lock": 900}), "x")
    tuned = base.for_guest(4, 512 * 1024, spec.timeouts, "x")
    assert tuned.address == 1200 and tuned.dpkg_lock == 900 and tuned.ssh == big.ssh


@pytest.mark.parametrize(
    ("value", "expected"),
    [({"address": 0}, "from 1 to"), ({"address": "10m"}, "not a number"), ("600", "a mapping"), ({"a b": 5}, "name")],
)
def test_bad_timeouts_are_refused(value: object, expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        parse_vm(vm(timeouts=value), "x")


def test_a_timeout_for_no_step_is_refused_before_anything_runs() -> None:
    spec = parse_vm(vm(timeouts={"adress": 900}), "x")
    with pytest.raises(InputError, match=r"'adress' is not a step; steps: .*address"):
        Timeouts().overridden(spec.timeouts, "inventory host gpu01: VM train-1")


# --- Fabric Manager (a guest given the NVSwitches) ------------------------------------------------


def test_fabric_manager_is_looked_for_under_the_branch_naming_rule_first() -> None:
    assert pins.fabric_manager_packages(550) == ("nvidia-fabricmanager-550", "nvidia-fabricmanager")
    assert pins.fabric_manager_packages(590) == ("nvidia-fabricmanager", "nvidia-fabricmanager-590")


def test_an_installed_fabric_manager_is_read_and_its_dev_package_is_not_it() -> None:
    dpkg = (
        "nvidia-open\t550.54.15-1\tii \n"
        "nvidia-fabricmanager-dev-550\t550.54.15-1\tii \n"
        "nvidia-fabricmanager-550\t550.54.14-1\tii \n"
    )
    stack = pins.parse_installed(dpkg, "")
    assert stack.fabric_manager == pins.PackageVersion("nvidia-fabricmanager-550", "550.54.14-1")
    assert stack.fabric_manager_match() is pins.Match.OTHER
    assert pins.parse_installed(dpkg.replace("550.54.14-1", "550.54.15-1"), "").fabric_manager_match() is (
        pins.Match.PINNED
    )
    assert pins.parse_installed("nvidia-open\t550.54.15-1\tii \n", "").fabric_manager_match() is pins.Match.ABSENT
    # Ubuntu's own archive versions it 580.126.20-0ubuntu3: the upstream part is the driver's.
    assert pins.PackageVersion("nvidia-fabricmanager-580", "580.126.20-0ubuntu3").upstream == "580.126.20"


def test_the_fabric_manager_offered_at_the_drivers_exact_version_is_chosen() -> None:
    from gpuhost.guest.provision import fabric_manager_request

    madison = (
        " nvidia-fabricmanager-550 | 550.90.07-1 | file:/srv/repo ./ Packages\n"
        " nvidia-fabricmanager-550 | 550.54.15-1 | file:/srv/repo ./ Packages\n"
        "     nvidia-fabricmanager | 550.54.15-1 | file:/srv/repo ./ Packages\n"
    )
    offered = pins.parse_madison(madison)
    assert len(offered) == 3
    assert fabric_manager_request(offered, "550.54.15") == pins.PackageVersion(
        "nvidia-fabricmanager-550", "550.54.15-1"
    )
    assert fabric_manager_request(offered, "550.54.14") is None
    assert fabric_manager_request(pins.parse_madison(""), "550.54.15") is None


def test_a_fabric_manager_version_that_is_no_debian_version_is_not_taken() -> None:
    hostile = "nvidia-fabricmanager-550\t550.54.15-1\x1b[2J\tii \n"
    assert pins.parse_installed(hostile, "").fabric_manager is None
    assert pins.parse_madison(" nvidia-fabricmanager-550 | 550.54.15-1;reboot | file:/srv ./ Packages\n") == ()
