"""`gpuhost guest up/status/logs/down` end to end against a real libvirtd, driven the way an
operator drives a remote GPU host: gpuhost runs in a network namespace of its own (the
controller), whose one link is a veth to this machine (the host). It reaches the host's sshd,
which fronts this machine's libvirtd, and nothing else: the guest, on libvirt's NAT network, can
be reached only through the host. So every step of the remote path runs for real: libvirt over
`qemu+ssh://` with the host key pinned, the audit over SSH, define, start, the guest's address
from the host's DHCP leases, the SSH jump to the guest, the package repository copied from the
host into the guest, the report back, and down.

One guest for the whole module: a `type='qemu'` (TCG) domain, BIOS, no GPU (`gpus: none`), its
disk copy-on-write on the lab's `guest` image (Debian 12 + cloud-init + python3-venv). `up`
provisions it over the jump with the pinned guest host key, installs the pinned driver branch and
toolkit offline from a `package_repo` directory on the host (stand-in packages built here with
dpkg-deb, standing in for NVIDIA's: apt in the guest uses that repository alone), installs
gpuhost from wheels without an index and runs `gpuhost smoke-test`, which must find no GPU and
say so with exit 2. Then status and logs, and `down`, which must remove the domain, the disk and
the seed and nothing else in the pool.

libvirtd: there is no systemd on the CI machine, so `libvirt_daemon` below starts `virtlogd -d`
and `libvirtd -d` when they are not running and starts the `default` network (dnsmasq); Debian's
libvirt-daemon-system and dnsmasq-base provide them. Needs root (libvirtd, sshd, `ip netns`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd import Sshd, start_sshd

from gpuhost.guest import libvirt_host
from gpuhost.guest.provision import COPIED_REPO_DIR
from gpuhost.guest.wheels import prepare_wheels
from gpuhost.hostlock import LOCK_PATH, holder_alive, parse_lock
from gpuhost.lab.builder import ensure_image
from gpuhost.lab.paths import LabPaths
from tests.guest.test_offline_install import build_repository

pytestmark = [pytest.mark.lab, pytest.mark.timeout(2400), pytest.mark.xdist_group("lab-rest")]

URI = "qemu:///system"
LIBVIRT_SOCKET = Path("/run/libvirt/libvirt-sock")


def _timing(message: str) -> None:
    print(f"[guest timing] {message}", flush=True)


def _virsh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["virsh", "-c", URI, *args], capture_output=True, text=True, timeout=120, check=check)


def _running(pidfile: str) -> bool:
    try:
        pid = int(Path(pidfile).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="module")
def libvirt_daemon() -> None:
    """virtlogd, libvirtd and the default network, started here when not already running."""
    if os.geteuid() != 0:
        pytest.skip("the guest lifecycle test drives the system libvirtd and needs root")
    for program in ("libvirtd", "virtlogd", "virsh", "dnsmasq", "qemu-system-x86_64"):
        if shutil.which(program) is None and not Path(f"/usr/sbin/{program}").exists():
            pytest.skip(f"{program} is missing (apt-get install libvirt-daemon-system dnsmasq-base)")
    pytest.importorskip("libvirt")
    pytest.importorskip("pycdlib")
    for daemon, pidfile in (("virtlogd", "/run/virtlogd.pid"), ("libvirtd", "/run/libvirtd.pid")):
        if not _running(pidfile):
            subprocess.run([daemon, "-d"], check=True, timeout=60)
    deadline = time.monotonic() + 60
    while _virsh("version", check=False).returncode != 0:
        assert time.monotonic() < deadline, "libvirtd did not answer within 60 s"
        time.sleep(0.5)
    if _virsh("net-info", "default", check=False).returncode != 0:
        _virsh("net-define", "/usr/share/libvirt/networks/default.xml")
    if "Active:         yes" not in _virsh("net-info", "default").stdout:
        _virsh("net-start", "default")


@dataclass(frozen=True)
class Pool:
    directory: Path
    base: Path
    bystander: Path  # a volume that is not the guest's: `down` must leave it
    kernel: str  # the guest image's kernel release


@pytest.fixture(scope="module")
def pool(libvirt_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A pool directory QEMU (user libvirt-qemu) can read, holding a copy of the guest image."""
    image_dir = Path(os.environ.get("GPUHOST_LAB_IMAGE_DIR", str(Path("~/.cache/gpuhost/lab/images").expanduser())))
    paths = LabPaths(root=tmp_path_factory.mktemp("lab-image"), images=image_dir)
    started = time.monotonic()
    image = ensure_image(paths, "guest")
    _timing(f"guest image {'reused' if image.reused else 'built'} in {time.monotonic() - started:.1f} s")
    # pytest's tmp dirs are private to root; QEMU runs as libvirt-qemu and must read the base image.
    directory = Path(tempfile.mkdtemp(prefix="gpuhost-guest-test-", dir="/var/tmp"))
    directory.chmod(0o755)
    started = time.monotonic()
    base = directory / "guest-base.qcow2"
    subprocess.run(["cp", "--reflink=auto", str(image.disk), str(base)], check=True, timeout=600)
    base.chmod(0o644)
    bystander = directory / "someone-elses.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(bystander), "1G"], check=True, timeout=60)
    _timing(f"base image copied into the pool in {time.monotonic() - started:.1f} s")
    try:
        yield Pool(directory, base, bystander, image.kernel)
    finally:
        # `guest up` made a transient pool for the directory (none existed): stopping it removes it.
        with contextlib.suppress(AssertionError, subprocess.SubprocessError):
            _virsh("pool-destroy", _pool_name(directory))
        shutil.rmtree(directory, ignore_errors=True)


# The controller's namespace and the host's end of its veth. 198.18.0.0/15 is the range RFC 2544
# sets aside for benchmarks: no real network uses it, and the namespace has no other route.
HOST_ADDRESS, CONTROLLER_ADDRESS = "198.18.213.1", "198.18.213.2"
NAMESPACE_PREFIX = "gpuhost-controller-"


@dataclass(frozen=True)
class Controller:
    """Where gpuhost runs: a network namespace that reaches only HOST_ADDRESS."""

    namespace: str

    def argv(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *command]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _remove_stale_namespaces() -> None:
    """A run killed before its teardown leaves its namespace, and with it a host-side veth holding
    HOST_ADDRESS; remove those whose test process is gone."""
    listing = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True, timeout=30)
    for name in re.findall(rf"^({NAMESPACE_PREFIX}(\d+))\b", listing.stdout, flags=re.MULTILINE):
        if not Path(f"/proc/{name[1]}").exists():
            _ip("netns", "delete", name[0])


@pytest.fixture(scope="module")
def controller(libvirt_daemon: None) -> Iterator[Controller]:
    _remove_stale_namespaces()
    pid = os.getpid()
    namespace, host_link, controller_link = f"{NAMESPACE_PREFIX}{pid}", f"ghc{pid}h", f"ghc{pid}c"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", host_link, "type", "veth", "peer", "name", controller_link, "netns", namespace)
        _ip("addr", "add", f"{HOST_ADDRESS}/30", "dev", host_link)
        _ip("link", "set", host_link, "up")
        _ip("-n", namespace, "addr", "add", f"{CONTROLLER_ADDRESS}/30", "dev", controller_link)
        _ip("-n", namespace, "link", "set", controller_link, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        yield Controller(namespace)
    finally:
        # Deleting the namespace deletes the veth pair with it.
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, timeout=30, check=False)


@pytest.fixture(scope="module")
def host_sshd(controller: Controller, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """The GPU host's sshd, on its end of the veth; forwarding allowed for the jump to the guest."""
    server = start_sshd(
        tmp_path_factory.mktemp("host-sshd"), name="gpu-host", listen=HOST_ADDRESS, local_forwarding=True
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guest's wheels, made outside the namespace (building and fetching need the index);
    `up --wheel-dir` takes them, as it would on an air-gapped controller."""
    directory = tmp_path_factory.mktemp("wheels")
    started = time.monotonic()
    prepare_wheels(directory)
    _timing(f"wheels prepared in {time.monotonic() - started:.1f} s")
    return directory


# The pinned stack, offline: what `up` installs from the host's package_repo. The stand-in kernel
# module package makes `modprobe nvidia` (the step's last command) a no-op through modprobe.d's
# `install` directive: there is no module to load in a guest without an NVIDIA GPU.
CUDA_VERSION, DRIVER_BRANCH, DRIVER_VERSION = "12.4", 550, "550.54.15-1"
STAND_IN_MODPROBE = "/etc/modprobe.d/nvidia-stand-in.conf"


@pytest.fixture(scope="module")
def package_repo(pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A flat repository on the host standing in for NVIDIA's: the driver branch, its kernel
    module, the toolkit, and headers named after the guest image's kernel."""
    return build_repository(
        tmp_path_factory.mktemp("package-repo"),
        (
            ("nvidia-open", DRIVER_VERSION, f"nvidia-kernel-open-dkms (>= {DRIVER_VERSION.split('-')[0]})"),
            ("nvidia-kernel-open-dkms", DRIVER_VERSION, ""),
            (f"cuda-toolkit-{CUDA_VERSION.replace('.', '-')}", "12.4.1-1", ""),
            (f"linux-headers-{pool.kernel}", "1.0-1", ""),
        ),
        {"nvidia-kernel-open-dkms": {STAND_IN_MODPROBE: "install nvidia /bin/true\n"}},
    )


@dataclass(frozen=True)
class Guest:
    inventory: Path
    state: Path
    vm: str
    pool: Pool
    controller: Controller
    host: Sshd
    package_repo: Path
    up: subprocess.CompletedProcess[str]

    def gpuhost(self, action: str, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpuhost", "guest", action, "-i", str(self.inventory), "--host", "gpu-host"]
        argv += ["--vm", self.vm, "--state-dir", str(self.state), *extra]
        return subprocess.run(self.controller.argv(*argv), capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def guest(
    pool: Pool,
    controller: Controller,
    host_sshd: Sshd,
    wheels: Path,
    package_repo: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Guest]:
    """`gpuhost guest up` once, from the controller's namespace; `down` at the end whatever happened."""
    root = tmp_path_factory.mktemp("guest")
    vm = f"gpuhost-test-{os.getpid()}"
    inventory = root / "inventory.yml"
    known_hosts = host_sshd.write_known_hosts(root / "known_hosts")
    inventory.write_text(
        "all:\n  hosts:\n    gpu-host:\n"
        f"      ansible_host: {HOST_ADDRESS}\n      ansible_port: {host_sshd.port}\n      ansible_user: root\n"
        f"      ansible_ssh_private_key_file: {host_sshd.client_key}\n      gpuhost_known_hosts_file: {known_hosts}\n"
        f"      gpuhost_images_dir: {pool.directory}\n"
        "      gpuhost_vms:\n"
        f"        - name: {vm}\n          vcpus: 1\n          memory: 1536M\n          gpus: none\n"
        f"          base_image: {pool.base}\n          domain_type: qemu\n          firmware: bios\n"
        "          hugepages: off\n"
        f"          cuda_version: '{CUDA_VERSION}'\n          driver_branch: {DRIVER_BRANCH}\n"
        f"          package_repo: {package_repo}\n"
    )
    nothing_yet = subprocess.CompletedProcess[str]([], 0)
    incomplete = Guest(inventory, root / "state", vm, pool, controller, host_sshd, package_repo, nothing_yet)
    _no_lock_left_by_a_killed_run()
    started = time.monotonic()
    up = incomplete.gpuhost("up", "--wheel-dir", str(wheels), timeout=2000)
    _timing(f"gpuhost guest up (whole command): {time.monotonic() - started:.1f} s, exit {up.returncode}")
    for step, seconds in re.findall(r"(?m)^gpuhost guest \S+: ([a-z-]+): ([0-9.]+) s", up.stdout):
        _timing(f"up step {step}: {seconds} s")
    try:
        yield dataclasses.replace(incomplete, up=up)
    finally:
        # A failed test (or up) must not leave a domain behind; `down` of a removed guest is a no-op.
        with contextlib.suppress(subprocess.TimeoutExpired):
            incomplete.gpuhost("down")


def _no_lock_left_by_a_killed_run() -> None:
    """The host is this machine: `guest up` holds its gpuhost lock (gpuhost.hostlock). One left by an
    earlier test run that was killed (its process gone) is removed, as `_remove_stale_namespaces`
    removes its namespaces; one a live process holds fails the test instead of being taken."""
    lock = Path(LOCK_PATH)
    if not lock.exists():
        return
    holder = parse_lock(lock.read_text(errors="replace"))
    if holder is not None and holder_alive(holder):
        pytest.fail(f"a live run holds this machine's gpuhost lock: {holder.describe()}")
    lock.unlink()


def test_up_provisions_and_the_smoke_test_says_there_is_no_gpu(guest: Guest) -> None:
    output = guest.up.stdout + guest.up.stderr
    assert guest.up.returncode == 2, output  # the smoke-test's own "cannot run"
    steps = ("connect", "facts", "wheels", "disk", "seed", "define", "start", "address", "ssh", "cloud-init")
    for step in (*steps, "nouveau", "package-repo", "cuda", "install", "smoke-test"):
        assert f": {step}: " in guest.up.stdout, f"step {step} missing:\n{output}"
    # No NVIDIA GPU, so the kernel never bound nouveau: nothing to blacklist, no reboot.
    assert re.search(r"(?m): nouveau: [0-9.]+ s \(not loaded\)$", guest.up.stdout), guest.up.stdout
    assert ": reboot: " not in guest.up.stdout
    # libvirt was reached over qemu+ssh:// at the host's address, not on this machine's socket.
    assert re.search(rf"(?m): connect: [0-9.]+ s \(qemu\+ssh://root@{HOST_ADDRESS}:{guest.host.port}/system\?", output)
    assert "no NVIDIA driver in this machine" in guest.up.stdout  # the smoke-test's message, from the guest
    assert "smoke-test CANNOT RUN (exit 2)" in guest.up.stdout


def test_the_report_comes_back_to_the_controller(guest: Guest) -> None:
    match = re.search(r"(?m)^report: (.+)$", guest.up.stdout)
    assert match, guest.up.stdout + guest.up.stderr
    report = Path(match.group(1))
    summary = json.loads((report / "guest-report.json").read_text())
    assert summary["schema"] == "gpuhost.guest-report/1" and summary["vm"] == guest.vm
    assert summary["smoke_test"]["exit_status"] == 2 and summary["smoke_test"]["verdict"] == "CANNOT RUN"
    assert "no NVIDIA driver" in (report / "smoke-test.out").read_text()
    assert [step["step"] for step in summary["steps"]][-2:] == ["install", "smoke-test"]
    assert summary["gpus"] == []  # a VM of no GPU: no host slot to map back
    # `up` held the host's lock from its first step and released it at its end.
    assert not Path(LOCK_PATH).exists()


def test_the_address_came_from_the_lease_and_the_guest_agent_reports_the_same(guest: Guest) -> None:
    """libvirt's NAT network knows the lease; on a bridged network only the guest agent would. The
    agent's own answer (through the same gpuhost code, here on this machine's libvirtd) holds the
    loopback and IPv6 addresses too, which gpuhost leaves out: what is left is the lease's address."""
    address = re.search(r"(?m): address: [0-9.]+ s \(([0-9.]+) from the DHCP lease\)$", guest.up.stdout)
    assert address, guest.up.stdout
    conn = libvirt_host.connect(URI, known_hosts=None)
    try:
        domain = libvirt_host.lookup(conn, guest.vm)
        assert domain is not None
        deadline = time.monotonic() + 120  # the agent starts with the guest, long since
        while not (agent := libvirt_host.addresses_from(domain, libvirt_host.AddressSource.AGENT)):
            assert time.monotonic() < deadline, "no answer from the guest agent"
            time.sleep(2)
    finally:
        conn.close()
    assert agent == (address.group(1),)


def test_the_controller_reaches_the_guest_only_through_the_host(guest: Guest) -> None:
    """The guest answered `up` over SSH although the controller has no route to it: the SSH jump
    through the host carried every guest command."""
    address = re.search(rf"(?m)^{guest.vm} on gpu-host at ([0-9.]+): smoke-test", guest.up.stdout)
    assert address, guest.up.stdout
    probe = (
        "import socket, sys\n"
        "try: socket.create_connection((sys.argv[1], 22), timeout=10)\n"
        "except OSError as error: print(error)"
    )
    direct = subprocess.run(
        guest.controller.argv(sys.executable, "-c", probe, address.group(1)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "Network is unreachable" in direct.stdout, direct.stdout + direct.stderr


def test_the_pinned_stack_came_from_the_hosts_repository_alone(guest: Guest) -> None:
    """Offline: the host's package_repo was copied into the guest over the jump, and apt in the guest
    installed the pinned branch, its module and the toolkit from it, with no other source."""
    copied = re.search(r"(?m): package-repo: [0-9.]+ s \((.*)\)$", guest.up.stdout)
    assert copied, guest.up.stdout
    assert copied.group(1) == f"{guest.package_repo} on gpu-host copied to file://{COPIED_REPO_DIR}", copied.group(1)
    cuda = re.search(r"(?m): cuda: [0-9.]+ s \((.*)\)$", guest.up.stdout)
    assert cuda, guest.up.stdout
    toolkit = f"cuda-toolkit-{CUDA_VERSION.replace('.', '-')}"
    driver = DRIVER_VERSION.split("-")[0]  # the describe() form: the upstream version
    assert cuda.group(1) == f"driver {driver}, toolkit {toolkit} 12.4.1-1 from file://{COPIED_REPO_DIR}", cuda.group(1)
    log = "".join(path.read_text() for path in guest.state.glob("**/provision.log"))
    commands = [line for line in log.splitlines() if line.startswith("$ ") and " apt-get " in line]
    installs = [line for line in commands if " install " in line]
    assert installs and all("Dir::Etc::SourceParts=-" in line for line in installs), installs


def test_status_shows_the_running_domain_its_address_and_last_report(guest: Guest) -> None:
    status = guest.gpuhost("status")
    assert status.returncode == 0, status.stderr
    assert f"{guest.vm} on gpu-host (qemu+ssh://root@{HOST_ADDRESS}:{guest.host.port}/system" in status.stdout
    assert ": running" in status.stdout
    assert re.search(r"address: 192\.168\.122\.[0-9]+", status.stdout), status.stdout
    assert "(CANNOT RUN)" in status.stdout


def test_logs_show_the_serial_console_and_the_provisioning(guest: Guest) -> None:
    logs = guest.gpuhost("logs")
    assert logs.returncode == 0, logs.stderr
    serial, _, provisioning = logs.stdout.partition("== provisioning log")
    assert "Linux version" in serial and "cloud-init" in serial  # the guest's own boot, from the host's log
    assert "pip install" in provisioning and "smoke-test --json" in provisioning


def test_the_seed_with_the_guest_host_key_is_gone_once_the_guest_answered(guest: Guest) -> None:
    """The cloud-init seed carries the guest's SSH host private key: `up` ejects and deletes it once
    the guest answered with that key and cloud-init finished (issue 13, class 14)."""
    assert re.search(r"(?m): seed-removed: [0-9.]+ s", guest.up.stdout), guest.up.stdout
    volumes = set(_virsh("vol-list", "--pool", _pool_name(guest.pool.directory)).stdout.split())
    assert f"{guest.vm}.qcow2" in volumes and f"{guest.vm}-seed.iso" not in volumes, volumes
    assert not (guest.pool.directory / f"{guest.vm}-seed.iso").exists()
    # Ejected in the definition too: the domain no longer names the seed.
    assert f"{guest.vm}-seed.iso" not in _virsh("dumpxml", "--inactive", guest.vm).stdout


def test_down_removes_the_domain_and_disk_and_nothing_else(guest: Guest) -> None:
    volumes_before = set(_virsh("vol-list", "--pool", _pool_name(guest.pool.directory)).stdout.split())
    assert f"{guest.vm}.qcow2" in volumes_before
    started = time.monotonic()
    down = guest.gpuhost("down")
    _timing(f"gpuhost guest down: {time.monotonic() - started:.1f} s")
    assert down.returncode == 0, down.stderr
    assert f"removed {guest.vm}.qcow2" in down.stdout, down.stdout
    assert _virsh("dominfo", guest.vm, check=False).returncode != 0  # no such domain
    assert sorted(path.name for path in guest.pool.directory.iterdir()) == sorted(
        [guest.pool.base.name, guest.pool.bystander.name]
    )
    again = guest.gpuhost("down")
    assert again.returncode == 0 and "nothing to remove" in again.stdout


def _pool_name(directory: Path) -> str:
    for name in _virsh("pool-list", "--all", "--name").stdout.split():
        if f"<path>{directory}</path>" in _virsh("pool-dumpxml", name).stdout:
            return name
    raise AssertionError(f"no libvirt pool for {directory}")


def _ssh_inventory(path: Path, server: Sshd, known_hosts: Path) -> Path:
    path.write_text(
        "all:\n  hosts:\n    viassh:\n"
        f"      ansible_host: 127.0.0.1\n      ansible_port: {server.port}\n      ansible_user: root\n"
        f"      ansible_ssh_private_key_file: {server.client_key}\n      gpuhost_known_hosts_file: {known_hosts}\n"
        "      gpuhost_vms:\n        - {name: nobody-here, vcpus: 1, memory: 512M, gpus: none}\n"
    )
    return path


@pytest.mark.ssh
def test_qemu_ssh_uri_verifies_the_host_key(libvirt_daemon: None, sshd_server: Sshd, tmp_path: Path) -> None:
    """libvirt over qemu+ssh:// through OpenSSH with gpuhost's wrapper: the real key is accepted,
    a different one refused (this sshd fronts this machine's own libvirtd)."""

    def status(known_hosts: Path) -> subprocess.CompletedProcess[str]:
        inventory = _ssh_inventory(tmp_path / f"{known_hosts.name}.yml", sshd_server, known_hosts)
        argv = [sys.executable, "-m", "gpuhost", "guest", "status", "-i", str(inventory), "--host", "viassh"]
        argv += ["--vm", "nobody-here", "--state-dir", str(tmp_path / "state")]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    good = status(sshd_server.write_known_hosts(tmp_path / "known_hosts"))
    assert good.returncode == 0, good.stderr
    assert f"nobody-here on viassh (qemu+ssh://root@127.0.0.1:{sshd_server.port}/system?" in good.stdout
    assert ": not defined" in good.stdout
    sessions = sshd_server.sessions()
    wrong = status(sshd_server.write_wrong_known_hosts(tmp_path / "known_hosts.wrong"))
    assert wrong.returncode == 2
    assert "cannot connect to libvirt" in wrong.stderr and "known_hosts.wrong" in wrong.stderr, wrong.stderr
    assert sshd_server.sessions() == sessions  # refused before any command ran on the host
