"""Booted lab hosts saved once and resumed: a first boot costs minutes under TCG, a resume seconds.

The first time a host of one shape (image, topology, memory, CPUs, firmware: everything in its QEMU
command line but its ports and paths) answers SSH, its running state is migrated to a file in the
image cache (QEMU's own migration, through QMP), with a copy of its disk overlay and EFI variables
taken while the migration holds the VM stopped; the host then goes on. Later `lab up`s of that
shape start QEMU with `-incoming` from that file instead of booting: the same kernel, the same
just-booted system, in seconds. Only the first boot of a shape is skipped: every reboot is real,
and so is a host restarted from its recorded command line (the record keeps the argv without
`-incoming`).

QEMU's QMP library (qemu.qmp, from the QEMU project; its legacy synchronous client) speaks QMP, so
gpuhost keeps no protocol code of its own.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from gpuhost.lab.errors import LabError
from gpuhost.lab.topology import LabVmSpec, qemu_argv

# Bump when what is saved, or how, changes: old entries are then never found.
RESUME_FORMAT = 1
BOOTED_DIR = "booted"
STATE_FILE = "state.migration"
OVERLAY_FILE = "overlay.qcow2"
EFI_VARS_FILE = "efivars.fd"
# A UNIX socket path longer than this cannot be bound (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH = 100
SAVE_TIMEOUT = 300.0
# Migration to a local file need not be throttled (QEMU's default bandwidth cap is for networks).
UNTHROTTLED_BYTES_PER_SECOND = 8 << 30


@dataclass(frozen=True)
class SavedBoot:
    key: str
    directory: Path

    @property
    def state(self) -> Path:
        return self.directory / STATE_FILE

    @property
    def overlay(self) -> Path:
        return self.directory / OVERLAY_FILE

    @property
    def efi_vars(self) -> Path:
        return self.directory / EFI_VARS_FILE


@functools.cache  # once per QEMU binary and process: `lab up --hosts N` starts N hosts
def qemu_version(qemu: str) -> str:
    result = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=60, check=False)
    return result.stdout.splitlines()[0] if result.stdout else f"unknown (exit {result.returncode})"


def image_identity(disk: Path) -> str:
    """The image a saved boot's disk overlay sits on: its name (the recipe's hash) and this build of
    it (a rebuilt image of the same recipe is another disk under the same name)."""
    status = disk.stat()
    return f"{disk.parent.name}/{disk.name}:{status.st_size}:{status.st_mtime_ns}"


def shape_key(spec: LabVmSpec, image: str, version: str) -> str:
    """What a saved boot depends on: the image, QEMU's version, and the command line of a host of
    this shape with its per-host paths and port replaced by fixed ones."""
    canonical = replace(
        spec,
        ssh_port=22,
        disk=Path("/disk.qcow2"),
        serial_log=Path("/serial.log"),
        pidfile=Path("/qemu.pid"),
        efi_vars=None if spec.efi_vars is None else Path("/efivars.fd"),
        qmp_socket=Path("/qmp.sock"),
    )
    firmware = "" if spec.boot.ovmf is None else _file_digest(spec.boot.ovmf.code)
    text = "\0".join([str(RESUME_FORMAT), image, version, firmware, *qemu_argv(canonical)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_saved(images: Path, key: str) -> SavedBoot | None:
    saved = SavedBoot(key, images / BOOTED_DIR / key)
    return saved if saved.state.is_file() and saved.overlay.is_file() else None


def qmp_socket_for(pidfile: Path) -> Path | None:
    """The host's QMP socket beside its pidfile, or None where the path is too long to bind."""
    socket_path = pidfile.with_suffix(".qmp")
    return socket_path if len(os.fsencode(socket_path)) <= MAX_SOCKET_PATH else None


def incoming_argv(saved: SavedBoot) -> list[str]:
    """What starts QEMU from the saved state instead of booting (appended to the host's argv)."""
    return ["-incoming", f"exec:cat {shlex.quote(str(saved.state))}"]


def restore_files(saved: SavedBoot, overlay: Path, efi_vars: Path | None) -> None:
    """The disk (and EFI variables) exactly as they were when the state was saved."""
    _copy(saved.overlay, overlay)
    if efi_vars is not None:
        if not saved.efi_vars.is_file():
            raise LabError(f"saved boot {saved.directory} has no EFI variables; remove the directory")
        _copy(saved.efi_vars, efi_vars)


def _copy(source: Path, target: Path) -> None:
    subprocess.run(["cp", "--reflink=auto", "--sparse=always", str(source), str(target)], check=True, timeout=600)


def save_booted(
    images: Path, key: str, qmp_socket: Path, overlay: Path, efi_vars: Path | None, timeout: float = SAVE_TIMEOUT
) -> SavedBoot:
    """Migrate the running host's state to the cache, copy its disk while QEMU holds it stopped,
    and let it go on. Another process saving the same shape at once is harmless: the first
    complete directory wins, the other is discarded."""
    from qemu.qmp.legacy import QEMUMonitorProtocol  # the lab's own dependency: imported when saving

    final = images / BOOTED_DIR / key
    work = images / BOOTED_DIR / f".{key}.{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    monitor = QEMUMonitorProtocol(str(qmp_socket))
    try:
        monitor.connect()
        monitor.cmd("migrate-set-parameters", **{"max-bandwidth": UNTHROTTLED_BYTES_PER_SECOND})
        monitor.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(work / STATE_FILE))}")
        deadline = time.monotonic() + timeout
        try:
            status = ""
            while time.monotonic() < deadline:
                progress = monitor.cmd("query-migrate")
                status = str(progress.get("status", "")) if isinstance(progress, dict) else ""
                if status in ("completed", "failed", "cancelled"):
                    break
                time.sleep(0.2)
            if status != "completed":
                raise LabError(f"saving the booted host to {work} ended with migration status {status or 'unknown'}")
            # QEMU has stopped the VM and flushed its disks: copy them as the saved state has them.
            _copy(overlay, work / OVERLAY_FILE)
            if efi_vars is not None:
                _copy(efi_vars, work / EFI_VARS_FILE)
        finally:
            # Resumes the host (and retakes its disks) whether the save worked or not.
            if status != "completed":
                monitor.cmd("migrate_cancel")
            monitor.cmd("cont")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        monitor.close()
    try:
        work.rename(final)
    except OSError:  # another process saved this shape first
        shutil.rmtree(work, ignore_errors=True)
    return SavedBoot(key, final)
