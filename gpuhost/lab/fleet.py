"""Start, watch and stop lab hosts: QEMU processes tracked by PID in the lab's state file."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuhost.errors import InputError
from gpuhost.lab import image as lab_image
from gpuhost.lab import resume
from gpuhost.lab.boot import BIOS_GRUB, BootMode
from gpuhost.lab.builder import ensure_image
from gpuhost.lab.errors import LabError
from gpuhost.lab.inventory import InventoryHost, known_hosts_text, render_inventory
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.ssh import ssh_argv
from gpuhost.lab.state import LabState, VmRecord, is_our_process, load_state, process_start_ticks, save_state
from gpuhost.lab.tools import RUN_TOOLS, require
from gpuhost.lab.topology import TOPOLOGIES, LabVmSpec, qemu_argv

Progress = Callable[[str], None]

# Beyond guest memory, a TCG VM needs its translation cache and QEMU's own memory.
MEMORY_OVERHEAD_MIB = 512
# One vCPU per host: under TCG a second vCPU does not speed up the lab's mostly serial work (apt,
# update-initramfs, Ansible modules), and when hosts share the machine's cores its IPIs and spinning
# vCPUs cost the others. Measured on the 2-core machine, two hosts each running mkinitramfs at once:
# 128 and 136 s with 2 vCPUs, 88 and 88 s with 1 (80-83 s alone either way); boot 57 -> 45 s.
DEFAULT_CPUS = 1
MAX_HOSTS = 64
PORT_ATTEMPTS = 5


def _no_progress(_: str) -> None:
    return None


@dataclass(frozen=True)
class HostRunState:
    record: VmRecord
    running: bool
    serial_tail: tuple[str, ...]  # the end of the serial log, for a host that is not running


@dataclass(frozen=True)
class UpResult:
    hosts: tuple[VmRecord, ...]
    inventory: Path
    inventory_text: str
    known_hosts: Path
    image: lab_image.Image
    boot_seconds: float


@dataclass(frozen=True)
class DownResult:
    stopped: tuple[str, ...]
    not_running: tuple[str, ...]
    killed: tuple[str, ...]  # did not end on SIGTERM within the grace period


# ---------------------------------------------------------------- pure helpers


def mem_available_mib(meminfo: str) -> int:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise LabError("cannot read MemAvailable from /proc/meminfo")


def check_memory(hosts: int, memory_mib: int, available_mib: int) -> None:
    needed = hosts * (memory_mib + MEMORY_OVERHEAD_MIB)
    if needed > available_mib:
        raise LabError(
            f"not enough memory: {hosts} host(s) of {memory_mib} MiB need about {needed} MiB "
            f"(with {MEMORY_OVERHEAD_MIB} MiB of QEMU overhead each) but {available_mib} MiB are "
            "available; use fewer --hosts or a smaller --memory"
        )


def host_names(count: int) -> list[str]:
    if not 1 <= count <= MAX_HOSTS:
        raise InputError(f"--hosts must be between 1 and {MAX_HOSTS}, not {count}")
    return [f"lab-{index}" for index in range(1, count + 1)]


# ---------------------------------------------------------------- side effects


@contextlib.contextmanager
def _locked(paths: LabPaths) -> Iterator[None]:
    """One `lab up`/`lab down` at a time per lab directory."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with paths.lock_file.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            raise LabError(f"another gpuhost lab command is working on {paths.root}") from error
        yield


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", 0))
        except OSError as error:
            raise LabError(f"no free TCP port on 127.0.0.1 for a lab host's SSH: {error}") from error
        return int(probe.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> tuple[str, ...]:
    try:
        text = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return ()
    return tuple(line.rstrip("\r") for line in text.splitlines()[-lines:])


def status(paths: LabPaths) -> tuple[LabState, list[HostRunState]]:
    state = load_state(paths.state_file)
    report = []
    for record in state.hosts:
        running = is_our_process(record)
        report.append(HostRunState(record, running, () if running else _tail(Path(record.serial_log))))
    return state, report


def with_recorded_images(paths: LabPaths) -> LabPaths:
    """`paths` with the image directory (and so the SSH keys) that `lab up` used in this lab dir."""
    recorded = load_state(paths.state_file).extra.get("image_dir")
    return LabPaths(root=paths.root, images=Path(recorded)) if recorded else paths


def find_host(paths: LabPaths, name: str) -> VmRecord:
    state = load_state(paths.state_file)
    for record in state.hosts:
        if record.name == name:
            return record
    known = ", ".join(r.name for r in state.hosts) or "none; run `gpuhost lab up`"
    raise InputError(f"no lab host named {name!r} in {paths.root} (hosts: {known})")


def host_ssh_argv(paths: LabPaths, record: VmRecord, command: Sequence[str] = (), tty: bool = False) -> list[str]:
    ssh = require(["ssh"], "reaching a lab host")["ssh"]
    return ssh_argv(
        port=record.ssh_port, key=paths.client_key, known_hosts=paths.known_hosts, command=command, tty=tty, ssh=ssh
    )


def run_on(
    paths: LabPaths,
    record: VmRecord,
    command: Sequence[str],
    *,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a command on a lab host over SSH; the result is returned whatever its exit status."""
    try:
        return subprocess.run(
            host_ssh_argv(paths, record, command),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise LabError(f"{record.name}: {' '.join(command)} did not finish within {timeout:.0f} s") from error


def _ssh_banner(port: int, timeout: float = 3.0) -> bool:
    # QEMU accepts on the forwarded port even before the guest listens; only sshd's banner
    # shows that the guest is up.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(8).startswith(b"SSH-")
    except OSError:
        return False


PANIC_MARKERS = ("Kernel panic - not syncing", "end Kernel panic")


def _panicked(record: VmRecord) -> str | None:
    """The panic line of the serial log, if the guest kernel panicked (QEMU keeps running then)."""
    for line in _tail(Path(record.serial_log), 200):
        if any(marker in line for marker in PANIC_MARKERS):
            return line.strip()
    return None


def _answers(paths: LabPaths, record: VmRecord) -> bool:
    # A host still booting on busy cores can take longer than the probe's timeout to run
    # `true` even after sshd's banner: that is "not yet", not a failure (the caller's overall
    # timeout decides that).
    try:
        return run_on(paths, record, ["true"], timeout=30).returncode == 0
    except LabError:
        return False


def wait_for_ssh(paths: LabPaths, records: Sequence[VmRecord], timeout: float = 300) -> float:
    """Wait until every host answers SSH with the lab key; returns the seconds waited."""
    started = time.monotonic()
    pending = {record.name: record for record in records}
    while pending:
        for name, record in list(pending.items()):
            if not is_our_process(record):
                tail = "\n".join(_tail(Path(record.serial_log)))
                raise LabError(
                    f"{name}: QEMU (PID {record.pid}) ended while booting; "
                    f"serial log {record.serial_log} ends with:\n{tail}"
                )
            panic = _panicked(record)
            if panic is not None:
                raise LabError(
                    f"{name}: the guest kernel panicked while booting: {panic} "
                    f"(serial log {record.serial_log}; `gpuhost lab down` stops the hosts)"
                )
            if _ssh_banner(record.ssh_port) and _answers(paths, record):
                del pending[name]
                _after_first_answer(paths, record)
        if not pending:
            break
        if time.monotonic() - started > timeout:
            names = ", ".join(sorted(pending))
            raise LabError(
                f"{names}: no SSH within {timeout:.0f} s; see the serial logs in {paths.logs} "
                "(`gpuhost lab down` stops the hosts)"
            )
        time.sleep(2)
    return time.monotonic() - started


def _after_first_answer(paths: LabPaths, record: VmRecord) -> None:
    """A resumed host gets the controller's clock (its own stopped when its state was saved); a
    booted one is saved for the next `lab up` of its shape, unless that is saved already."""
    if record.resumed:
        run_on(paths, record, ["date", "-s", f"@{time.time():.0f}"], timeout=60)
        return
    if not record.resume_key or not record.qmp_socket:
        return
    if resume.find_saved(paths.images, record.resume_key) is not None:
        return
    efi_vars = efi_vars_path(paths, record.name)
    try:
        resume.save_booted(
            paths.images,
            record.resume_key,
            Path(record.qmp_socket),
            Path(record.overlay),
            efi_vars if efi_vars.exists() else None,
        )
    except Exception as error:  # a failed save costs the next `lab up` of this shape a boot, nothing more
        (paths.logs / f"{record.name}-save.log").write_text(f"saving the booted host failed: {error!r}\n")


def _start_vm(spec: LabVmSpec, qemu: str, stderr_log: Path, saved: resume.SavedBoot | None = None) -> VmRecord:
    argv = qemu_argv(spec, qemu)
    spec.pidfile.unlink(missing_ok=True)
    launch = argv + (resume.incoming_argv(saved) if saved is not None else [])
    with stderr_log.open("w") as err:
        # -daemonize: the command returns once the VM runs, detached into its own session, so
        # it outlives this command; its PID comes from the pidfile.
        result = subprocess.run(
            launch, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, check=False, timeout=120
        )
    if result.returncode != 0:
        raise _QemuStartError(stderr_log.read_text(errors="replace").strip())
    pid = int(spec.pidfile.read_text().strip())
    ticks = process_start_ticks(pid)
    if ticks is None:
        raise _QemuStartError(
            f"QEMU wrote PID {pid} but ended at once: {stderr_log.read_text(errors='replace').strip()}"
        )
    return VmRecord(
        name=spec.name,
        topology=spec.topology,
        pid=pid,
        start_ticks=ticks,
        ssh_port=spec.ssh_port,
        overlay=str(spec.disk),
        serial_log=str(spec.serial_log),
        pidfile=str(spec.pidfile),
        memory_mib=spec.memory_mib,
        cpus=spec.cpus,
        image="",
        argv=tuple(argv),
        qmp_socket=str(spec.qmp_socket or ""),
        resumed=saved is not None,
    )


class _QemuStartError(Exception):
    pass


def up(
    paths: LabPaths,
    *,
    hosts: int = 2,
    topology: str = "gpu-pair",
    memory_mib: int = 4096,
    cpus: int = DEFAULT_CPUS,
    variant: str = "base",
    boot: BootMode = BIOS_GRUB,
    wait: bool = True,
    timeout: float = 300,
    progress: Progress = _no_progress,
) -> UpResult:
    if topology not in TOPOLOGIES:
        raise InputError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    names = host_names(hosts)
    tools = require(RUN_TOOLS, "running lab hosts")
    with _locked(paths):
        state = load_state(paths.state_file)
        running = [r.name for r in state.hosts if is_our_process(r)]
        if running:
            raise LabError(
                f"the lab in {paths.root} already runs {', '.join(running)}; "
                "stop it with `gpuhost lab down` first (or use another --lab-dir)"
            )
        _forget(paths, state.hosts)
        _check_firmware_files(boot)
        image = lab_image.find_image(paths, variant, boot.layout)
        name = lab_image.image_name(variant, boot.layout)
        if image is None:
            if os.geteuid() != 0:
                raise LabError(
                    f"no lab image ({name}) for the current recipe in {paths.images}; "
                    "build it first with: sudo gpuhost lab image"
                    + (f" --variant {variant}" if variant != "base" else "")
                    + (f" --firmware {boot.firmware_option} --boot {boot.loader.value}" if boot != BIOS_GRUB else "")
                )
            progress(f"building the {name} image (once; cached in {paths.images})")
            image = ensure_image(paths, variant, boot.layout, progress=progress)
        check_memory(hosts, memory_mib, mem_available_mib(Path("/proc/meminfo").read_text()))
        for directory in (paths.overlays, paths.logs):
            directory.mkdir(parents=True, exist_ok=True)
        records: list[VmRecord] = []
        started = time.monotonic()
        try:
            for name in names:
                overlay = paths.overlays / f"{name}.qcow2"
                overlay.unlink(missing_ok=True)
                subprocess.run(
                    [
                        tools["qemu-img"],
                        "create",
                        "-q",
                        "-f",
                        "qcow2",
                        "-F",
                        "qcow2",
                        "-b",
                        str(image.disk),
                        str(overlay),
                    ],
                    check=True,
                    capture_output=True,
                )
                records.append(
                    _start_with_free_port(
                        paths,
                        name,
                        topology,
                        memory_mib,
                        cpus,
                        overlay,
                        tools["qemu-system-x86_64"],
                        image,
                        boot,
                    )
                )
                progress(f"{name}: QEMU PID {records[-1].pid}, SSH on 127.0.0.1:{records[-1].ssh_port}")
        finally:
            # Whatever happened, remember what runs so that `lab down` can stop it.
            save_state(
                paths.state_file,
                LabState(hosts=tuple(records), inventory=str(paths.inventory), extra={"image_dir": str(paths.images)}),
            )
        inventory_hosts = [InventoryHost(r.name, r.ssh_port, r.topology, TOPOLOGIES[r.topology].gpus) for r in records]
        paths.known_hosts.write_text(known_hosts_text(inventory_hosts, image.host_public_key))
        text = render_inventory(inventory_hosts, paths.client_key, paths.known_hosts)
        paths.inventory.write_text(text)
    boot_seconds = 0.0
    if wait:
        progress(f"waiting for SSH on {len(records)} host(s) (about a minute under TCG)")
        boot_seconds = wait_for_ssh(paths, records, timeout)
        boot_seconds = time.monotonic() - started
    return UpResult(
        hosts=tuple(records),
        inventory=paths.inventory,
        inventory_text=text,
        known_hosts=paths.known_hosts,
        image=image,
        boot_seconds=boot_seconds,
    )


def _start_with_free_port(
    paths: LabPaths,
    name: str,
    topology: str,
    memory_mib: int,
    cpus: int,
    overlay: Path,
    qemu: str,
    image: lab_image.Image,
    boot: BootMode,
) -> VmRecord:
    efi_vars = None
    if boot.ovmf is not None:
        # A fresh copy of the template per host and per `lab up`: the firmware writes boot
        # entries and, under Secure Boot, its own state there.
        efi_vars = efi_vars_path(paths, name)
        shutil.copyfile(boot.ovmf.vars_template, efi_vars)
    pidfile = paths.root / f"{name}.pid"
    shape = LabVmSpec(
        name=name,
        topology=topology,
        memory_mib=memory_mib,
        cpus=cpus,
        ssh_port=0,
        disk=overlay,
        serial_log=paths.logs / f"{name}-serial.log",
        pidfile=pidfile,
        boot=boot,
        efi_vars=efi_vars,
        qmp_socket=resume.qmp_socket_for(pidfile),
    )
    key = ""
    if shape.qmp_socket is not None:
        key = resume.shape_key(shape, resume.image_identity(image.disk), resume.qemu_version(qemu))
    saved = resume.find_saved(paths.images, key) if key else None
    if saved is not None:
        resume.restore_files(saved, overlay, efi_vars)
    # The port is free when chosen but could be taken before QEMU binds it: retry then.
    error = ""
    for _ in range(PORT_ATTEMPTS):
        spec = dataclasses.replace(shape, ssh_port=free_port())
        try:
            record = _start_vm(spec, qemu, paths.logs / f"{name}-qemu.log", saved)
        except _QemuStartError as failure:
            error = str(failure)
            if "forward" not in error.lower():
                break
            continue
        return dataclasses.replace(record, image=str(image.disk), resume_key=key)
    raise LabError(f"{name}: QEMU did not start: {error}")


def efi_vars_path(paths: LabPaths, name: str) -> Path:
    return paths.overlays / f"{name}-efivars.fd"


def _check_firmware_files(boot: BootMode) -> None:
    if boot.ovmf is None:
        return
    for path in (boot.ovmf.code, boot.ovmf.vars_template):
        if not path.exists():
            raise LabError(
                f"--firmware {boot.firmware_option} needs {path}, which is missing: install Debian's "
                "ovmf package (apt-get install ovmf)"
            )


def _forget(paths: LabPaths, records: Sequence[VmRecord]) -> None:
    """Remove the files of hosts that no longer run."""
    for record in records:
        Path(record.overlay).unlink(missing_ok=True)
        Path(record.pidfile).unlink(missing_ok=True)
        efi_vars_path(paths, record.name).unlink(missing_ok=True)
        if record.qmp_socket:
            Path(record.qmp_socket).unlink(missing_ok=True)


def down(paths: LabPaths, *, grace: float = 15.0, progress: Progress = _no_progress) -> DownResult:
    """Stop exactly the QEMU processes `lab up` started (by PID, checked against their start time)."""
    with _locked(paths):
        state = load_state(paths.state_file)
        ours = [r for r in state.hosts if is_our_process(r)]
        for record in ours:
            progress(f"{record.name}: stopping QEMU PID {record.pid}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(is_our_process(r) for r in ours) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = []
        for record in ours:
            if is_our_process(record):
                killed.append(record.name)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGKILL)
        while any(is_our_process(r) for r in ours) and time.monotonic() < deadline + 10:
            time.sleep(0.2)
        _forget(paths, state.hosts)
        for stale in (paths.inventory, paths.known_hosts):
            stale.unlink(missing_ok=True)
        save_state(paths.state_file, LabState())
    names = {r.name for r in ours}
    return DownResult(
        stopped=tuple(r.name for r in ours),
        not_running=tuple(r.name for r in state.hosts if r.name not in names),
        killed=tuple(killed),
    )


def boot_id(paths: LabPaths, record: VmRecord) -> str:
    result = run_on(paths, record, ["cat", "/proc/sys/kernel/random/boot_id"], timeout=60)
    if result.returncode != 0:
        raise LabError(f"{record.name}: cannot read boot_id: {result.stderr.strip()}")
    return result.stdout.strip()


def reboot(paths: LabPaths, name: str, *, timeout: float = 300) -> float:
    """Reboot a lab host through its own `systemctl reboot`; returns seconds until SSH is back."""
    record = find_host(paths, name)
    before = boot_id(paths, record)
    started = time.monotonic()
    # The SSH session may be cut by the reboot: its exit status says nothing.
    with contextlib.suppress(LabError):
        run_on(paths, record, ["systemctl", "reboot"], timeout=30)
    while time.monotonic() - started < timeout:
        time.sleep(3)
        if not is_our_process(record):
            raise LabError(f"{name}: QEMU ended during the reboot; see {record.serial_log}")
        panic = _panicked(record)
        if panic is not None:
            raise LabError(f"{name}: the guest kernel panicked during the reboot: {panic}")
        if not _ssh_banner(record.ssh_port):
            continue
        with contextlib.suppress(LabError):
            if boot_id(paths, record) != before:
                return time.monotonic() - started
    raise LabError(f"{name}: did not come back within {timeout:.0f} s of a reboot; see {record.serial_log}")
