"""The lab's state file: which VMs `lab up` started, by PID, and where their files are."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuhost.lab.errors import LabError

STATE_VERSION = 1


@dataclass(frozen=True)
class VmRecord:
    name: str
    topology: str
    pid: int
    # Start time of the process (clock ticks since boot, /proc/PID/stat field 22): together
    # with the PID it tells our QEMU from an unrelated process that reused the PID.
    start_ticks: int
    ssh_port: int
    overlay: str
    serial_log: str
    pidfile: str
    memory_mib: int
    cpus: int
    image: str
    # How to start this host again from its disk: never with `-incoming` (see gpuhost.lab.resume).
    argv: tuple[str, ...]
    # Its QMP socket ("" without one), the key of its shape's saved boot, and whether this QEMU
    # was resumed from that saved boot instead of booting.
    qmp_socket: str = ""
    resume_key: str = ""
    resumed: bool = False


@dataclass(frozen=True)
class LabState:
    hosts: tuple[VmRecord, ...] = ()
    inventory: str | None = None
    version: int = STATE_VERSION
    extra: dict[str, str] = field(default_factory=dict)


def state_to_json(state: LabState) -> str:
    return json.dumps(asdict(state), indent=2, sort_keys=True) + "\n"


def state_from_json(text: str) -> LabState:
    try:
        data = json.loads(text)
        if data.get("version") != STATE_VERSION:
            raise LabError(f"lab state file has version {data.get('version')!r}, expected {STATE_VERSION}")
        hosts = tuple(VmRecord(**{**host, "argv": tuple(host["argv"])}) for host in data.get("hosts", []))
        return LabState(
            hosts=hosts,
            inventory=data.get("inventory"),
            extra=dict(data.get("extra", {})),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise LabError(f"lab state file is damaged ({error}); remove it once no lab VM runs") from error


def load_state(path: Path) -> LabState:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return LabState()
    except (OSError, UnicodeDecodeError) as error:  # a directory, no permission, binary garbage
        raise LabError(
            f"lab state file {path} cannot be read ({type(error).__name__}: {error}); remove it once no lab VM runs"
        ) from error
    return state_from_json(text)


def save_state(path: Path, state: LabState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    temporary.write_text(state_to_json(state))
    temporary.replace(path)


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, or None when no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after it start past the last ')'.
    rest = stat[stat.rfind(")") + 2 :].split()
    with contextlib.suppress(IndexError, ValueError):
        if rest[0] != "Z":  # a zombie has ended
            return int(rest[19])
    return None


def is_our_process(record: VmRecord) -> bool:
    """True when record.pid is still the QEMU that `lab up` started (not a reused PID)."""
    if record.pid <= 0 or process_start_ticks(record.pid) != record.start_ticks:
        return False
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return record.pidfile.encode() in cmdline
