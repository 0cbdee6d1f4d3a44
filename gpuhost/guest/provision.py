"""Inside the guest, over SSH (gpuhost.transport): wait for it, install CUDA, install gpuhost from
wheels without an index, run the smoke-test and bring its report back.

Every remote command is an argv list (joined with shlex by the transport): no value reaches a
shell unquoted. Commands run through sudo as the cloud-init user gpuhost made.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuhost.errors import GpuhostError, InputError
from gpuhost.facts.model import NCCL_CONF, NCCL_GUEST_TOPOLOGY
from gpuhost.facts.parsers import parse_os_release
from gpuhost.guest.wheels import Wheel
from gpuhost.inventory import pins
from gpuhost.transport import CommandResult, Transport, TransportError

GUEST_DIR = "/opt/gpuhost"
VENV = f"{GUEST_DIR}/venv"
WHEELS_DIR = f"{GUEST_DIR}/wheels"
REPORT_DIR = "/var/lib/gpuhost"
REPORT_JSON = f"{REPORT_DIR}/smoke-test.json"
# Runs `pip install --no-index FILES...` with the venv's Python: pip from the system's pip wheel
# when there is one, else from ensurepip. A fixed script; the wheel paths are its arguments.
PIP_FROM_WHEEL = (
    f"set -e; python={VENV}/bin/python; "
    "wheel=$(ls /usr/share/python-wheels/pip-*.whl 2>/dev/null | tail -n 1); "
    'if [ -n "$wheel" ]; then pip="$wheel/pip"; else "$python" -m ensurepip -q; pip="-m pip"; fi; '
    'exec "$python" $pip install -q --no-index --disable-pip-version-check --no-warn-script-location "$@"'
)
# Names the topology file in nccl.conf (NCCL reads NCCL_TOPO_FILE from it): every other line of the
# file is kept, an earlier NCCL_TOPO_FILE line replaced. A fixed script; the two paths are its arguments.
NCCL_CONF_SET_TOPOLOGY = (
    'set -e; conf=$1; { if [ -f "$conf" ]; then '
    'grep -v "^[[:space:]]*NCCL_TOPO_FILE[[:space:]]*=" "$conf" || true; fi; '
    'printf "NCCL_TOPO_FILE=%s\\n" "$2"; } > "$conf.gpuhost-new"; mv "$conf.gpuhost-new" "$conf"'
)
GUEST_PATH = "/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CUDA_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_KEYRING = "cuda-keyring_1.1-1_all.deb"
# NVIDIA's CUDA repositories by distribution; Debian is there too, for guests built like the lab's.
CUDA_REPOS = {("ubuntu", "22.04"): "ubuntu2204", ("ubuntu", "24.04"): "ubuntu2404", ("debian", "12"): "debian12"}
# While the guest boots: nothing listens yet, cloud-init has not made the user yet, or sshd still
# offers the image's host key before cloud-init installs the pinned one. A wrong key is never
# accepted; it is only waited out until the step's timeout, whose error names it.
RETRYABLE = frozenset({"unreachable", "timeout", "auth", "host-key-changed", "host-key-unknown"})
SSH_RETRY_S = 3.0

Log = Callable[[list[str], CommandResult], None]
SMOKE_VERDICTS = {0: "PASS", 1: "FAIL", 2: "CANNOT RUN"}
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}$")


class RemoteCommandError(Exception):
    """A command in the guest exited non-zero; the message has its argv and the tail of its output."""


@dataclass(frozen=True)
class SmokeTestRun:
    exit_status: int
    verdict: str  # PASS, WARN, FAIL, CANNOT RUN
    output: str  # stdout and stderr of the run
    report_json: bytes | None  # the --json document, when the smoke-test wrote one


def run_checked(
    transport: Transport, argv: list[str], *, log: Log, timeout: float, stdin: bytes = b"", ok: tuple[int, ...] = (0,)
) -> CommandResult:
    result = transport.run(argv, stdin=stdin, timeout=timeout)
    log(argv, result)
    if result.exit_status not in ok:
        tail = "\n".join((result.stdout + result.stderr).decode(errors="replace").strip().splitlines()[-12:])
        raise RemoteCommandError(f"`{' '.join(argv)}` exited {result.exit_status}:\n{tail}")
    return result


def wait_for_ssh(connect: Callable[[], Transport], timeout: float) -> Transport:
    """A working transport to the guest once its sshd answers with the pinned key for our user."""
    deadline = time.monotonic() + timeout
    last: TransportError | None = None
    while True:
        try:
            transport = connect()
            try:
                result = transport.run(["true"], timeout=60.0)
            except BaseException:
                transport.close()
                raise
            if result.exit_status == 0:
                return transport
            transport.close()
            last = TransportError("auth", result.stderr.decode(errors="replace").strip() or "`true` failed")
        except TransportError as error:
            if error.kind not in RETRYABLE:
                raise
            last = error
        if time.monotonic() + SSH_RETRY_S > deadline:
            raise TimeoutError(f"no SSH session within {timeout:g} s; last attempt: {last}")
        time.sleep(SSH_RETRY_S)


def wait_for_cloud_init(transport: Transport, *, log: Log, timeout: float) -> None:
    # 2: finished with recoverable errors (cloud-init >= 23.4); the provisioning checks what it needs.
    run_checked(transport, ["cloud-init", "status", "--wait"], log=log, timeout=timeout, ok=(0, 2))


def cuda_repo(os_release: Mapping[str, str]) -> str:
    key = (os_release.get("ID", ""), os_release.get("VERSION_ID", ""))
    if key not in CUDA_REPOS:
        known = ", ".join(f"{distro} {version}" for distro, version in CUDA_REPOS)
        raise InputError(
            f"the guest runs {key[0] or 'an unknown OS'} {key[1]}; NVIDIA's CUDA repository is used for {known}. "
            "Use such a base image, or --skip-cuda with a base image that has the driver and toolkit."
        )
    return CUDA_REPOS[key]


# The apt sources, preferences and copied repository gpuhost writes in the guest.
LOCAL_SOURCE_LIST = "/etc/apt/sources.list.d/gpuhost-package-repo.list"
DRIVER_PREFERENCES = "/etc/apt/preferences.d/gpuhost-nvidia-driver"
COPIED_REPO_DIR = f"{REPORT_DIR}/package-repo"
# unattended-upgrades runs at first boot and holds dpkg's lock for minutes: apt waits for it
# (DPkg::Lock::Timeout, apt >= 1.9.11), printing "Waiting for cache lock: Could not get lock
# /var/lib/dpkg/lock-frontend. It is held by process 812 (unattended-upgr)..." as it waits, and
# past it fails with one of these (apt 2.6's words).
LOCK_FAILURES = ("Unable to acquire the dpkg frontend lock", "Could not get lock")
LOCK_HOLDER = re.compile(r"It is held by process [0-9]+ \([^)\n]*\)")
_REPO_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,200}$")


class InstalledVersionError(GpuhostError):
    """The guest has another driver branch or toolkit than its pin: reported, never replaced."""


class MissingPackageError(GpuhostError):
    """The package source has no version of a package the guest needs (named, with the source)."""


@dataclass(frozen=True)
class PackageRoot:
    """The tree apt and dpkg work on: '/' in a guest; another directory to install into a tree of
    its own (a chroot being prepared, or a test that runs the real apt and dpkg without touching
    the machine's packages)."""

    path: str = "/"

    @property
    def is_system(self) -> bool:
        return self.path == "/"

    def file(self, path: str) -> str:
        return path if self.is_system else f"{self.path.rstrip('/')}{path}"

    def apt_options(self) -> list[str]:
        if self.is_system:
            return []
        return ["-o", f"Dir={self.path}", "-o", f"DPkg::Options::=--root={self.path}"]

    def dpkg_query_options(self) -> list[str]:
        return [] if self.is_system else [f"--admindir={self.file('/var/lib/dpkg')}"]


@dataclass(frozen=True)
class CudaInstall:
    """What the cuda step did: installed (from where) or found a prebuilt image's."""

    source: str
    before: pins.InstalledStack
    after: pins.InstalledStack
    installed: tuple[str, ...]  # the apt-get install arguments; () when the image had everything

    def describe(self) -> str:
        if not self.installed:
            return f"prebuilt image: {self.after.describe()}, install skipped"
        return f"{self.after.describe()} from {self.source}"


def fabric_manager_request(offered: tuple[pins.PackageVersion, ...], driver_version: str) -> pins.PackageVersion | None:
    """The Fabric Manager package to install beside driver `driver_version`: of the versions the
    sources offer (apt-cache madison), one at exactly the driver's version, under the name the
    branch's naming rule gives first; None when there is none."""
    names = pins.fabric_manager_packages(pins.driver_branch_of(driver_version))
    matching = [package for package in offered if package.upstream == driver_version and package.name in names]
    matching.sort(key=lambda package: names.index(package.name))
    return matching[0] if matching else None


def keyring_download(repo: str, repo_base: str = CUDA_REPO_BASE) -> list[str]:
    """NVIDIA's documented network-repository setup starts with its keyring package (installed
    next, with apt for its lock wait), which adds the signed source."""
    keyring = f"{repo_base.rstrip('/')}/{repo}/x86_64/{CUDA_KEYRING}"
    return ["curl", "-fsSL", "--retry", "3", "-o", f"/tmp/{CUDA_KEYRING}", keyring]


def local_source_line(url: str) -> str:
    """The one apt source of an offline guest: a flat repository (Packages beside the .debs).
    trusted=yes: such a repository (dpkg-scanpackages' output) carries no signed Release file; it is
    the operator's own, on the guest's network or disk."""
    return f"deb [trusted=yes] {url.rstrip('/')}/ ./\n"


def apt_argv(
    root: PackageRoot, *, local: bool, lock_timeout: float, args: list[str], program: str = "apt-get"
) -> list[str]:
    """apt-get (or apt-cache) with the tree, the lock wait and, offline, only gpuhost's source: no
    other network."""
    options = [*root.apt_options(), "-o", f"DPkg::Lock::Timeout={int(lock_timeout)}"]
    if local:
        options += [
            "-o",
            f"Dir::Etc::SourceList={root.file(LOCAL_SOURCE_LIST)}",
            "-o",
            "Dir::Etc::SourceParts=-",
            "-o",
            "APT::Get::List-Cleanup=false",  # keep the lists of the sources left out
        ]
    return ["env", "DEBIAN_FRONTEND=noninteractive", program, *options, "-q", *args]


def detect_installed(transport: Transport, root: PackageRoot, *, log: Log) -> pins.InstalledStack:
    """The driver (loaded module, else dpkg) and toolkits (dpkg) the guest has now."""
    query = ["dpkg-query", *root.dpkg_query_options(), "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n"]
    # 1: a pattern matched nothing (still prints the others).
    packages = run_checked(transport, [*query, *pins.DETECT_PATTERNS], log=log, timeout=120, ok=(0, 1))
    module = run_checked(transport, ["cat", root.file("/sys/module/nvidia/version")], log=log, timeout=60, ok=(0, 1))
    loaded = module.stdout.decode(errors="replace") if module.exit_status == 0 else ""
    return pins.parse_installed(packages.stdout.decode(errors="replace"), loaded)


def headers_package(kernel_release: str) -> str:
    """The kernel headers the driver's DKMS build needs, for the running kernel."""
    package = f"linux-headers-{kernel_release.strip()}"
    if not PACKAGE_NAME.fullmatch(package):
        raise RemoteCommandError(f"`uname -r` in the guest printed {kernel_release!r}, not a kernel release")
    return package


def copy_package_repo(
    host: Transport, guest: Transport, host_path: str, *, log: Log, timeout: float, dest: str = COPIED_REPO_DIR
) -> str:
    """Copy a flat repository from a directory on the host into the guest, one file at a time
    through this machine (the guest may have no route to the host); returns the file:// URL."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    listing = run_checked(
        host, ["find", host_path, "-maxdepth", "1", "-type", "f", "-printf", "%f\\n"], log=log, timeout=left()
    )
    names = sorted(listing.stdout.decode(errors="replace").splitlines())
    if "Packages" not in names and "Packages.gz" not in names:
        raise InputError(
            f"package_repo {host_path} on the host has no Packages index; build it there with "
            "`dpkg-scanpackages --multiversion . > Packages` beside the .deb files."
        )
    run_checked(guest, ["mkdir", "-p", dest], log=log, timeout=left())
    for name in names:
        if not _REPO_FILE.fullmatch(name):
            raise InputError(f"package_repo {host_path}: file name {name!r} is not a package or index name; remove it.")
        data = run_checked(
            host, ["cat", f"{host_path.rstrip('/')}/{name}"], log=lambda argv, result: None, timeout=left()
        )
        log(["cat", f"{host_path.rstrip('/')}/{name}"], CommandResult(0, b"(%d bytes)" % len(data.stdout), b""))
        run_checked(guest, ["dd", f"of={dest}/{name}", "status=none"], stdin=data.stdout, log=log, timeout=left())
    return f"file://{dest}"


def install_cuda(
    transport: Transport,
    pin: pins.CudaPin,
    *,
    log: Log,
    timeout: float,
    lock_timeout: float,
    repo_base: str = CUDA_REPO_BASE,
    local_repo: str | None = None,
    root: PackageRoot = PackageRoot(),
    fabric_manager: bool = False,
) -> CudaInstall:
    """Install the pinned driver branch and toolkit: exact packages, from NVIDIA's repository (or
    `local_repo`, a flat repository and then the only source), never the newest. A guest that has
    them already (a prebuilt image) is left as it is; one with other versions is refused.

    `fabric_manager` (a guest given the NVSwitches): Fabric Manager at exactly the driver's
    version too, under the same rules: kept when the image has it at that version, refused
    (never replaced) at another."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    before = detect_installed(transport, root, log=log)
    driver, toolkit = before.driver(pin), before.toolkit(pin)
    if pins.Match.OTHER in (driver, toolkit):
        raise InstalledVersionError(
            f"the guest already has {before.describe()}; the VM pins {pin.describe()}. gpuhost does not replace an "
            "installed driver or toolkit: use a base image with the pinned versions (or none), or set cuda_version and "
            "driver_branch to what the image has."
        )
    fabric = before.fabric_manager_match() if fabric_manager else pins.Match.PINNED
    if fabric is pins.Match.OTHER and driver is pins.Match.PINNED:
        raise _fabric_manager_mismatch(before)
    source = local_repo or repo_base
    if driver is pins.Match.PINNED and toolkit is pins.Match.PINNED and fabric is pins.Match.PINNED:
        return CudaInstall(source, before, before, ())
    local = local_repo is not None
    if local:
        assert local_repo is not None
        write = ["dd", f"of={root.file(LOCAL_SOURCE_LIST)}", "status=none"]
        run_checked(transport, write, stdin=local_source_line(local_repo).encode(), log=log, timeout=left())
    else:
        release = parse_os_release(
            run_checked(transport, ["cat", "/etc/os-release"], log=log, timeout=60).stdout.decode()
        )
        repo = cuda_repo(release)
        source = f"{repo_base.rstrip('/')}/{repo}"
        run_checked(transport, keyring_download(repo, repo_base), log=log, timeout=left())
        keyring = apt_argv(root, local=False, lock_timeout=lock_timeout, args=["install", "-y", f"/tmp/{CUDA_KEYRING}"])
        _apt(transport, keyring, log=log, timeout=left(), lock_timeout=lock_timeout)
    write = ["dd", f"of={root.file(DRIVER_PREFERENCES)}", "status=none"]
    run_checked(transport, write, stdin=pin.apt_preferences().encode(), log=log, timeout=left())
    wanted = [pin.toolkit_request] if toolkit is pins.Match.ABSENT else []
    if driver is pins.Match.ABSENT:
        kernel = run_checked(transport, ["uname", "-r"], log=log, timeout=60).stdout.decode(errors="replace")
        wanted += [pin.driver_request, headers_package(kernel)]

    def apt(args: list[str]) -> None:
        argv = apt_argv(root, local=local, lock_timeout=lock_timeout, args=args)
        _apt(transport, argv, log=log, timeout=left(), lock_timeout=lock_timeout)

    apt(["update"])
    if wanted:
        apt(["install", "-y", *wanted])
    after = detect_installed(transport, root, log=log)
    if (after.driver(pin), after.toolkit(pin)) != (pins.Match.PINNED, pins.Match.PINNED):
        raise RemoteCommandError(f"after the install the guest has {after.describe()}, not {pin.describe()}")
    if fabric_manager and after.fabric_manager_match() is pins.Match.OTHER:
        raise _fabric_manager_mismatch(after)
    if fabric_manager and after.fabric_manager_match() is pins.Match.ABSENT:
        # Only now is the driver's exact version known: Fabric Manager must be that one.
        assert after.driver_version is not None
        madison = apt_argv(
            root,
            local=local,
            lock_timeout=lock_timeout,
            program="apt-cache",
            args=["madison", *pins.fabric_manager_packages(pin.driver_branch)],
        )
        offered = pins.parse_madison(run_checked(transport, madison, log=log, timeout=left()).stdout.decode())
        request = fabric_manager_request(offered, after.driver_version)
        if request is None:
            names = " or ".join(pins.fabric_manager_packages(pin.driver_branch))
            found = ", ".join(package.describe() for package in offered) or "no version of either"
            raise MissingPackageError(
                f"{source} has no Fabric Manager at the driver's version {after.driver_version} ({names}; it has "
                f"{found}). This VM is given the NVSwitches, and its GPUs need Fabric Manager of exactly the "
                "driver's version (without it CUDA fails with error 802, system not yet initialized): add that "
                "package to the repository (dpkg-scanpackages), or use a base image that has it."
            )
        apt(["install", "-y", f"{request.name}={request.version}"])
        wanted.append(f"{request.name}={request.version}")
        after = detect_installed(transport, root, log=log)
        if after.fabric_manager_match() is not pins.Match.PINNED:
            raise RemoteCommandError(
                f"after the install the guest has {after.describe()}, not Fabric Manager {after.driver_version}"
            )
    if root.is_system and driver is pins.Match.ABSENT:
        run_checked(transport, ["modprobe", "nvidia"], log=log, timeout=left())
    return CudaInstall(source, before, after, tuple(wanted))


def _fabric_manager_mismatch(stack: pins.InstalledStack) -> InstalledVersionError:
    return InstalledVersionError(
        f"the guest already has {stack.describe()}: Fabric Manager must be the driver's version exactly, or it "
        "refuses to start and CUDA fails with error 802. gpuhost does not replace an installed Fabric Manager: use "
        "a base image whose Fabric Manager matches its driver (or has none)."
    )


@dataclass(frozen=True)
class FabricManagerStart:
    seconds: float  # from `systemctl enable --now` until the unit was active

    def describe(self) -> str:
        return f"{pins.FABRIC_MANAGER_SERVICE} active after {self.seconds:.0f} s"


class ServiceState(str, enum.Enum):
    """`systemctl is-active` states that end the wait (the others: it is still starting)."""

    ACTIVE = "active"
    FAILED = "failed"
    INACTIVE = "inactive"


FABRIC_MANAGER_POLL_S = 2.0


def start_fabric_manager(transport: Transport, *, log: Log, timeout: float) -> FabricManagerStart:
    """Enable and start Fabric Manager and wait (up to `timeout`) until systemd says it is active:
    the GPUs of an NVSwitch guest are usable by CUDA only once it has trained the fabric."""
    started = time.monotonic()
    deadline = started + timeout
    unit = pins.FABRIC_MANAGER_SERVICE
    run_checked(transport, ["systemctl", "enable", "--now", unit], log=log, timeout=timeout)
    state = ""
    while True:
        # is-active exits non-zero for every state but active; its one line is the state.
        result = run_checked(transport, ["systemctl", "is-active", unit], log=log, timeout=60, ok=(0, 1, 2, 3, 4))
        state = result.stdout.decode(errors="replace").strip()
        if state == ServiceState.ACTIVE.value:
            return FabricManagerStart(time.monotonic() - started)
        if state in (ServiceState.FAILED.value, ServiceState.INACTIVE.value):
            journal = run_checked(
                transport, ["journalctl", "-u", unit, "-n", "20", "--no-pager"], log=log, timeout=60, ok=(0, 1)
            )
            tail = journal.stdout.decode(errors="replace").strip()
            raise RemoteCommandError(
                f"{unit} is {state}; without it CUDA fails on the NVSwitch-attached GPUs with error 802. Its "
                f"version must be the driver's exactly. Its journal:\n{tail}"
            )
        if time.monotonic() + FABRIC_MANAGER_POLL_S > deadline:
            raise TimeoutError(
                f"{unit} not active within {timeout:g} s (it is {state!r}); raise the VM's timeouts: "
                "{fabric_manager: SECONDS}, or read `journalctl -u nvidia-fabricmanager` in the guest"
            )
        time.sleep(FABRIC_MANAGER_POLL_S)


def _apt(transport: Transport, argv: list[str], *, log: Log, timeout: float, lock_timeout: float) -> None:
    try:
        run_checked(transport, argv, log=log, timeout=timeout)
    except RemoteCommandError as error:
        text = str(error)
        if any(failure in text for failure in LOCK_FAILURES):
            holders = LOCK_HOLDER.findall(text)
            held = f" ({holders[-1][0].lower()}{holders[-1][1:]})" if holders else ""
            raise RemoteCommandError(
                f"dpkg's lock stayed held for {lock_timeout:g} s{held}; unattended-upgrades installs updates at first "
                "boot. Raise the VM's timeouts: {dpkg_lock: SECONDS}, or disable unattended-upgrades in the base "
                f"image.\n{error}"
            ) from error
        raise


def install_gpuhost(transport: Transport, wheels: tuple[Wheel, ...], *, log: Log, timeout: float) -> None:
    """Copy the wheels in and install them into a venv with `pip install --no-index`."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    run_checked(transport, ["mkdir", "-p", WHEELS_DIR, REPORT_DIR], log=log, timeout=left())
    paths: list[str] = []
    for wheel in wheels:
        path = f"{WHEELS_DIR}/{wheel.filename}"  # the name matched the wheel-name pattern
        run_checked(
            transport, ["dd", f"of={path}", "status=none"], stdin=wheel.path.read_bytes(), log=log, timeout=left()
        )
        paths.append(path)
    # A venv without pip, and pip run straight from the wheel Debian and Ubuntu ship with
    # python3-venv: installing pip itself into the venv (ensurepip) took minutes under TCG, and
    # the guest needs pip only this once. Where that wheel is missing, ensurepip it is.
    run_checked(transport, ["python3", "-m", "venv", "--clear", "--without-pip", VENV], log=log, timeout=left())
    run_checked(transport, ["sh", "-c", PIP_FROM_WHEEL, "sh", *paths], log=log, timeout=left())


def install_nccl_topology(transport: Transport, topology_xml: str, *, log: Log, timeout: float) -> str:
    """Copy the VM's NCCL topology file in (NCCL_GUEST_TOPOLOGY) and name it in /etc/nccl.conf; its path."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    directory = NCCL_GUEST_TOPOLOGY.rsplit("/", 1)[0]
    run_checked(transport, ["mkdir", "-p", directory], log=log, timeout=left())
    run_checked(
        transport,
        ["dd", f"of={NCCL_GUEST_TOPOLOGY}", "status=none"],
        stdin=topology_xml.encode(),
        log=log,
        timeout=left(),
    )
    run_checked(
        transport, ["sh", "-c", NCCL_CONF_SET_TOPOLOGY, "sh", NCCL_CONF, NCCL_GUEST_TOPOLOGY], log=log, timeout=left()
    )
    return NCCL_GUEST_TOPOLOGY


def run_smoke_test(transport: Transport, *, log: Log, timeout: float, quick: bool, gpus: int) -> SmokeTestRun:
    """The smoke-test in the guest: `--all` where the domain passes several GPUs (every GPU and the
    node they make), else the one GPU's run; its --json report fetched back."""
    run_checked(transport, ["rm", "-f", REPORT_JSON], log=log, timeout=60)
    argv = ["env", f"PATH={GUEST_PATH}", f"{VENV}/bin/gpuhost", "smoke-test", "--json", REPORT_JSON]
    if gpus > 1:
        argv.append("--all")
    if quick:
        argv.append("--quick")
    result = transport.run(argv, timeout=timeout)
    log(argv, result)
    fetched = transport.run(["cat", REPORT_JSON], timeout=120)
    log(["cat", REPORT_JSON], CommandResult(fetched.exit_status, b"(%d bytes)" % len(fetched.stdout), fetched.stderr))
    report = fetched.stdout if fetched.exit_status == 0 else None
    verdict = SMOKE_VERDICTS.get(result.exit_status, f"ERROR (exit {result.exit_status})")
    if result.exit_status == 0 and report is not None:
        verdict = _status(report) or verdict
    output = (result.stdout + result.stderr).decode(errors="replace")
    return SmokeTestRun(result.exit_status, verdict, output, report)


def _status(report: bytes) -> str | None:
    import json

    try:
        document = json.loads(report)
        # --all's document has the whole run's status at its top; one GPU's has it in its verdict.
        status = document["status"] if "status" in document else document["verdict"]["status"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(status).upper()
