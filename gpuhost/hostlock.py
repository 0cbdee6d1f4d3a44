"""One run at a time per host: the lock apply, rollback and `guest up` hold on the host, from their
first change to their end (the trial reboot included), and what a second run is told.

Ansible has no lock of its own per host. The lock is a file on the host (gpuhost.plan.model.LOCK_PATH,
under /var/lib, so that it survives the reboots it must span), made with O_EXCL (the shell's
noclobber): of two runs, exactly one makes it. It names its holder: the controller, the
ansible-playbook process there (with its start time, so that a reused process number is not taken
for it), the command and when it was taken, and the host's boot then. A run that finds it refuses
the host at once; a lock whose holder is known gone is called stale and reported as such, and is
only ever removed by the run that holds it or by --break-lock (gpuhost_break_lock: true), never
taken over on its own. Pure but for `this_run` and `holder_alive`, which read the controller's /proc,
and `held`, which asks the host through a transport (`guest up`; apply and rollback ask through the
collection's gpuhost.passthrough.lock action).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from gpuhost.errors import GpuhostError
from gpuhost.plan.model import LOCK_PATH
from gpuhost.transport import Transport

__all__ = [
    "LOCK_PATH",
    "HostLocked",
    "LockAnswer",
    "LockHolder",
    "acquire_command",
    "held",
    "held_message",
    "release_command",
]

# The first word of a refused host's message: the engine reports the host as locked (exit 2).
LOCKED_PREFIX = "locked:"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a host: one run of apply or rollback."""

    controller: str  # the controller's host name
    pid: int  # ansible-playbook's process there
    process_start: str  # its start time in clock ticks since the controller's boot (/proc/PID/stat field 22)
    command: str  # what was run, e.g. "gpuhost apply -i inventory.yml --limit gpu01"
    started: str  # when the lock was taken, UTC (ISO 8601)
    boot_id: str = ""  # the host's boot when it was taken (written by the host)

    @property
    def run(self) -> str:
        """One run's identity: the lock is released only by the run that took it."""
        return f"{self.controller}:{self.pid}:{self.process_start}"

    def record(self) -> str:
        """The lock file's first line (the host appends its boot id as the second)."""
        return json.dumps({**asdict(self), "run": self.run}, sort_keys=True)

    def describe(self) -> str:
        return f"`{self.command}` from {self.controller} (process {self.pid}), since {self.started}"


@dataclass(frozen=True)
class LockAnswer:
    """What the host said to a run that asked for its lock."""

    taken: bool  # this run holds the lock now
    boot_id: str  # the host's boot now
    holder: LockHolder | None  # who holds it (None: this run, or a lock file that cannot be read)
    unreadable: str = ""  # the lock file's text, when it names no holder
    broken: LockHolder | None = None  # --break-lock: the holder whose lock this run removed
    broken_unreadable: str = ""


def this_run(command: str, pid: int, now: datetime | None = None) -> LockHolder:
    """This controller's run: `pid` is ansible-playbook's process (the action plugin's parent)."""
    return LockHolder(
        controller=socket.gethostname(),
        pid=pid,
        process_start=_process_start(pid),
        command=command,
        started=(now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def acquire_command(path: str = LOCK_PATH, *, break_lock: bool = False) -> str:
    """sh, the holder's record on stdin: takes the lock where nobody holds it (--break-lock: removes
    any lock first). Prints 'taken' or 'held', the boot id, '--', the lock file; after a broken lock,
    '-- broken' and what it held."""
    quoted = shlex.quote(path)
    broken = (
        f'if [ -e {quoted} ]; then old=$(cat {quoted}; echo x); rm -f {quoted}; else old=""; fi; ' if break_lock else ""
    )
    return (
        f"umask 077; mkdir -p {shlex.quote(str(Path(path).parent))} || exit 3; "
        f"boot=$(cat {_BOOT_ID}); record=$(cat); {broken}"
        f'if ( set -C; printf \'%s\\nboot_id %s\\n\' "$record" "$boot" > {quoted} ) 2>/dev/null; '
        "then echo taken; else echo held; fi; "
        f'echo "$boot"; echo --; cat {quoted} 2>/dev/null; '
        + ('[ -z "$old" ] || { echo "-- broken"; printf \'%s\' "${old%x}"; }; ' if break_lock else "")
        + "true"
    )


def release_command(holder: LockHolder, path: str = LOCK_PATH) -> str:
    """sh: removes the lock only where this run holds it. Prints 'released' or 'not ours'."""
    marker = json.dumps({"run": holder.run})[1:-1]  # "run": "controller:pid:start", as record() writes it
    quoted = shlex.quote(path)
    return (
        f"if grep -qF -- {shlex.quote(marker)} {quoted} 2>/dev/null; then rm -f {quoted} && echo released; "
        "else echo 'not ours'; fi"
    )


def parse_lock(text: str) -> LockHolder | None:
    """The lock file -> its holder (None: not a record gpuhost wrote)."""
    lines = text.splitlines()
    try:
        data = json.loads(lines[0]) if lines else None
        if not isinstance(data, dict):
            return None
        boot = next((line.split(" ", 1)[1] for line in lines[1:] if line.startswith("boot_id ")), "")
        return LockHolder(
            controller=str(data["controller"]),
            pid=int(data["pid"]),
            process_start=str(data["process_start"]),
            command=str(data["command"]),
            started=str(data["started"]),
            boot_id=boot.strip(),
        )
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def parse_answer(output: str) -> LockAnswer:
    """acquire_command's output -> LockAnswer."""
    head, _, rest = output.partition("\n--\n")
    first = head.splitlines()
    if len(first) < 2 or first[0] not in ("taken", "held"):
        raise ValueError(f"the host's answer to the lock is not gpuhost's: {output[:200]!r}")
    current, _, broken = rest.partition("-- broken\n")
    holder = parse_lock(current)
    old = parse_lock(broken) if broken else None
    return LockAnswer(
        taken=first[0] == "taken",
        boot_id=first[1].strip(),
        holder=holder,
        unreadable="" if holder else current.strip(),
        broken=old,
        broken_unreadable="" if old or not broken else broken.strip(),
    )


def holder_alive(holder: LockHolder) -> bool | None:
    """Whether the holder's process still runs (None: it runs on another controller, which gpuhost cannot see)."""
    if holder.controller != socket.gethostname():
        return None
    return bool(holder.process_start) and _process_start(holder.pid) == holder.process_start


def held_message(host: str, answer: LockAnswer, alive: bool | None, path: str = LOCK_PATH) -> str:
    """Why this run refuses `host`: who holds it, whether that holder is known gone, and the fix."""
    fix = (
        "run again with --break-lock (apply, rollback, guest up; ansible-playbook: -e gpuhost_break_lock=true) "
        f"once you are sure no run holds {host}"
    )
    holder = answer.holder
    if holder is None:
        return (
            f"{LOCKED_PREFIX} {host} has a lock file {path} that gpuhost cannot read "
            f"({answer.unreadable[:200]!r}): another run may hold it. Look at it, then {fix}."
        )
    rebooted = bool(holder.boot_id) and holder.boot_id != answer.boot_id
    since = "and the host has rebooted since it was taken" if rebooted else "and the host has not rebooted since"
    if alive is False:
        return (
            f"{LOCKED_PREFIX} {host} is held by a stale lock of {holder.describe()}: that process is gone "
            f"({since}), so that run died without its end; what it left on the host may be half done. Look at "
            f"the host (gpuhost audit), then {fix}; gpuhost never takes a lock over on its own."
        )
    where = (
        "that run is still going"
        if alive
        else f"gpuhost cannot see processes on {holder.controller} ({since.removeprefix('and ')})"
    )
    return f"{LOCKED_PREFIX} {host} is held by {holder.describe()}; {where}. Wait for it to end, or, if it died, {fix}."


def default_command() -> str:
    """What ran this, when the caller did not say (ansible-playbook run without gpuhost's CLI)."""
    try:
        words = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
        text = " ".join(word.decode("utf-8", "replace") for word in words if word)
    except OSError:
        text = " ".join(sys.argv)
    return text[:300] or "ansible-playbook"


def _process_start(pid: int) -> str:
    """Field 22 of /proc/PID/stat (after the parenthesised name, which may hold spaces); '' if none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


class HostLocked(GpuhostError):
    """Another run holds the host (exit 2): nothing of this run touched it."""


@contextmanager
def held(
    transport: Transport,
    host: str,
    command: str,
    *,
    break_lock: bool = False,
    path: str = LOCK_PATH,
    timeout: float = 60.0,
) -> Iterator[LockHolder]:
    """The host's lock, held by this process for the block (`guest up`): taken where nobody holds it
    (`break_lock`: any lock removed first), else HostLocked naming the holder (held_message);
    released at the end only where this run holds it."""
    holder = this_run(command, os.getpid())
    answer_text = transport.run(
        ["sh", "-c", acquire_command(path, break_lock=break_lock)],
        stdin=(holder.record() + "\n").encode(),
        timeout=timeout,
    )
    try:
        answer = parse_answer(answer_text.stdout.decode(errors="replace"))
    except ValueError as error:
        raise HostLocked(f"{host}: {error} (stderr: {answer_text.stderr.decode(errors='replace')[:300]})") from error
    if not answer.taken:
        alive = None if answer.holder is None else holder_alive(answer.holder)
        raise HostLocked(held_message(host, answer, alive, path))
    try:
        yield holder
    finally:
        transport.run(["sh", "-c", release_command(holder, path)], timeout=timeout)
