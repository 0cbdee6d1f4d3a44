"""Inside the guest, over SSH (gpuhost.transport): wait for it, install CUDA, install gpuhost from
wheels without an index, run the smoke-test and bring its report back.

Every remote command is an argv list (joined with shlex by the transport): no value reaches a
shell unquoted. Commands run through sudo as the cloud-init user gpuhost made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuhost.errors import InputError
from gpuhost.guest.wheels import Wheel
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


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release -> {'ID': 'ubuntu', 'VERSION_ID': '22.04', ...} (quotes removed)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key] = value.strip().strip("\"'")
    return values


def cuda_repo(os_release: Mapping[str, str]) -> str:
    key = (os_release.get("ID", ""), os_release.get("VERSION_ID", ""))
    if key not in CUDA_REPOS:
        known = ", ".join(f"{distro} {version}" for distro, version in CUDA_REPOS)
        raise InputError(
            f"the guest runs {key[0] or 'an unknown OS'} {key[1]}; NVIDIA's CUDA repository is used for {known}. "
            "Use such a base image, or --skip-cuda with a base image that has the driver and toolkit."
        )
    return CUDA_REPOS[key]


def cuda_commands(repo: str, cuda_version: str, repo_base: str = CUDA_REPO_BASE) -> list[list[str]]:
    """NVIDIA's documented network-repository install: keyring, then the toolkit of that
    major.minor and the open kernel modules (the driver NVIDIA recommends from Turing on)."""
    keyring = f"{repo_base.rstrip('/')}/{repo}/x86_64/{CUDA_KEYRING}"
    return [
        ["curl", "-fsSL", "--retry", "3", "-o", f"/tmp/{CUDA_KEYRING}", keyring],
        ["dpkg", "-i", f"/tmp/{CUDA_KEYRING}"],
        ["apt-get", "update", "-q"],
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "-q",
            *cuda_packages(cuda_version),
        ],
        ["modprobe", "nvidia"],
    ]


def cuda_packages(cuda_version: str) -> tuple[str, ...]:
    major, minor = cuda_version.split(".")[:2]
    return (f"cuda-toolkit-{major}-{minor}", "nvidia-open")


def install_cuda(transport: Transport, cuda_version: str, *, log: Log, timeout: float, repo_base: str) -> str:
    release = parse_os_release(run_checked(transport, ["cat", "/etc/os-release"], log=log, timeout=60).stdout.decode())
    repo = cuda_repo(release)
    deadline = time.monotonic() + timeout
    for argv in cuda_commands(repo, cuda_version, repo_base):
        run_checked(transport, argv, log=log, timeout=max(1.0, deadline - time.monotonic()))
    return repo


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


def run_smoke_test(transport: Transport, *, log: Log, timeout: float, quick: bool) -> SmokeTestRun:
    run_checked(transport, ["rm", "-f", REPORT_JSON], log=log, timeout=60)
    argv = ["env", f"PATH={GUEST_PATH}", f"{VENV}/bin/gpuhost", "smoke-test", "--json", REPORT_JSON]
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
        status = json.loads(report)["verdict"]["status"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(status).upper()
