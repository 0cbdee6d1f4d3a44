"""`gpuhost guest up/status/logs/down` as library functions: each lifecycle step is timed, has a
timeout, and fails with a GuestStepError that names it. Nothing here prints; progress goes to a
callback the CLI gives.

up: connect (libvirt) -> facts (audit, for the render) -> wheels -> disk (qcow2 on the base
image) -> seed (cloud-init NoCloud ISO) -> define (rendered, schema-checked) -> start -> address
(the DHCP lease, else the guest agent, else the host's ARP table) -> ssh (pinned host key;
through the host as a jump unless the host is this machine) -> cloud-init -> nouveau (released
from the GPU; a reboot where it is in use) -> package-repo (a package_repo on the host, copied in)
-> cuda (the pinned driver branch and toolkit, unless skipped or already there; with the
NVSwitches, Fabric Manager of the driver's version too) -> fabric-manager (a guest given the
NVSwitches: its service started and active) -> install (wheels, no index) -> smoke-test ->
report (copied to the controller).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhost import hostlock
from gpuhost.audit import audit_target, open_transport
from gpuhost.errors import GpuhostError, InputError
from gpuhost.facts.model import NCCL_CONF, Firmware
from gpuhost.guest import libvirt_host, nouveau, provision, slots
from gpuhost.guest.errors import GuestStepError
from gpuhost.guest.keys import generate_ed25519
from gpuhost.guest.seed import GUEST_USER, SeedConfig, build_seed_iso
from gpuhost.guest.state import GuestDir
from gpuhost.guest.steps import Progress, Steps, StepTime
from gpuhost.guest.wheels import GUEST_PROJECTS, Wheel, prepare_wheels, select_wheels
from gpuhost.inventory import pins
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.render.domain import plan_domain
from gpuhost.render.nccl_topology import topology_for_plan, topology_xml
from gpuhost.render.validate import validate_domain_xml, validator_available
from gpuhost.render.xml import render_plan
from gpuhost.targets import LOCAL, Target
from gpuhost.transport import CommandResult, Transport, TransportError
from gpuhost.transport.ssh import SshOptions

SERIAL_TAIL_BYTES = 256 * 1024

# What a bigger guest adds to the boot steps (start, address, ssh): before Linux 6.12 the host
# spends about 30 s per GPU in PCI init (a 4-GPU H100 guest about 2 minutes) and QEMU faults in
# (or with huge pages, preallocates) the guest's memory; the smoke-test runs every GPU in turn.
BOOT_PER_GPU_S = 60.0

BOOT_PER_64_GIB_S = 30.0

SMOKE_TEST_PER_GPU_S = 300.0


@dataclass(frozen=True)
class Timeouts:
    """Seconds per step; generous, since a TCG guest on a busy machine is slow. `for_guest` scales
    the boot steps with the guest's GPUs and memory; a VM's `timeouts:` overrides any step."""

    connect: float = 120.0
    facts: float = 300.0
    wheels: float = 600.0
    disk: float = 120.0
    seed: float = 120.0
    define: float = 300.0  # the first define makes libvirtd probe QEMU: 90 s on a busy 2-core machine
    start: float = 120.0
    address: float = 300.0
    ssh: float = 600.0
    cloud_init: float = 900.0
    cuda: float = 3600.0
    install: float = 900.0
    smoke_test: float = 1800.0
    report: float = 120.0
    down: float = 120.0
    dpkg_lock: float = 600.0  # apt waits this long for unattended-upgrades' dpkg lock, per command
    package_repo: float = 1800.0  # copying a package_repo from the host into the guest
    nouveau: float = 900.0  # blacklisting nouveau rebuilds the initramfs: minutes under TCG
    fabric_manager: float = 300.0  # a guest given the NVSwitches: until its Fabric Manager is active

    def for_guest(self, gpus: int, memory_mib: int, overrides: tuple[tuple[str, float], ...], where: str) -> Timeouts:
        boot = gpus * BOOT_PER_GPU_S + -(-memory_mib // (64 * 1024)) * BOOT_PER_64_GIB_S
        scaled = dataclasses.replace(
            self,
            start=self.start + boot,
            address=self.address + boot,
            ssh=self.ssh + boot,
            smoke_test=self.smoke_test + max(0, gpus - 1) * SMOKE_TEST_PER_GPU_S,
        )
        return scaled.overridden(overrides, where)

    def overridden(self, overrides: tuple[tuple[str, float], ...], where: str) -> Timeouts:
        steps = {field.name for field in dataclasses.fields(self)}
        for step, _ in overrides:
            if step not in steps:
                raise InputError(f"{where}: timeouts: {step!r} is not a step; steps: {', '.join(sorted(steps))}.")
        return dataclasses.replace(self, **dict(overrides))


@dataclass(frozen=True)
class UpOptions:
    state: GuestDir
    libvirt_uri: str | None = None
    skip_cuda: bool = False
    wheel_dir: Path | None = None  # prebuilt wheels; default: build gpuhost's, fetch nvidia-ml-py
    wheel_cache: Path | None = None  # where the fetched/built wheels are kept
    cuda_repo_base: str = provision.CUDA_REPO_BASE
    quick: bool = False  # smoke-test --quick
    timeouts: Timeouts = Timeouts()
    command: str = ""  # written in the host's lock (gpuhost.hostlock): who holds the host
    break_lock: bool = False  # --break-lock


@dataclass(frozen=True)
class GuestUpResult:
    host: str
    vm: str
    uri: str
    address: str
    disk: str
    seed: str
    steps: tuple[StepTime, ...]
    smoke: provision.SmokeTestRun
    report_dir: Path
    # Each GPU the domain passes, by host slot, with what the guest's report said of it; None when
    # the report lists no GPU (the smoke-test could not start).
    gpus: tuple[slots.GuestGpu, ...] | None = ()


@dataclass(frozen=True)
class GuestStatus:
    host: str
    vm: str
    uri: str
    state: str
    addresses: tuple[str, ...]
    last_report: str | None
    last_verdict: str | None


@dataclass(frozen=True)
class GuestDownResult:
    host: str
    vm: str
    destroyed: bool
    undefined: bool
    removed_volumes: tuple[str, ...]


def volume_names(vm: str) -> tuple[str, str]:
    """(disk, seed) volume names in the host's images pool; `down` removes exactly these."""
    return f"{vm}.qcow2", f"{vm}-seed.iso"


def _known_hosts(target: Target) -> Path | None:
    if target.kind == LOCAL or target.ssh is None:
        return None
    return (target.ssh.known_hosts_file or Path("~/.ssh/known_hosts")).expanduser()


def libvirt_uri(target: Target, state: GuestDir, override: str | None) -> str:
    if override:
        return libvirt_host.validate_uri(override)
    if target.kind != LOCAL:
        assert target.ssh is not None
        known_hosts = _known_hosts(target)
        assert known_hosts is not None
        state.make()
        state.write_private(state.ssh_wrapper, libvirt_host.ssh_wrapper_script(target.ssh, known_hosts))
        state.ssh_wrapper.chmod(0o700)
        return libvirt_host.host_uri(target, wrapper=state.ssh_wrapper)
    return libvirt_host.host_uri(target, wrapper=None)


Log = provision.Log


class _ProvisionLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def __call__(self, argv: list[str], result: CommandResult) -> None:
        with self.lock, self.path.open("a") as log:
            log.write(f"\n$ {' '.join(argv)}   # exit {result.exit_status}\n")
            log.write(result.stdout.decode(errors="replace")[-20000:])
            log.write(result.stderr.decode(errors="replace")[-20000:])

    def note(self, text: str) -> None:
        with self.lock, self.path.open("a") as log:
            log.write(f"\n# {time.strftime('%H:%M:%S')} {text}\n")


def up(target: Target, spec: VmSpec, policy: HostPolicy, options: UpOptions, progress: Progress) -> GuestUpResult:
    host, vm = target.name, spec.name
    if spec.base_image is None:
        raise InputError(
            f"inventory host {host}: VM {vm} has no base_image; `gpuhost guest up` creates its disk from one."
        )
    if spec.network is None:
        raise InputError(f"inventory host {host}: VM {vm} has network: none; the guest is provisioned over SSH.")
    pin = spec.cuda_pin
    if not options.skip_cuda and pin is None:
        raise InputError(
            f"inventory host {host}: VM {vm} has no cuda_version; set one (e.g. 12.4), or pass --skip-cuda."
        )
    # Checked before anything is created: a misspelt step name is an input error, not a late surprise.
    timeouts = options.timeouts.overridden(spec.timeouts, f"inventory host {host}: VM {vm}")
    # One run at a time per host: apply's trial reboot or a rollback must not run under a guest being
    # provisioned (gpuhost.hostlock; refused at once, naming the holder, exit 2).
    transport = open_transport(target)
    try:
        command = options.command or f"gpuhost guest up --host {host} --vm {vm}"
        with hostlock.held(transport, host, command, break_lock=options.break_lock):
            return _up_held(target, spec, policy, options, timeouts, progress)
    finally:
        transport.close()


def _up_held(
    target: Target, spec: VmSpec, policy: HostPolicy, options: UpOptions, timeouts: Timeouts, progress: Progress
) -> GuestUpResult:
    """`up` once the host's lock is held: every step from libvirt's connection to the report."""
    host, vm = target.name, spec.name
    pin = spec.cuda_pin
    state = options.state
    state.make()
    steps = Steps(vm, host, progress)
    uri = libvirt_uri(target, state, options.libvirt_uri)
    disk_name, seed_name = volume_names(vm)
    conn = steps.run("connect", timeouts.connect, lambda: _connect_and_check(uri, vm, policy, target), lambda _: uri)
    facts = steps.run("facts", timeouts.facts, lambda: _facts(target))
    wheels = steps.run(
        "wheels",
        timeouts.wheels,
        lambda: _wheels(options),
        lambda chosen: ", ".join(wheel.filename for wheel in chosen),
    )
    taken = libvirt_host.hostdevs_taken(conn)
    cpus_taken = libvirt_host.cpus_taken(conn)
    host_vms = target.require_config().vms  # CPUs are allocated for every VM of the host
    plan = plan_domain(facts, spec, policy, host=host, taken=taken, host_vms=host_vms, cpus_taken=cpus_taken)
    timeouts = options.timeouts.for_guest(
        len(plan.gpu_ports), spec.memory_mib, spec.timeouts, f"inventory host {host}: VM {vm}"
    )
    pool = libvirt_host.find_pool(conn, policy.images_dir, create=True)
    assert spec.base_image is not None  # up() refused a VM without one
    base_image: str = spec.base_image

    def make_disk() -> str:
        capacity = spec.disk_size_gib * 1024**3 if spec.disk_size_gib else libvirt_host.base_capacity(conn, base_image)
        if capacity is None:
            raise InputError(
                f"the size of base image {base_image} is unknown to libvirt (it is in no storage pool); "
                f"set disk_size for VM {vm}."
            )
        return libvirt_host.create_disk(pool, disk_name, capacity, base_image)

    steps.created = True  # from here on, even a failed step may leave a volume behind
    disk = steps.run("disk", timeouts.disk, make_disk, lambda path: f"{path} backed by {base_image}")
    host_key = generate_ed25519(f"gpuhost-guest-{vm}")
    client_key = generate_ed25519(f"gpuhost@controller-for-{vm}")
    state.write_private(state.client_key, client_key.private_openssh)
    authorized = tuple(k for k in (client_key.public_openssh, _user_key(spec.ssh_key, host, vm)) if k)
    seed_config = SeedConfig(
        hostname=vm,
        instance_id=f"{vm}-{uuid.uuid4().hex[:12]}",
        authorized_keys=authorized,
        host_key=host_key,
        packages=tuple(str(package) for package in spec.packages),
    )
    seed = steps.run(
        "seed", timeouts.seed, lambda: libvirt_host.upload_volume(conn, pool, seed_name, build_seed_iso(seed_config))
    )
    xml = render_plan(dataclasses.replace(plan, disk_path=disk, seed_path=seed))
    passed = slots.passed_gpus(plan)

    def define() -> Any:
        if validator_available():
            validate_domain_xml(xml)
        (state.root / "domain.xml").write_text(xml)
        return conn.defineXML(xml)

    domain = steps.run("define", timeouts.define, define)
    state.update_info(host=host, vm=vm, uri=uri, disk=disk, seed=seed, address=None)
    steps.run("start", timeouts.start, lambda: domain.create())
    answered = steps.run(
        "address",
        timeouts.address,
        lambda: libvirt_host.wait_for_address(domain, timeouts.address, still_running=lambda: bool(domain.isActive())),
        lambda found: f"{found.addresses[0]} from {found.source.value}",
    )
    address = answered.addresses[0]
    state.update_info(address=address)
    state.write_private(state.known_hosts, f"{address} {host_key.public_blob}\n")
    log = _ProvisionLog(state.provision_log)
    log.note(f"guest {vm} on {host} at {address}")
    host_transport: list[Transport] = []

    def connect_guest() -> Transport:
        return _guest_transport(target, state, address, options.timeouts.connect, host_transport)

    guest = steps.run("ssh", timeouts.ssh, lambda: provision.wait_for_ssh(connect_guest, timeouts.ssh))
    try:
        steps.run(
            "cloud-init",
            timeouts.cloud_init,
            lambda: provision.wait_for_cloud_init(guest, log=log, timeout=timeouts.cloud_init),
        )
        # The guest answered with its pinned key (ssh) and cloud-init read the seed: the host
        # private key on the host's disk is of no further use, only a risk.
        steps.run(
            "seed-removed",
            timeouts.seed,
            lambda: libvirt_host.remove_seed(domain, pool, seed_name),
            lambda deleted: f"{seed_name} ejected and deleted" if deleted else f"{seed_name} ejected",
        )
        if options.skip_cuda:
            steps.skipped("cuda", "--skip-cuda")
        else:
            assert pin is not None
            cuda_pin: pins.CudaPin = pin
            found = steps.run(
                "nouveau",
                timeouts.nouveau,
                lambda: nouveau.release_nouveau(guest, log=log, timeout=timeouts.nouveau),
                lambda outcome: outcome.value,
            )
            if found is nouveau.Nouveau.NEEDS_REBOOT:
                before_reboot = guest
                guest = steps.run(
                    "reboot",
                    timeouts.ssh,
                    lambda: nouveau.reboot_guest(before_reboot, connect_guest, log=log, timeout=timeouts.ssh),
                )
            local_repo = spec.package_repo
            if local_repo is not None and local_repo.startswith("/"):
                host_path: str = local_repo
                local_repo = steps.run(
                    "package-repo",
                    timeouts.package_repo,
                    lambda: _copy_package_repo(target, guest, host_path, log, timeouts.package_repo, host_transport),
                    lambda url: f"{host_path} on {host} copied to {url}",
                )
            steps.run(
                "cuda",
                timeouts.cuda,
                lambda: provision.install_cuda(
                    guest,
                    cuda_pin,
                    log=log,
                    timeout=timeouts.cuda,
                    lock_timeout=timeouts.dpkg_lock,
                    repo_base=options.cuda_repo_base,
                    local_repo=local_repo,
                    fabric_manager=bool(plan.nvswitch_ports),
                ),
                lambda done: done.describe(),
            )
        if plan.nvswitch_ports:  # NVIDIA's full-passthrough model: the guest runs Fabric Manager
            steps.run(
                "fabric-manager",
                timeouts.fabric_manager,
                lambda: provision.start_fabric_manager(guest, log=log, timeout=timeouts.fabric_manager),
                lambda started: started.describe(),
            )
        steps.run(
            "install",
            timeouts.install,
            lambda: provision.install_gpuhost(guest, wheels, log=log, timeout=timeouts.install),
        )
        if plan.gpu_ports:
            topology = topology_xml(topology_for_plan(facts, plan))
            steps.run(
                "nccl-topology",
                timeouts.install,
                lambda: provision.install_nccl_topology(guest, topology, log=log, timeout=timeouts.install),
                lambda path: f"{path}, named in {NCCL_CONF}",
            )
        smoke = steps.run(
            "smoke-test",
            timeouts.smoke_test,
            lambda: provision.run_smoke_test(
                guest, log=log, timeout=timeouts.smoke_test, quick=options.quick, gpus=len(passed)
            ),
            lambda run: f"exit {run.exit_status}, {run.verdict}",
        )
    finally:
        guest.close()
        for transport in host_transport:
            transport.close()
        conn.close()
    gpus = slots.match_report(passed, smoke.report_json) if passed else ()
    report_dir = steps.run(
        "report", timeouts.report, lambda: _write_report(state, host, vm, address, smoke, gpus, steps.times)
    )
    state.update_info(last_report=str(report_dir), last_verdict=smoke.verdict)
    missing = [gpu for gpu in gpus or () if not gpu.seen]
    if missing:
        raise GuestStepError(
            "gpus",
            vm,
            host,
            f"the guest shows {len(passed) - len(missing)} of the {len(passed)} GPUs the domain passes; not seen: "
            + ", ".join(gpu.describe() for gpu in missing)
            + f" (the guest's report: {report_dir}; check `dmesg` in the guest for the device and the host's "
            "`gpuhost audit` for its binding)",
        )
    return GuestUpResult(host, vm, uri, address, disk, seed, tuple(steps.times), smoke, report_dir, gpus)


def _copy_package_repo(
    target: Target, guest: Transport, path: str, log: Log, timeout: float, host_transport: list[Transport]
) -> str:
    """The host's package_repo directory copied into the guest (the host connection of the SSH
    jump when there is one)."""
    if not host_transport:
        host_transport.append(open_transport(target))
    return provision.copy_package_repo(host_transport[0], guest, path, log=log, timeout=timeout)


def _connect_and_check(uri: str, vm: str, policy: HostPolicy, target: Target) -> Any:
    conn = libvirt_host.connect(uri, known_hosts=_known_hosts(target))
    if libvirt_host.lookup(conn, vm) is not None:
        conn.close()
        raise InputError(f"a domain named {vm} is already defined there; `gpuhost guest down` removes it first.")
    pool = libvirt_host.find_pool(conn, policy.images_dir, create=False)
    if pool is not None:
        present = [name for name in volume_names(vm) if libvirt_host.volume(pool, name) is not None]
        if present:
            conn.close()
            raise InputError(
                f"volume(s) {', '.join(present)} already exist in {policy.images_dir}; `gpuhost guest down` removes "
                "them (or remove them by hand if they are not a gpuhost guest's)."
            )
    return conn


def _facts(target: Target) -> Any:
    audit = audit_target(target)
    if audit.error is not None or audit.facts is None:
        raise GpuhostError(f"could not audit {target.name} for its facts: {audit.error}")
    return audit.facts


def _wheels(options: UpOptions) -> tuple[Wheel, ...]:
    if options.wheel_dir is not None:
        return select_wheels(options.wheel_dir.glob("*.whl"), GUEST_PROJECTS)
    cache = options.wheel_cache or options.state.root.parent.parent / "wheels"
    return prepare_wheels(cache)


def _user_key(value: str | None, host: str, vm: str) -> str | None:
    """The VM's ssh_key: the key text itself, or read from the .pub file it names."""
    if value is None:
        return None
    if " " in value:
        return value
    path = Path(value).expanduser()
    try:
        text = path.read_text().strip()
    except OSError as error:
        raise InputError(
            f"inventory host {host}: VM {vm}: ssh_key {value}: cannot read it ({error.strerror})."
        ) from error
    from gpuhost.inventory.spec import validate_ssh_key

    key = validate_ssh_key(text.splitlines()[0] if text else "", f"inventory host {host}: VM {vm}: ssh_key {value}")
    if " " not in key:
        raise InputError(f"inventory host {host}: VM {vm}: ssh_key {value} does not hold an OpenSSH public key.")
    return key


def _guest_options(state: GuestDir, address: str, timeout: float, sock: Any = None) -> SshOptions:
    return SshOptions(
        host=address,
        port=22,
        user=GUEST_USER,
        key_file=state.client_key,
        known_hosts_file=state.known_hosts,
        accept_new_host_keys=False,
        connect_timeout=min(timeout, 30.0),
        become=True,
        sock=sock,
    )


def _guest_transport(
    target: Target, state: GuestDir, address: str, timeout: float, host_transport: list[Transport]
) -> Transport:
    """SSH to the guest: directly when the host is this machine, else through the host (jump)."""
    from gpuhost.transport.ssh import SshTransport

    if target.kind == LOCAL:
        return SshTransport(_guest_options(state, address, timeout))
    if not host_transport:
        host_transport.append(open_transport(target))
    jump = host_transport[0]
    assert isinstance(jump, SshTransport)
    try:
        channel = jump.open_tunnel(address, 22)
    except TransportError:
        jump.close()
        host_transport.clear()
        raise
    return SshTransport(_guest_options(state, address, timeout, sock=channel))


def _write_report(
    state: GuestDir,
    host: str,
    vm: str,
    address: str,
    smoke: provision.SmokeTestRun,
    gpus: tuple[slots.GuestGpu, ...] | None,
    steps: list[StepTime],
) -> Path:
    directory = state.report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "smoke-test.out").write_text(smoke.output)
    if smoke.report_json is not None:
        (directory / "smoke-test.json").write_bytes(smoke.report_json)
    summary = {
        "schema": "gpuhost.guest-report/1",
        "host": host,
        "vm": vm,
        "address": address,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "smoke_test": {
            "exit_status": smoke.exit_status,
            "verdict": smoke.verdict,
            "json": "smoke-test.json" if smoke.report_json is not None else None,
            "output": "smoke-test.out",
        },
        # Each GPU the domain passes: its host slot, the guest address it was passed to, and what
        # the guest's smoke-test said of it (seen, NVML index and UUID, verdict); null: the report
        # lists no GPU.
        "gpus": None if gpus is None else [dataclasses.asdict(gpu) for gpu in gpus],
        "steps": [{"step": s.step, "seconds": round(s.seconds, 1), "detail": s.detail} for s in steps],
    }
    (directory / "guest-report.json").write_text(json.dumps(summary, indent=2) + "\n")
    return directory


def status(target: Target, vm: str, state: GuestDir, override: str | None) -> GuestStatus:
    uri = libvirt_uri(target, state, override)
    conn = libvirt_host.connect(uri, known_hosts=_known_hosts(target))
    try:
        current = libvirt_host.domain_state(conn, vm)
    finally:
        conn.close()
    info = state.read_info()
    report = info.get("last_report")
    verdict = info.get("last_verdict")
    return GuestStatus(
        target.name,
        vm,
        uri,
        current.state,
        current.addresses,
        str(report) if report else None,
        str(verdict) if verdict else None,
    )


def serial_log(target: Target, spec: VmSpec, policy: HostPolicy) -> str:
    """The tail of the guest's serial console log on the host (the path the domain XML logs to)."""
    path = f"{policy.serial_log_dir.rstrip('/')}/{spec.name}-serial.log"
    transport = open_transport(target)
    try:
        result = transport.run(["tail", "-c", str(SERIAL_TAIL_BYTES), path], timeout=60)
    finally:
        transport.close()
    if result.exit_status != 0:
        raise GuestStepError(
            "logs", spec.name, target.name, f"cannot read {path}: {result.stderr.decode(errors='replace').strip()}"
        )
    return result.stdout.decode(errors="replace")


def down(target: Target, spec: VmSpec, policy: HostPolicy, state: GuestDir, override: str | None) -> GuestDownResult:
    """Destroy and undefine the domain, delete its disk and seed volumes; nothing else."""
    libvirt = libvirt_host.import_libvirt()
    uri = libvirt_uri(target, state, override)
    conn = libvirt_host.connect(uri, known_hosts=_known_hosts(target))
    destroyed = undefined = False
    removed: list[str] = []
    try:
        domain = libvirt_host.lookup(conn, spec.name)
        if domain is not None:
            if domain.isActive():
                domain.destroy()
                destroyed = True
            flags = libvirt.VIR_DOMAIN_UNDEFINE_NVRAM if spec.firmware is Firmware.UEFI else 0
            domain.undefineFlags(flags)
            undefined = True
        pool = libvirt_host.find_pool(conn, policy.images_dir, create=True)
        removed.extend(name for name in volume_names(spec.name) if libvirt_host.delete_volume(pool, name))
    except libvirt.libvirtError as error:
        raise GuestStepError("down", spec.name, target.name, f"libvirt: {error.get_error_message()}") from error
    finally:
        conn.close()
    state.update_info(address=None)
    return GuestDownResult(target.name, spec.name, destroyed, undefined, tuple(removed))
