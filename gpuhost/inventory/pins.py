"""The driver branch and CUDA toolkit a guest gets, pinned: which packages that means in NVIDIA's
Debian/Ubuntu repositories, which combinations NVIDIA ships (gpuhost/data/cuda_drivers.yml), and
what a guest already has installed (a prebuilt image).

Pure: the commands that read the guest are in `provision`; here their output is parsed.
"""

from __future__ import annotations

import enum
import functools
import importlib.resources
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuhost.errors import InputError

TABLE = "cuda_drivers.yml"
DRIVER_VERSION = re.compile(r"^([0-9]{3,4})\.[0-9]+(?:\.[0-9]+)?$")
DRIVER_BRANCH = re.compile(r"^[0-9]{3,4}$")
# The driver's kernel modules from NVIDIA's repository, the ones NVIDIA recommends from Turing on;
# the same name in its Ubuntu and Debian repositories.
DRIVER_PACKAGE = "nvidia-open"
# Packages whose version is the driver's (e.g. 550.54.15-1): an apt preference gives the pinned
# branch's versions priority 1001, so that nvidia-open's dependencies come from that branch too,
# not the newest one. Other versions keep their default priority (the container toolkit's
# libnvidia-container1 1.x is not held back).
DRIVER_PIN_PACKAGES = "/^(lib)?nvidia-/ /^cuda-drivers/ /^libcuda/ /^libnv(cuvid|idia)/ /^xserver-xorg-video-nvidia/"

# Fabric Manager, for guests given the NVSwitches too (NVIDIA's full-passthrough model): without it
# running, CUDA fails on those GPUs with error 802 (system not yet initialized). Its version must be
# the driver's exactly; the branch preference above covers its name too (/^(lib)?nvidia-/), so it
# stays on the driver's branch like the driver's own packages.
# Its package name in NVIDIA's Debian/Ubuntu repositories: NVIDIA's packaging templates
# (github.com/NVIDIA/apt-packaging-fabric-manager, README) build nvidia-fabricmanager-XXX, "XXX is
# the first .-delimited field in the driver version", at the driver's version
# (nvidia-fabricmanager-460_460.32.03-1_amd64.deb), and note "the version of fabricmanager must
# match the NVIDIA driver installed". NVIDIA's driver installation guide ("Recent updates: Ubuntu
# 590 and later packages") says that from branch 590 the packages lose the branch in their name
# (its table: libnvidia-compute-580 -> libnvidia-compute, nvidia-dkms-580 -> nvidia-dkms); the
# excerpt read did not show Fabric Manager's row, so both names are looked for, the expected one
# first, and the one the repository has at the driver's exact version is installed.
FABRIC_MANAGER_PACKAGE = "nvidia-fabricmanager"
FABRIC_MANAGER_SERVICE = "nvidia-fabricmanager.service"
FABRIC_MANAGER_UNBRANCHED_FROM = 590
# nvidia-fabricmanager or nvidia-fabricmanager-550; not nvidia-fabricmanager-dev-550 (headers).
FABRIC_MANAGER_NAME = re.compile(r"^nvidia-fabricmanager(?:-[0-9]{3,4})?$")
# A Debian version (deb-version(7)'s characters): what the guest's dpkg or apt reports is data, and
# it goes into the step's detail and the install argument only when it is one.
DEBIAN_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]{0,99}$")


@dataclass(frozen=True)
class DriverTable:
    minimum_driver: Mapping[str, str]  # 'major.minor' -> the toolkit's driver version
    branches: tuple[int, ...]


@dataclass(frozen=True)
class CudaPin:
    """A VM's CUDA toolkit version (major.minor, optionally .patch) and driver branch."""

    cuda_version: str
    driver_branch: int

    @property
    def cuda_minor(self) -> str:
        return ".".join(self.cuda_version.split(".")[:2])

    @property
    def toolkit_package(self) -> str:
        """NVIDIA's package of one toolkit minor version: cuda-toolkit-12-4."""
        return "cuda-toolkit-" + self.cuda_minor.replace(".", "-")

    @property
    def toolkit_request(self) -> str:
        """The toolkit as apt-get install names it: the package of the minor version, restricted
        to the patch level when one is given (cuda-toolkit-12-4=12.4.1*)."""
        if self.cuda_version.count(".") == 2:
            return f"{self.toolkit_package}={self.cuda_version}*"
        return self.toolkit_package

    @property
    def driver_request(self) -> str:
        """nvidia-open restricted to the branch (nvidia-open=550.*): apt refuses when the
        repository has no version of it, where a bare name would take the newest."""
        return f"{DRIVER_PACKAGE}={self.driver_branch}.*"

    def apt_preferences(self) -> str:
        """/etc/apt/preferences.d/ text that keeps the driver's packages on the pinned branch."""
        return (
            "# Written by gpuhost guest up: the driver branch of this VM's inventory entry.\n"
            f"Package: {DRIVER_PIN_PACKAGES}\n"
            f"Pin: version {self.driver_branch}.*\n"
            "Pin-Priority: 1001\n"
        )

    def describe(self) -> str:
        return f"driver branch {self.driver_branch}, CUDA {self.cuda_version}"


@functools.cache
def driver_table() -> DriverTable:
    import yaml

    text = importlib.resources.files("gpuhost").joinpath("data", TABLE).read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    return DriverTable(
        minimum_driver={str(key): str(value) for key, value in document["minimum_driver"].items()},
        branches=tuple(int(branch) for branch in document["branches"]),
    )


def driver_branch_of(version: str) -> int:
    match = DRIVER_VERSION.fullmatch(version)
    if match is None:
        raise ValueError(f"{version!r} is not a driver version like 550.54.15")
    return int(match.group(1))


def validate_driver_branch(value: object, where: str) -> int:
    """A driver branch: 550 (or '550'); a full version like 550.54.15 names its branch too."""
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    match = DRIVER_VERSION.fullmatch(text)
    if match is not None:
        text = match.group(1)
    if not DRIVER_BRANCH.fullmatch(text):
        raise InputError(f"{where}: {value!r} is not a driver branch like 550.")
    branch = int(text)
    known = driver_table().branches
    if branch not in known:
        raise InputError(
            f"{where}: driver branch {branch} is not one NVIDIA released for Linux data center GPUs "
            f"({', '.join(map(str, known))}); fix the value, or add the branch to gpuhost/data/{TABLE}."
        )
    return branch


def resolve_pin(
    cuda_version: str, driver_branch: int | None, where: str, keys: tuple[str, str] = ("cuda_version", "driver_branch")
) -> CudaPin:
    """The pin of a VM: its driver branch, or the branch its toolkit shipped with; refused when
    NVIDIA ships no such combination (the toolkit needs a newer driver) or the toolkit is unknown.
    `keys` name the settings the two values came from (a VM's keys or the host's variables)."""
    cuda_key, branch_key = keys
    table = driver_table()
    minor = ".".join(cuda_version.split(".")[:2])
    minimum = table.minimum_driver.get(minor)
    if minimum is None:
        raise InputError(
            f"{where}: {cuda_key} {cuda_version} is not in gpuhost's table of CUDA toolkits and their drivers "
            f"({', '.join(table.minimum_driver)}); use one of those, or add its row (from NVIDIA's CUDA release "
            f"notes) to gpuhost/data/{TABLE}."
        )
    needed = driver_branch_of(minimum)
    if driver_branch is None:
        return CudaPin(cuda_version, needed)
    if driver_branch < needed:
        raise InputError(
            f"{where}: {cuda_key} {cuda_version} with {branch_key} {driver_branch}: NVIDIA does not ship "
            f"that combination, CUDA {minor} needs driver {minimum} or newer. Set {branch_key} to {needed} or "
            f"newer, or {cuda_key} to one the {driver_branch} branch supports."
        )
    return CudaPin(cuda_version, driver_branch)


def fabric_manager_packages(branch: int) -> tuple[str, ...]:
    """The names Fabric Manager of a driver branch may have in NVIDIA's repository, the one its
    naming rule gives first."""
    branched = f"{FABRIC_MANAGER_PACKAGE}-{branch}"
    if branch >= FABRIC_MANAGER_UNBRANCHED_FROM:
        return (FABRIC_MANAGER_PACKAGE, branched)
    return (branched, FABRIC_MANAGER_PACKAGE)


@dataclass(frozen=True, order=True)
class PackageVersion:
    """A Debian package at one version: installed, or offered by the sources."""

    name: str
    version: str  # the Debian version: 550.54.15-1

    @property
    def upstream(self) -> str:
        """550.54.15-1 -> 550.54.15: what the driver's version is compared with."""
        return self.version.split(":")[-1].rsplit("-", 1)[0]

    def describe(self) -> str:
        return f"{self.name} {self.version}"


class Match(str, enum.Enum):
    """What a guest has, against its pin."""

    ABSENT = "absent"  # install it
    PINNED = "pinned"  # already there: nothing to install
    OTHER = "other"  # another version: reported, never replaced


@dataclass(frozen=True)
class InstalledStack:
    """The driver and toolkit a guest has before gpuhost installs anything."""

    driver_version: str | None  # of the loaded module, else of the installed nvidia-open package
    toolkits: Mapping[str, str]  # installed cuda-toolkit-X-Y package -> its version (12.4.1-1)
    fabric_manager: PackageVersion | None = None

    def driver(self, pin: CudaPin) -> Match:
        if self.driver_version is None:
            return Match.ABSENT
        return Match.PINNED if driver_branch_of(self.driver_version) == pin.driver_branch else Match.OTHER

    def toolkit(self, pin: CudaPin) -> Match:
        version = self.toolkits.get(pin.toolkit_package)
        if version is None:
            return Match.OTHER if self.toolkits else Match.ABSENT
        upstream = version.split("-")[0]  # 12.4.1-1 -> 12.4.1
        if pin.cuda_version.count(".") == 2 and upstream != pin.cuda_version:
            return Match.OTHER
        return Match.PINNED

    def fabric_manager_match(self) -> Match:
        """Fabric Manager against the driver: the same version (PINNED), none, or another
        version, or one without a driver (OTHER: never replaced)."""
        if self.fabric_manager is None:
            return Match.ABSENT
        return Match.PINNED if self.fabric_manager.upstream == self.driver_version else Match.OTHER

    def describe(self) -> str:
        toolkits = ", ".join(f"{name} {version}" for name, version in sorted(self.toolkits.items()))
        text = f"driver {self.driver_version or 'none'}, toolkit {toolkits or 'none'}"
        if self.fabric_manager is not None:
            text += f", Fabric Manager {self.fabric_manager.describe()}"
        return text


def parse_dpkg_query(text: str) -> dict[str, str]:
    """`dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' ...` -> the installed
    packages (status 'ii') and their versions; known but removed packages ('un', 'rc') are left out."""
    installed: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[1] and fields[2].strip() == "ii":
            installed[fields[0]] = fields[1]
    return installed


def parse_installed(dpkg_text: str, module_version: str) -> InstalledStack:
    """What a guest has, from dpkg-query (DETECT_PATTERNS) and /sys/module/nvidia/version (empty
    when no module is loaded). The loaded module wins: it is what nvidia-smi reports."""
    packages = parse_dpkg_query(dpkg_text)
    loaded = module_version.strip()
    driver = loaded if DRIVER_VERSION.fullmatch(loaded) else None
    if driver is None and DRIVER_PACKAGE in packages:
        driver = packages[DRIVER_PACKAGE].split("-")[0]
    toolkits = {
        name: version for name, version in packages.items() if re.fullmatch(r"cuda-toolkit-[0-9]+-[0-9]+", name)
    }
    fabric = sorted(
        PackageVersion(name, version)
        for name, version in packages.items()
        if FABRIC_MANAGER_NAME.fullmatch(name) and DEBIAN_VERSION.fullmatch(version)
    )
    return InstalledStack(
        driver if driver and DRIVER_VERSION.fullmatch(driver) else None, toolkits, fabric[0] if fabric else None
    )


def parse_madison(text: str) -> tuple[PackageVersion, ...]:
    """`apt-cache madison nvidia-fabricmanager...` -> the Fabric Manager packages the sources offer,
    one a line: ' nvidia-fabricmanager-550 | 550.54.15-1 | file:/srv/repo ./ Packages'."""
    offered = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) == 3 and FABRIC_MANAGER_NAME.fullmatch(fields[0]) and DEBIAN_VERSION.fullmatch(fields[1]):
            offered.append(PackageVersion(fields[0], fields[1]))
    return tuple(offered)


# dpkg-query patterns for the detection: the toolkit packages, the driver's metapackage and
# Fabric Manager (its -dev package matches too and is left out by FABRIC_MANAGER_NAME).
DETECT_PATTERNS = ("cuda-toolkit-*", f"{DRIVER_PACKAGE}*", f"{FABRIC_MANAGER_PACKAGE}*")
