"""One run at a time per host (gpuhost.hostlock, the collection's gpuhost.passthrough.lock).

The lock's shell commands run for real (sh, O_EXCL through noclobber), and the action through
ansible-playbook against a real sshd on 127.0.0.1 (tests/sshd.py): a second run started while the
first holds the host is refused at once, naming the first, which goes on undisturbed; a run whose
ansible-playbook is SIGKILLed leaves its lock, which the next run reports as stale and only
--break-lock (gpuhost_break_lock) removes. The lock file is under tmp_path, never /var/lib/gpuhost.
What cannot be caused here: the host rebooting since the lock was taken (its boot id is changed
in the record instead, a pure judgement).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.hostlock import (
    LOCKED_PREFIX,
    acquire_command,
    held_message,
    holder_alive,
    parse_answer,
    release_command,
    this_run,
)
from gpuhost.inventory.policy import Role
from gpuhost.rollout import engine
from gpuhost.rollout.report import HostStatus, RolloutReport
from gpuhost.targets import ConnectionDefaults, inventory_targets


def _acquire(path: Path, record: str, *, break_lock: bool = False) -> str:
    done = subprocess.run(
        ["sh", "-c", acquire_command(str(path), break_lock=break_lock)],
        input=record + "\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def test_of_runs_asking_at_once_exactly_one_holds_the_host(tmp_path: Path) -> None:
    lock = tmp_path / "var/lib/gpuhost/lock"
    runs = [dataclasses.replace(this_run(f"gpuhost apply #{n}", os.getpid()), pid=100000 + n) for n in range(8)]
    with ThreadPoolExecutor(len(runs)) as pool:
        answers = [parse_answer(out) for out in pool.map(lambda run: _acquire(lock, run.record()), runs)]
    assert sum(answer.taken for answer in answers) == 1
    holder = next(answer.holder for answer in answers if answer.taken)
    assert holder is not None and all(answer.holder == holder for answer in answers)
    assert holder.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert oct(lock.stat().st_mode & 0o777) == "0o600"
    # Only the run that holds it releases it.
    other = next(run for run in runs if run.run != dataclasses.replace(holder, boot_id="").run)
    assert subprocess.run(["sh", "-c", release_command(other, str(lock))], capture_output=True, text=True).stdout == (
        "not ours\n"
    )
    assert lock.exists()
    mine = next(run for run in runs if run.pid == holder.pid)
    done = subprocess.run(["sh", "-c", release_command(mine, str(lock))], capture_output=True, text=True)
    assert done.stdout == "released\n" and not lock.exists()


def test_the_message_names_the_holder_and_tells_a_stale_lock() -> None:
    run = this_run("gpuhost apply -i inventory.yml --limit gpu01", os.getpid())
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    answer = parse_answer(f"held\n{boot}\n--\n{run.record()}\nboot_id {boot}\n")
    assert answer.holder is not None and holder_alive(answer.holder) is True
    going = held_message("gpu01", answer, True)
    assert going.startswith(f"{LOCKED_PREFIX} gpu01 is held by `gpuhost apply -i inventory.yml --limit gpu01` from ")
    assert f"(process {os.getpid()})" in going and "still going" in going
    gone = dataclasses.replace(run, pid=run.pid, process_start="1")  # the same number, another process
    assert holder_alive(gone) is False
    rebooted = parse_answer(f"held\nanother-boot\n--\n{gone.record()}\nboot_id {boot}\n")
    stale = held_message("gpu01", rebooted, holder_alive(gone))
    assert "stale lock" in stale and "the host has rebooted since" in stale and "--break-lock" in stale
    elsewhere = dataclasses.replace(run, controller="awx-runner-7")
    assert holder_alive(elsewhere) is None
    assert "cannot see processes on awx-runner-7" in held_message(
        "gpu01", parse_answer(f"held\n{boot}\n--\n{elsewhere.record()}\nboot_id {boot}\n"), None
    )
    unreadable = parse_answer(f"held\n{boot}\n--\nsomething else\n")
    assert unreadable.holder is None and "cannot read" in held_message("gpu01", unreadable, None)


LOCK_PLAYBOOK = """
- name: Hold the host, wait for the test, release
  hosts: all
  gather_facts: false
  tasks:
    - name: Hold the host
      block:
        - name: Hold this host's gpuhost lock
          gpuhost.passthrough.lock:
            path: "{{ test_lock }}"
            command: "{{ test_run }}"
            break_lock: "{{ gpuhost_break_lock | default(false) }}"
          register: gpuhost_lock_result
        - name: Work until the test says go
          ansible.builtin.wait_for:
            path: "{{ test_go }}"
            timeout: 120
      always:
        - name: Release this host's gpuhost lock
          gpuhost.passthrough.lock:
            state: released
            path: "{{ test_lock }}"
          when: gpuhost_lock_result is defined and gpuhost_lock_result is succeeded
"""


@pytest.mark.ssh
def test_a_second_run_is_refused_at_once_and_a_killed_runs_lock_is_reported_stale(
    sshd_server: Any, tmp_path: Path
) -> None:
    known_hosts = sshd_server.write_known_hosts(tmp_path / "known_hosts")
    host = sshd_server.ansible_host(known_hosts)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    playbook = tmp_path / "lock.yml"
    playbook.write_text(LOCK_PLAYBOOK)
    targets = inventory_targets(inventory, "gpu01", ConnectionDefaults(role=Role.HOST))
    lock, go = tmp_path / "lock", tmp_path / "go"

    def run(name: str, **extra: Any) -> engine.EventTracker:
        tracker = engine.EventTracker(lambda line: None)
        variables = {"test_lock": str(lock), "test_go": str(go), "test_run": name, **extra}
        engine.run_playbook(playbook, inventory, ["gpu01"], variables, "", targets, tracker)
        return tracker

    first: dict[str, engine.EventTracker] = {}
    holder = threading.Thread(target=lambda: first.setdefault("tracker", run("first apply")))
    holder.start()
    deadline = time.monotonic() + 120
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    record = json.loads(lock.read_text().splitlines()[0])
    assert record["command"] == "first apply"

    started = time.monotonic()
    second = run("second apply")
    refused_after = time.monotonic() - started
    outcome = second.stopped["gpu01"]
    assert outcome.status is HostStatus.LOCKED, outcome
    assert "held by `first apply`" in outcome.message and "still going" in outcome.message
    assert refused_after < 60, refused_after  # at once: one task, not the first run's length
    assert RolloutReport({"hosts": {"gpu01": {"status": outcome.status.value}}}).exit_code() == 2
    assert json.loads(lock.read_text().splitlines()[0]) == record  # the first run's lock, undisturbed
    go.touch()
    holder.join(120)
    assert not first["tracker"].stopped and not lock.exists()  # it ran through and released its own lock

    # A run killed (SIGKILL: no always, no release) leaves its lock behind.
    go.unlink()
    holder = threading.Thread(target=lambda: run("killed apply"))
    holder.start()
    while not lock.exists() and time.monotonic() < deadline + 120:
        time.sleep(0.2)
    killed = json.loads(lock.read_text().splitlines()[0])
    os.kill(killed["pid"], signal.SIGKILL)
    holder.join(120)
    go.touch()  # the killed run's worker, orphaned in its wait, ends too
    assert json.loads(lock.read_text().splitlines()[0]) == killed
    stale = run("next apply").stopped["gpu01"]
    assert stale.status is HostStatus.LOCKED and "stale lock of `killed apply`" in stale.message, stale
    assert "has not rebooted since" in stale.message and "--break-lock" in stale.message
    assert json.loads(lock.read_text().splitlines()[0]) == killed  # never taken over on its own
    broken = run("apply --break-lock", gpuhost_break_lock=True)
    assert not broken.stopped and not lock.exists()  # it held the host, ran and released


@pytest.mark.ssh
def test_guest_up_holds_the_host_through_its_transport_and_a_second_run_is_refused(
    sshd_server: Any, tmp_path: Path
) -> None:
    """hostlock.held, as `guest up` takes the lock, over a real sshd: held for the block, refused to a
    second run naming the first (still going: this process), released at the end; a lock left by a
    run whose process is gone is reported stale, and only break_lock takes it."""
    from gpuhost.hostlock import HostLocked, held
    from gpuhost.transport.ssh import SshOptions, SshTransport

    options = SshOptions(
        host="127.0.0.1",
        port=sshd_server.port,
        key_file=sshd_server.client_key,
        known_hosts_file=sshd_server.write_known_hosts(tmp_path / "known_hosts"),
    )
    lock = tmp_path / "var/lib/gpuhost/lock"
    transport = SshTransport(options)
    try:
        with held(transport, "gpu01", "gpuhost guest up --host gpu01 --vm train-1", path=str(lock)):
            assert "gpuhost guest up --host gpu01 --vm train-1" in lock.read_text()
            with (
                pytest.raises(HostLocked) as refused,
                held(transport, "gpu01", "gpuhost apply -i inventory.yml", path=str(lock)),
            ):
                pass
            message = str(refused.value)
            assert message.startswith("locked: gpu01 is held by `gpuhost guest up --host gpu01 --vm train-1`")
            assert "that run is still going" in message and refused.value.exit_code == 2
        assert not lock.exists()
        # A run that died (its process gone): its lock stays, reported stale, broken only on request.
        dead = dataclasses.replace(this_run("gpuhost guest up --vm old", os.getpid()), pid=999999, process_start="1")
        _acquire(lock, dead.record())
        with (
            pytest.raises(HostLocked, match="is held by a stale lock of `gpuhost guest up --vm old`"),
            held(transport, "gpu01", "gpuhost guest up --vm new", path=str(lock)),
        ):
            pass
        with held(transport, "gpu01", "gpuhost guest up --vm new", path=str(lock), break_lock=True):
            assert "--vm new" in lock.read_text()
        assert not lock.exists()
    finally:
        transport.close()
