"""The `gpuhost_*` inventory variables the planner reads, each validated before anything connects.

Every value ends up in a file on the host or on its kernel command line, so each is checked
against a strict pattern here: `4;reboot`, `$(id)`, quotes and newlines are refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhost.errors import InputError
from gpuhost.inventory.spec import VmSpec, parse_vms, vm_defaults
from gpuhost.selection import GpuSelector, allowed_shared_groups

HUGEPAGES_AUTO = "auto"
BIND_AUTO = "auto"
_HUGEPAGES = re.compile(r"^(?:auto|[0-9]{1,6}|[0-9]{1,7}(?:[GT]i?B?|[gt]))$")
_MOUNT_POINT = re.compile(r"^/[A-Za-z0-9_./-]{0,200}$")
_REBOOT_TIMEOUT = re.compile(r"^[0-9]{1,5}$")
# The reboot command runs through the host's shell: words of safe characters only.
_REBOOT_COMMAND = re.compile(r"^[A-Za-z0-9_./=-]+(?: [A-Za-z0-9_./=-]+){0,8}$")
_PANIC_SECONDS = re.compile(r"^[0-9]{1,3}$")
_REFUSAL_CODE = re.compile(r"^plan\.[a-z_]+\.[a-z_]+$")  # a planner refusal's code (plan.hugepages.too_many)
# Tests only: refusal codes the planner turns into notes, so that a lab test can make a trial boot
# fail for real (e.g. plan.hugepages.too_many). Never set it on a real fleet: the refusals are what keep
# a host bootable. An environment variable of the controller, not an inventory variable, so that no
# inventory can carry it by accident.
FORCE_PAST_REFUSALS_ENV = "GPUHOST_TESTING_ONLY_FORCE_PAST_REFUSALS"
# Tests only, likewise: kernel options added to the trial entry alone, so that a lab test can make
# the trial kernel panic for real (rdinit= naming no file: the kernel cannot mount the root) and
# watch the host come back on its old command line by itself.
TRIAL_TESTING_OPTIONS_ENV = "GPUHOST_TESTING_ONLY_TRIAL_OPTIONS"
_KERNEL_OPTION = re.compile(r"^[a-z][a-z0-9_.-]{0,40}=[A-Za-z0-9_./:-]{1,100}$")
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0", ""}

# name -> default. Documented in playbooks/roles/*/defaults/main.yml.
DEFAULTS: dict[str, Any] = {
    "gpuhost_hugepages": HUGEPAGES_AUTO,
    "gpuhost_hugetlbfs_mount": "",
    "gpuhost_pci_realloc": False,
    "gpuhost_pcie_aspm_off": False,
    "gpuhost_nomodeset": False,
    "gpuhost_blacklist_snd_hda_intel": False,
    "gpuhost_bind_by": BIND_AUTO,
    "gpuhost_remove_nvidia_driver": True,
    "gpuhost_trial_boot": True,
    "gpuhost_trial_panic_seconds": 10,
    "gpuhost_require_rescue": False,
}
# gpuhost_verify's default wait for a host to come back from its reboot (the role's defaults/main.yml;
# tests/plan/test_rescue.py keeps them equal): the trial's rescue deadline is derived from it.
VERIFY_REBOOT_TIMEOUT_DEFAULT = 900


def gpus_variable(variables: Mapping[str, Any], where: str) -> object:
    """A host's gpuhost_gpus as GpuSelector.parse takes it. Left out, it means every NVIDIA GPU; set
    to null (`gpuhost_gpus:` with its list forgotten, or emptied by a template) it is refused as `[]`
    is, never read as every GPU."""
    if "gpuhost_gpus" in variables and variables["gpuhost_gpus"] is None:
        raise InputError(
            f"{where}: gpuhost_gpus is set but empty (null). List the GPUs to pass through, or leave "
            "gpuhost_gpus out for every NVIDIA GPU."
        )
    return variables.get("gpuhost_gpus")


@dataclass(frozen=True)
class PlanSettings:
    gpus: GpuSelector
    allow_shared_group: tuple[str, ...] = ()
    hugepages: str = HUGEPAGES_AUTO  # auto, N (pages) or a size such as 64G
    hugetlbfs_mount: str | None = None
    pci_realloc: bool = False
    pcie_aspm_off: bool = False
    nomodeset: bool = False
    blacklist_snd_hda_intel: bool = False
    bind_by: str = BIND_AUTO  # auto, ids or address
    remove_nvidia_driver: bool = True
    trial_boot: bool = True  # boot the new command line once (grub-reboot) before making it the default
    trial_panic_seconds: int = 10  # panic=N on the trial entry: a panicking trial reboots onto the old default
    forced_past_refusals: tuple[str, ...] = ()  # tests only (FORCE_PAST_REFUSALS_ENV)
    trial_testing_options: tuple[str, ...] = ()  # tests only (TRIAL_TESTING_OPTIONS_ENV)
    vms: tuple[VmSpec, ...] = ()  # gpuhost_vms: the 1 GiB pages go on their GPUs' nodes
    # gpuhost_verify_reboot_timeout: how long the controller waits for a host to come back from a reboot
    verify_reboot_timeout: int = VERIFY_REBOOT_TIMEOUT_DEFAULT
    require_rescue: bool = False  # refuse a trial boot with no watchdog armed (apply --require-rescue)

    @classmethod
    def from_variables(cls, variables: Mapping[str, Any], where: str, gpus: object = None) -> PlanSettings:
        """Validate a host's variables; `where` names the host in errors; `gpus` overrides gpuhost_gpus."""

        def get(name: str) -> Any:
            return variables.get(name, DEFAULTS[name])

        allowed = allowed_shared_groups(variables, where)
        hugepages = str(get("gpuhost_hugepages")).strip()
        if not _HUGEPAGES.fullmatch(hugepages):
            raise InputError(
                f"{where}: gpuhost_hugepages {get('gpuhost_hugepages')!r} must be 'auto', a number of 1 GiB pages "
                "(e.g. 400) or a size (e.g. 512G, 2T). Fix the inventory value."
            )
        mount = str(get("gpuhost_hugetlbfs_mount") or "").strip()
        if mount and (not _MOUNT_POINT.fullmatch(mount) or ".." in mount.split("/")):
            raise InputError(
                f"{where}: gpuhost_hugetlbfs_mount {mount!r} must be an absolute path of letters, digits, "
                "'_', '.', '-' and '/' (e.g. /mnt/hugepages-1G), or empty for none."
            )
        bind_by = str(get("gpuhost_bind_by"))
        if bind_by not in (BIND_AUTO, "ids", "address"):
            raise InputError(f"{where}: gpuhost_bind_by {bind_by!r} must be auto, ids or address.")
        panic = str(get("gpuhost_trial_panic_seconds")).strip()
        if not _PANIC_SECONDS.fullmatch(panic) or not 1 <= int(panic) <= 300:
            raise InputError(
                f"{where}: gpuhost_trial_panic_seconds {get('gpuhost_trial_panic_seconds')!r} must be a whole number "
                "of seconds from 1 to 300 (how long a panicking trial boot waits before it reboots)."
            )
        _check_reboot_variables(variables, where)
        return cls(
            gpus=GpuSelector.parse(gpus if gpus is not None else gpus_variable(variables, where), where),
            allow_shared_group=allowed,
            hugepages=hugepages,
            hugetlbfs_mount=mount or None,
            pci_realloc=_flag(variables, "gpuhost_pci_realloc", where),
            pcie_aspm_off=_flag(variables, "gpuhost_pcie_aspm_off", where),
            nomodeset=_flag(variables, "gpuhost_nomodeset", where),
            blacklist_snd_hda_intel=_flag(variables, "gpuhost_blacklist_snd_hda_intel", where),
            bind_by=bind_by,
            remove_nvidia_driver=_flag(variables, "gpuhost_remove_nvidia_driver", where),
            trial_boot=_flag(variables, "gpuhost_trial_boot", where),
            trial_panic_seconds=int(panic),
            forced_past_refusals=forced_past_refusals(),
            trial_testing_options=trial_testing_options(),
            vms=parse_vms(variables.get("gpuhost_vms"), where, vm_defaults(variables)),
            verify_reboot_timeout=int(
                str(variables.get("gpuhost_verify_reboot_timeout", VERIFY_REBOOT_TIMEOUT_DEFAULT)).strip()
            ),
            require_rescue=_flag(variables, "gpuhost_require_rescue", where),
        )


def _check_reboot_variables(variables: Mapping[str, Any], where: str) -> None:
    """The gpuhost_verify and gpuhost_rollback roles' variables reach the host too (reboot command, timeout)."""
    for role in ("gpuhost_verify", "gpuhost_rollback"):
        name = f"{role}_reboot_timeout"
        if name in variables:
            timeout = str(variables[name]).strip()
            if not _REBOOT_TIMEOUT.fullmatch(timeout) or not 30 <= int(timeout) <= 86400:
                raise InputError(
                    f"{where}: {name} {variables[name]!r} must be a whole number of seconds from 30 to 86400."
                )
        name = f"{role}_reboot_command"
        if name in variables:
            command = str(variables[name])
            if not _REBOOT_COMMAND.fullmatch(command) or ".." in command:
                raise InputError(
                    f"{where}: {name} {command!r} must be a plain command of words of letters, digits and "
                    "'_./=-' (e.g. 'systemctl --no-block reboot'): it runs in the host's shell."
                )


def forced_past_refusals() -> tuple[str, ...]:
    """The refusal codes named in FORCE_PAST_REFUSALS_ENV (tests only), validated."""
    codes = tuple(code.strip() for code in os.environ.get(FORCE_PAST_REFUSALS_ENV, "").split(",") if code.strip())
    for code in codes:
        if not _REFUSAL_CODE.fullmatch(code):
            raise InputError(
                f"{FORCE_PAST_REFUSALS_ENV}: {code!r} is not a refusal code (e.g. plan.hugepages.too_many)."
            )
    return codes


def trial_testing_options() -> tuple[str, ...]:
    """The kernel options named in TRIAL_TESTING_OPTIONS_ENV (tests only), validated."""
    options = tuple(os.environ.get(TRIAL_TESTING_OPTIONS_ENV, "").split())
    for option in options:
        if not _KERNEL_OPTION.fullmatch(option) or ".." in option:
            raise InputError(
                f"{TRIAL_TESTING_OPTIONS_ENV}: {option!r} is not a plain kernel option (e.g. rdinit=/none)."
            )
    return options


def _flag(variables: Mapping[str, Any], name: str, where: str) -> bool:
    value = variables.get(name, DEFAULTS[name])
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InputError(f"{where}: {name} {value!r} must be true or false.")
