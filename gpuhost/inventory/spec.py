"""What a VM is (`gpuhost_vms` in the inventory) and how a host wants its VMs laid out.

Every inventory value is validated here, before anything is rendered or reaches a host: names,
sizes, counts and paths. Values end up in XML (escaped by the template) and, for the guest
lifecycle, in commands on the host, so shell metacharacters are refused outright.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from gpuhost.errors import InputError
from gpuhost.facts.model import Firmware, TextEnum
from gpuhost.inventory.pins import CudaPin, resolve_pin, validate_driver_branch
from gpuhost.inventory.policy import AuditPolicy
from gpuhost.selection import GpuSelector

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
GPU_ALIAS = re.compile(r"^gpu([0-9]{1,3})$")
CUDA_VERSION = re.compile(r"^[0-9]{1,2}\.[0-9]{1,2}(?:\.[0-9]{1,3})?$")
CPULIST = re.compile(r"^[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*$")
# Linux builds for at most 8192 CPUs (CONFIG_NR_CPUS): a larger cpulist entry is a typo.
MAX_CPUS = 8192
SSH_KEY = re.compile(
    r"^(?:ssh-(?:ed25519|rsa|dss)|ecdsa-sha2-nistp(?:256|384|521)|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+(?: .*)?$"
)
_SIZE = re.compile(r"^\s*([0-9]+)\s*([KMGT])(?:i?B)?\s*$", re.IGNORECASE)
# Characters and sequences that have no business in a name, path or kernel command line here.
_FORBIDDEN = (";", "$(", "`", "'", '"', "\n", "\r", "\0", "\\", "<", ">", "&", "|")

NAME_MAX = 64
MEMORY_MIN_MIB = 256
MEMORY_MAX_MIB = 16 * 1024 * 1024  # 16 TiB
DISK_MAX_GIB = 64 * 1024
VCPUS_MAX = 4096


DEFAULT_OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
DEFAULT_OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
DEFAULT_IMAGES_DIR = "/var/lib/libvirt/images"
DEFAULT_SERIAL_LOG_DIR = "/var/log/libvirt/qemu"
DEFAULT_NVRAM_DIR = "/var/lib/libvirt/qemu/nvram"

_VM_KEYS = frozenset(
    {
        "name",
        "vcpus",
        "memory",
        "gpus",
        "base_image",
        "disk_size",
        "ssh_key",
        "cuda_version",
        "hugepages",
        "network",
        "domain_type",
        "firmware",
        "kernel",
        "initrd",
        "cmdline",
        "packages",
        "driver_branch",
        "package_repo",
        "timeouts",
    }
)
# Host variables (set them in the inventory's `all: vars:` for a fleet) that every VM of the host
# takes unless its own entry says otherwise.
VM_DEFAULT_VARIABLES = {"cuda_version": "gpuhost_guest_cuda_version", "driver_branch": "gpuhost_guest_driver_branch"}
# A local Debian repository (flat: Packages beside the .deb files, as dpkg-scanpackages writes it
# and as NVIDIA's local installers carry it) on the guest's network, or a directory in the guest.
PACKAGE_REPO_URL = re.compile(
    r"^(?:https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?|https?://\[[0-9A-Fa-f:]+\](?::[0-9]{1,5})?|file://)(?:/[A-Za-z0-9._~/%+-]*)?$"
)
STEP_TIMEOUT_MAX_S = 24 * 3600
# Debian/Ubuntu package names (for the guest's cloud-init seed).
PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}$")


class DomainType(TextEnum):
    """libvirt's domain type: how the VM's CPU runs."""

    KVM = "kvm"  # hardware virtualisation
    QEMU = "qemu"  # QEMU's code translator (TCG): tests and emulated lab hosts without KVM


class VmHugePages(TextEnum):
    """Whether a VM's memory is backed by the host's 1 GiB pages."""

    AUTO = "auto"  # when the host has reserved them
    ON = "on"  # required: rendering is refused without them
    OFF = "off"


@dataclass(frozen=True)
class VmSpec:
    """One entry of `gpuhost_vms`, validated."""

    name: str
    vcpus: int
    memory_mib: int
    gpus: tuple[str, ...]  # 'all', 'gpuN' aliases or PCI addresses (normalised to 0000:bb:dd.f); () for 'none'
    base_image: str | None = None  # path on the host of the cloud image the disk is created from
    disk_size_gib: int | None = None
    ssh_key: str | None = None  # public key text ('ssh-ed25519 AAAA... comment') or a path on the controller
    cuda_version: str | None = None
    hugepages: VmHugePages = VmHugePages.AUTO
    network: str | None = "default"  # a libvirt network name; None: no network device
    domain_type: DomainType = DomainType.KVM
    firmware: Firmware = Firmware.UEFI  # uefi (OVMF), or bios (SeaBIOS) for tiny test guests
    kernel: str | None = None  # direct kernel boot (tests): paths on the host
    initrd: str | None = None
    cmdline: str | None = None
    # Installed by cloud-init at first boot (`gpuhost guest up`); an Ubuntu cloud image needs
    # python3-venv here. Each entry makes cloud-init run apt-get update first.
    packages: tuple[str, ...] = ()
    # The driver branch installed with cuda_version (550): the VM's, the host's
    # gpuhost_guest_driver_branch, or the branch the toolkit shipped with; None without cuda_version.
    driver_branch: int | None = None
    # Where the guest installs the driver and CUDA from instead of NVIDIA's network repository: an
    # http(s):// or file:// URL of a flat Debian repository (the guest uses no other source), or
    # an absolute path of one on the host, copied into the guest.
    package_repo: str | None = None
    # Per-step timeouts in seconds ({address: 900}) over the defaults that scale with the guest.
    timeouts: tuple[tuple[str, float], ...] = ()

    @property
    def cuda_pin(self) -> CudaPin | None:
        if self.cuda_version is None or self.driver_branch is None:
            return None
        return CudaPin(self.cuda_version, self.driver_branch)

    @property
    def has_disk(self) -> bool:
        """A disk unless the VM boots a kernel directly and names no image or size (test guests)."""
        return self.kernel is None or self.base_image is not None or self.disk_size_gib is not None


@dataclass(frozen=True)
class HostPolicy:
    """How a host lays out its VMs: the GPUs it passes through and host-side paths."""

    gpus: GpuSelector
    allow_shared_group: tuple[str, ...] = ()
    ovmf_code: str = DEFAULT_OVMF_CODE
    ovmf_vars: str = DEFAULT_OVMF_VARS
    images_dir: str = DEFAULT_IMAGES_DIR
    serial_log_dir: str = DEFAULT_SERIAL_LOG_DIR
    nvram_dir: str = DEFAULT_NVRAM_DIR
    reserved_cpus: str = ""  # host CPUs never given to vCPUs (cpulist: '0-1,64-65')


def host_policy(variables: Mapping[str, Any], audit_policy: AuditPolicy, where: str) -> HostPolicy:
    """The host's render policy from its inventory variables (gpuhost_ovmf_code, ...)."""
    reserved = str(variables.get("gpuhost_reserved_cpus", "") or "").strip()
    if reserved:
        validate_cpulist(reserved, f"{where}: gpuhost_reserved_cpus", "Fix gpuhost_reserved_cpus.")
    return HostPolicy(
        gpus=audit_policy.gpus,
        allow_shared_group=audit_policy.allow_shared_group,
        ovmf_code=validate_path(variables.get("gpuhost_ovmf_code", DEFAULT_OVMF_CODE), f"{where}: gpuhost_ovmf_code"),
        ovmf_vars=validate_path(variables.get("gpuhost_ovmf_vars", DEFAULT_OVMF_VARS), f"{where}: gpuhost_ovmf_vars"),
        images_dir=validate_path(
            variables.get("gpuhost_images_dir", DEFAULT_IMAGES_DIR), f"{where}: gpuhost_images_dir"
        ),
        serial_log_dir=validate_path(
            variables.get("gpuhost_serial_log_dir", DEFAULT_SERIAL_LOG_DIR), f"{where}: gpuhost_serial_log_dir"
        ),
        nvram_dir=validate_path(variables.get("gpuhost_nvram_dir", DEFAULT_NVRAM_DIR), f"{where}: gpuhost_nvram_dir"),
        reserved_cpus=reserved,
    )


def validate_cpulist(text: str, where: str, remedy: str) -> str:
    """A CPU list like '0-1,64-65', each range going up, within the CPUs Linux can have (`remedy`
    ends the message of a range that does not)."""
    if not CPULIST.fullmatch(text):
        raise InputError(f"{where}: {text!r} is not a CPU list like '0-1,64-65'.")
    for part in text.split(","):
        low, _, high = part.partition("-")
        # Checked here, before anything expands the range: '5-1' is empty, '0-999999999999' exhausts memory.
        if int(low) > int(high or low) or int(high or low) >= MAX_CPUS:
            raise InputError(f"{where}: range {part!r} must go up, within CPUs 0 to {MAX_CPUS - 1}. {remedy}")
    return text


def find_vm(variables: Mapping[str, Any], name: str, where: str) -> VmSpec:
    """The VM called `name` in the host's `gpuhost_vms` (every entry is validated)."""
    return pick_vm(parse_vms(variables.get("gpuhost_vms"), where, vm_defaults(variables)), name, where)


def vm_defaults(variables: Mapping[str, Any]) -> dict[str, object]:
    """The VM keys a host (or the whole inventory) sets for all its VMs: gpuhost_guest_cuda_version, ..."""
    return {key: variables[name] for key, name in VM_DEFAULT_VARIABLES.items() if variables.get(name) is not None}


def pick_vm(vms: tuple[VmSpec, ...], name: str, where: str) -> VmSpec:
    """The VM called `name` among a host's parsed `gpuhost_vms`."""
    for vm in vms:
        if vm.name == name:
            return vm
    known = ", ".join(vm.name for vm in vms) or "none"
    raise InputError(f"{where}: no VM {name!r} in gpuhost_vms (defined: {known}).")


def parse_vms(value: object, where: str, defaults: Mapping[str, object] | None = None) -> tuple[VmSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(f"{where}: gpuhost_vms must be a list of VMs (name, vcpus, memory, gpus, ...).")
    vms = tuple(parse_vm(entry, f"{where}: gpuhost_vms[{index}]", defaults) for index, entry in enumerate(value))
    seen: set[str] = set()
    for vm in vms:
        if vm.name in seen:
            raise InputError(f"{where}: gpuhost_vms names VM {vm.name!r} twice.")
        seen.add(vm.name)
    return vms


def parse_vm(entry: object, where: str, defaults: Mapping[str, object] | None = None) -> VmSpec:
    if not isinstance(entry, Mapping):
        raise InputError(f"{where}: each VM must be a mapping (name, vcpus, memory, gpus, ...), not {entry!r}.")
    unknown = sorted(str(key) for key in entry if key not in _VM_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_VM_KEYS))}.")
    name = validate_name(entry.get("name"), f"{where}: name")
    where = f"{where} ({name})"
    # The VM's own values first, then the host's gpuhost_guest_* defaults, named as where they came from.
    pinned: dict[str, object] = {}
    named = dict.fromkeys(VM_DEFAULT_VARIABLES, "")
    for key, variable in VM_DEFAULT_VARIABLES.items():
        if entry.get(key) is not None:
            pinned[key], named[key] = entry[key], key
        elif defaults and defaults.get(key) is not None:
            pinned[key], named[key] = defaults[key], variable
    cuda_version = (
        _cuda_version(pinned["cuda_version"], f"{where}: {named['cuda_version']}") if named["cuda_version"] else None
    )
    driver_branch = (
        validate_driver_branch(pinned["driver_branch"], f"{where}: {named['driver_branch']}")
        if named["driver_branch"]
        else None
    )
    if cuda_version is not None:
        keys = (named["cuda_version"], named["driver_branch"] or "driver_branch")
        driver_branch = resolve_pin(cuda_version, driver_branch, where, keys).driver_branch
    elif driver_branch is not None:
        raise InputError(f"{where}: driver_branch {driver_branch} without cuda_version; set cuda_version too.")
    return VmSpec(
        name=name,
        vcpus=validate_count(entry.get("vcpus"), f"{where}: vcpus", 1, VCPUS_MAX),
        memory_mib=validate_size_mib(entry.get("memory"), f"{where}: memory", MEMORY_MIN_MIB, MEMORY_MAX_MIB),
        gpus=validate_gpus(entry.get("gpus"), f"{where}: gpus"),
        base_image=_optional(entry, "base_image", where, validate_path),
        disk_size_gib=_optional(entry, "disk_size", where, _disk_size),
        ssh_key=_optional(entry, "ssh_key", where, validate_ssh_key),
        cuda_version=cuda_version,
        driver_branch=driver_branch,
        package_repo=_optional(entry, "package_repo", where, validate_package_repo),
        timeouts=_timeouts(entry.get("timeouts", {}), f"{where}: timeouts"),
        hugepages=_enum_choice(entry.get("hugepages", "auto"), f"{where}: hugepages", VmHugePages),
        network=_network(entry.get("network", "default"), f"{where}: network"),
        domain_type=_enum_choice(entry.get("domain_type", "kvm"), f"{where}: domain_type", DomainType),
        firmware=_enum_choice(entry.get("firmware", "uefi"), f"{where}: firmware", Firmware),
        kernel=_optional(entry, "kernel", where, validate_path),
        initrd=_optional(entry, "initrd", where, validate_path),
        cmdline=_optional(entry, "cmdline", where, validate_cmdline),
        packages=_packages(entry.get("packages", []), f"{where}: packages"),
    )


def _packages(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InputError(f"{where}: a list of Debian package names is required, not {value!r}.")
    for item in value:
        if not isinstance(item, str) or not PACKAGE.fullmatch(item):
            raise InputError(f"{where}: {item!r} is not a Debian package name (lower case, digits, '+', '-', '.').")
    return tuple(value)


def _optional(entry: Mapping[Any, Any], key: str, where: str, validate: Any) -> Any:
    value = entry.get(key)
    return None if value is None else validate(value, f"{where}: {key}")


def _refuse_forbidden(text: str, where: str) -> None:
    for bad in _FORBIDDEN:
        if bad in text:
            raise InputError(f"{where}: {text!r} contains {bad!r}, which gpuhost does not accept here.")


def validate_name(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: a name is required (letters, digits, '_', '.', '-').")
    if len(value) > NAME_MAX or not NAME.fullmatch(value) or ".." in value:
        raise InputError(
            f"{where}: {value!r} is not a valid name: start with a letter or digit, then letters, digits, "
            f"'_', '.', '-' (at most {NAME_MAX} characters, no '..')."
        )
    return value


def validate_count(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(f"{where}: a whole number from {low} to {high} is required, not {value!r}.")
    text = str(value).strip()
    # ASCII digits: str.isdigit() accepts '²', which int() then refuses (a traceback).
    if not re.fullmatch("[0-9]+", text) or not low <= int(text) <= high:
        raise InputError(f"{where}: {value!r} is not a whole number from {low} to {high}.")
    return int(text)


def parse_size_mib(value: object, where: str) -> int:
    """'64G', '64GiB', '65536M', '1T' -> MiB. A bare number is refused: its unit would be a guess."""
    match = _SIZE.fullmatch(str(value)) if isinstance(value, str) else None
    if match is None:
        raise InputError(f"{where}: {value!r} is not a size; write it with a unit, like 64G, 65536M or 1T.")
    number, unit = int(match.group(1)), match.group(2).upper()
    kib = number * {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[unit]
    if kib % 1024:
        raise InputError(f"{where}: {value!r} is not a whole number of MiB.")
    return kib // 1024


def validate_size_mib(value: object, where: str, low: int, high: int) -> int:
    mib = parse_size_mib(value, where)
    if not low <= mib <= high:
        raise InputError(f"{where}: {value!r} is outside {low} MiB to {high // (1024 * 1024)} TiB.")
    return mib


def _disk_size(value: object, where: str) -> int:
    mib = parse_size_mib(value, where)
    if mib % 1024 or not 1 <= mib // 1024 <= DISK_MAX_GIB:
        raise InputError(f"{where}: {value!r} must be a whole number of GiB from 1G to {DISK_MAX_GIB // 1024}T.")
    return mib // 1024


def validate_path(value: object, where: str) -> str:
    """An absolute path with no '..' component and no shell or XML metacharacters."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: an absolute path is required, not {value!r}.")
    _refuse_forbidden(value, where)
    if not value.startswith("/"):
        raise InputError(f"{where}: {value!r} is not an absolute path.")
    if ".." in value.split("/"):
        raise InputError(f"{where}: {value!r} contains '..'; write the path without it.")
    if any(ord(ch) < 32 for ch in value):
        raise InputError(f"{where}: {value!r} contains a control character.")
    return value


def validate_cmdline(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: a kernel command line (text) is required, not {value!r}.")
    _refuse_forbidden(value, where)
    if any(ord(ch) < 32 for ch in value) or len(value) > 2048:
        raise InputError(f"{where}: the kernel command line has a control character or is over 2048 characters.")
    return value


def validate_ssh_key(value: object, where: str) -> str:
    """A public key ('ssh-ed25519 AAAA... comment') or the path of a .pub file on the controller."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: an SSH public key or the path of one is required.")
    text = value.strip()
    _refuse_forbidden(text, where)
    if " " in text:
        if not SSH_KEY.fullmatch(text):
            raise InputError(f"{where}: {text[:40]!r}... is not an OpenSSH public key line.")
        return text
    if text.startswith("~/") and ".." not in text.split("/"):
        return text
    return validate_path(text, where)


def validate_package_repo(value: object, where: str) -> str:
    """An http(s):// or file:// URL of a flat Debian repository, or an absolute path on the host."""
    text = str(value).strip() if isinstance(value, str) else ""
    if text.startswith("/"):
        return validate_path(text, where)
    if not PACKAGE_REPO_URL.fullmatch(text):
        raise InputError(
            f"{where}: {value!r} is neither an http://, https:// or file:// URL (letters, digits, '._~/%+-' in its "
            "path) nor an absolute path on the host; give the directory that holds the repository's Packages file."
        )
    return text


def _timeouts(value: object, where: str) -> tuple[tuple[str, float], ...]:
    """{step: seconds}; the step names are checked against the lifecycle's steps by `guest up`."""
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: a mapping of step names to seconds (address: 900) is required, not {value!r}.")
    steps: list[tuple[str, float]] = []
    for step, seconds in value.items():
        name = validate_name(step, f"{where}: step")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 1 <= seconds <= STEP_TIMEOUT_MAX_S:
            raise InputError(f"{where}: {name}: {seconds!r} is not a number of seconds from 1 to {STEP_TIMEOUT_MAX_S}.")
        steps.append((name, float(seconds)))
    return tuple(steps)


def _cuda_version(value: object, where: str) -> str:
    text = str(value).strip()
    if not CUDA_VERSION.fullmatch(text):
        raise InputError(f"{where}: {value!r} is not a CUDA version like 12.4 or 12.4.1.")
    return text


_Choice = TypeVar("_Choice", bound=Enum)


def _enum_choice(value: object, where: str, choices: type[_Choice]) -> _Choice:
    """`value` as a member of the closed set `choices`, by its inventory word (YAML's true/false: on/off)."""
    text = "on" if value is True else "off" if value is False else str(value)
    for choice in choices:
        if choice.value == text:
            return choice
    raise InputError(f"{where}: {value!r} is not one of {', '.join(str(choice.value) for choice in choices)}.")


def _network(value: object, where: str) -> str | None:
    if value is None or value == "none":
        return None
    return validate_name(value, where)


def validate_gpus(value: object, where: str) -> tuple[str, ...]:
    """'all', or a list of 'gpuN' aliases (the host's passthrough GPUs in PCI address order) and
    PCI addresses. Whether they exist on the host is decided at render time, against its facts.
    'none' (said explicitly, never by omission) is a guest without a GPU: the lifecycle rehearsed
    on a machine that has none, as CI does."""
    if value == "all":
        return ("all",)
    if value == "none":
        return ()
    items: list[object]
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",") if item.strip()]
    elif isinstance(value, list):
        items = list(value)
    else:
        raise InputError(f"{where}: 'all' or a list of GPUs (gpu0, gpu1, or PCI addresses) is required.")
    if not items:
        raise InputError(
            f"{where}: the list is empty; a gpuhost VM gets at least one GPU (write gpus: none for a VM without one)."
        )
    names: list[str] = []
    for item in items:
        text = str(item).strip()
        if GPU_ALIAS.fullmatch(text):
            names.append(text)
            continue
        _refuse_forbidden(text, where)
        try:
            selector = GpuSelector.parse([text], where)
        except InputError:
            selector = None
        if selector is None or not selector.addresses:
            raise InputError(
                f"{where}: {text!r} names no GPU: use gpu0, gpu1, ... (the host's passthrough GPUs in PCI "
                "address order, as `gpuhost audit` lists them) or a PCI address like 0000:41:00.0."
            )
        names.append(selector.addresses[0])
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InputError(f"{where}: {', '.join(duplicates)} listed more than once.")
    return tuple(names)
