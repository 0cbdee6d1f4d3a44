"""Issue 13 class 8: Ctrl-C is prompt, and a known_hosts path that would block is refused up front.

Real processes: gpuhost runs as `python -m gpuhost` against loopback servers that accept the TCP
connection and then say nothing (an SSH handshake that would wait for its whole timeout), and gets
a real SIGINT while its hosts are in progress.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_hostile_corpus import Listener

pytestmark = pytest.mark.hostile  # issue 13's corpus: pytest -m hostile

ROOT = Path(__file__).resolve().parents[2]
# What "prompt" means here: the hosts in progress would hold the run for --connect-timeout (60 s).
PROMPT_SECONDS = 5.0


def _as_a_terminal_starts_it() -> None:
    """SIGINT as a shell's foreground command gets it: default. A test run started in the background
    by a non-interactive shell (`cmd &`) has SIGINT ignored, POSIX shells do that for `&`, and an
    ignored signal stays ignored across exec: Python then installs no KeyboardInterrupt handler, and
    gpuhost, rightly, keeps ignoring Ctrl-C (seen in a rehearsal started with nohup ... &)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gpuhost(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpuhost", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_terminal_starts_it,  # runs in the child before exec: one signal.signal call
    )


def wait_for(condition: object, seconds: float, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"gpuhost exited {process.returncode} before the hosts were in progress: {out}{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the hosts never connected")
        time.sleep(0.1)


def ctrl_c(process: subprocess.Popen[str], number: int = signal.SIGINT) -> tuple[str, str, float]:
    """SIGINT, as a terminal's Ctrl-C sends it (or signal `number`: SIGHUP, a closed terminal); what
    the process printed and how long it took to exit."""
    interrupted = time.monotonic()
    process.send_signal(number)
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the process did not exit after signal {number}")
    return out, err, time.monotonic() - interrupted


@pytest.fixture
def stalling() -> Iterator[Listener]:
    server = Listener(b"", "hang")  # accepts, then never sends the SSH banner
    yield server
    server.close()


def stalled_inventory(tmp_path: Path, port: int, hosts: int = 3) -> Path:
    lines = ["all:", "  hosts:"]
    for number in range(hosts):
        lines += [f"    gpu{number:02}:", "      ansible_host: 127.0.0.1", f"      ansible_port: {port}"]
    lines += ["  vars:", f"    gpuhost_known_hosts_file: {tmp_path / 'known_hosts'}"]
    path = tmp_path / "inventory.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["audit", "--json"], id="audit-json"),
        pytest.param(["audit"], id="audit-text"),
        pytest.param(["plan", "--json"], id="plan-json"),
        pytest.param(["plan"], id="plan-text"),
    ],
)
def test_ctrl_c_with_hosts_in_progress_exits_130_at_once(argv: list[str], tmp_path: Path, stalling: Listener) -> None:
    inventory = stalled_inventory(tmp_path, stalling.port)
    process = gpuhost(*argv, "--connect-timeout", "60", "-i", str(inventory))
    wait_for(lambda: stalling.connections >= 3, 60, process)
    out, err, waited = ctrl_c(process)
    assert process.returncode == 130, out + err
    assert waited < PROMPT_SECONDS, f"Ctrl-C took {waited:.1f} s: it waited for the hosts in progress"
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"gpuhost {argv[0]}: interrupted", err
    assert out == "", "no report (JSON or text) is written for an interrupted run"


def tgkill(pid: int, thread: int, number: int) -> None:
    """A signal to one thread of a process (tgkill(2)); os.kill lets the kernel pick the thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, thread, number) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {thread}")


SYS_TGKILL = 234  # x86-64


@pytest.mark.parametrize("argv", [["audit", "--json"], ["audit"]], ids=["audit-json", "audit-text"])
def test_ctrl_c_taken_by_a_worker_thread_still_exits_130_at_once(
    argv: list[str], tmp_path: Path, stalling: Listener
) -> None:
    """Linux hands a process's SIGINT to any thread that does not block it. CI once saw the signal land
    on a host's worker thread while the main thread sat in an untimed wait: Ctrl-C was ignored until a
    host timed out. Here it is sent to each worker thread in turn, the case the kernel picks at random."""
    inventory = stalled_inventory(tmp_path, stalling.port)
    process = gpuhost(*argv, "--connect-timeout", "60", "-i", str(inventory))
    wait_for(lambda: stalling.connections >= 3, 60, process)
    tasks = Path(f"/proc/{process.pid}/task").iterdir()
    workers = sorted(int(task.name) for task in tasks if int(task.name) != process.pid)
    assert workers, "gpuhost runs its hosts in threads"
    interrupted = time.monotonic()
    tgkill(process.pid, workers[-1], signal.SIGINT)
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the process did not exit after a Ctrl-C taken by a worker thread")
    waited = time.monotonic() - interrupted
    assert process.returncode == 130, out + err
    assert waited < PROMPT_SECONDS, f"Ctrl-C took {waited:.1f} s"


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
@pytest.mark.parametrize("where", ["--known-hosts", "gpuhost_known_hosts_file"])
def test_a_known_hosts_path_that_is_no_regular_file_is_refused_before_connecting(
    kind: str, where: str, tmp_path: Path, stalling: Listener
) -> None:
    path = {"fifo": tmp_path / "fifo", "directory": tmp_path, "device": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    inventory = tmp_path / "inventory.yml"
    host = f"    gpu01:\n      ansible_host: 127.0.0.1\n      ansible_port: {stalling.port}\n"
    if where == "gpuhost_known_hosts_file":
        host += f"      gpuhost_known_hosts_file: {path}\n"
    inventory.write_text("all:\n  hosts:\n" + host)
    argv = ["audit", "--accept-new-host-keys", "-i", str(inventory)]
    process = gpuhost(*argv, *(["--known-hosts", str(path)] if where == "--known-hosts" else []))
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"a {kind} as known_hosts hung gpuhost")
    assert process.returncode == 2, out + err
    assert "Traceback" not in err
    assert f"known_hosts file {path}" in err and "regular file" in err and where in err, err
    time.sleep(0.3)  # the listener's accept loop polls every 0.2 s
    assert stalling.connections == 0


PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: A task that outlives the operator's patience
      ansible.builtin.shell: echo $$ > {pidfile}; exec sleep 300
"""

RUN_PLAYBOOK = """\
import sys
from pathlib import Path
from gpuhost.rollout import engine

tracker = engine.EventTracker(lambda line: None)
_, rc, status = engine.run_playbook(Path(sys.argv[1]), Path(sys.argv[2]), ["localhost"], {}, "", [], tracker)
print(status, rc)
"""


def test_ctrl_c_during_a_rollout_stops_the_playbook_and_its_children(tmp_path: Path) -> None:
    """apply's engine: SIGINT cancels the run, kills ansible-playbook's process group (the task's
    `sleep` with it) within a second, and reports 'canceled' (apply's 130: tests/rollout/test_engine.py)."""
    pytest.importorskip("ansible_runner")
    pidfile = tmp_path / "task.pid"
    playbook = tmp_path / "slow.yml"
    playbook.write_text(PLAYBOOK.format(pidfile=pidfile))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", RUN_PLAYBOOK, str(playbook), str(inventory)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: pidfile.is_file() and pidfile.read_text().strip(), 120, process)
    task = int(pidfile.read_text())
    out, err, waited = ctrl_c(process)
    assert out.split()[0] == "canceled", out + err
    assert waited < PROMPT_SECONDS, f"the canceled run took {waited:.1f} s to stop"
    assert gone(task), "the task's process must go with the playbook's process group"


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 2  # a killed orphan is reaped by init, not at once
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
