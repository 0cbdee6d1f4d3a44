"""Issue 46, hostile input round three: the operator's shell cannot weaken gpuhost's promises,
nothing waits for a prompt, a BMC secret never comes back in an error, and a signal ends a run as
Ctrl-C does. The `round3` section of tests/hostile/cases.yml, and the classes whose inputs are real
processes: ansible-playbook runs, a real sshd on loopback (tests/sshd.py), signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.rollout import engine
from gpuhost.rollout.report import HostStatus
from gpuhost.targets import ConnectionDefaults, exact_host_pattern, inventory_targets
from tests.cli.test_hostile_corpus import Listener, assert_clean, cases, listener, run
from tests.cli.test_interrupt import ctrl_c
from tests.rollout.test_engine import run_task_on_sshd_host, sshd_inventory

__all__ = ["listener"]  # the loopback listener fixture, shared with the corpus

pytestmark = pytest.mark.hostile

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2"  # what no message may show


@pytest.mark.parametrize("case", cases("round3"))
def test_hostile_shell_and_bmc_settings(
    case: dict[str, Any],
    tmp_path: Path,
    listener: Listener,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Classes 1, 6 and 9: refused by name (exit 2) before anything connects or is written."""
    for name in ("GPUHOST_TEST_46_UNSET", "ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_VAULT_IDENTITY_LIST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in case.get("env", {}).items():
        monkeypatch.setenv(name, value)
    host = {"ansible_host": "127.0.0.1", "ansible_port": listener.port, **case.get("vars", {})}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    argv = [{"INV": str(inventory)}.get(arg, arg).replace("TMP", str(tmp_path)) for arg in case["argv"]]
    before = sorted(p.name for p in tmp_path.iterdir())
    status, out, err = run(capsys, argv)
    assert_clean(out, err)
    assert status == 2, out + err
    assert case["says"] in err, err
    assert SECRET not in out + err and case.get("not_says", SECRET) not in err, err
    time.sleep(0.3)  # the listener's accept loop polls every 0.2 s
    assert listener.connections == 0, "a refusal must come before any connection"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing may be written"


def test_every_name_ansible_reads_a_promise_from_is_set() -> None:
    """A setting gpuhost states must be stated under each environment name Ansible reads it from: an
    alias left as the shell had it could be the one Ansible takes."""
    from gpuhost.rollout.environment import OVERRIDDEN

    ansible = Path(__import__("ansible").__file__).parent
    base = yaml.safe_load((ansible / "config/base.yml").read_text())
    ssh = (ansible / "plugins/connection/ssh.py").read_text()
    documented = yaml.safe_load(ssh.split('DOCUMENTATION = """')[1].split('"""')[0])["options"]
    settings = {
        "ANSIBLE_HOST_KEY_CHECKING": [base["HOST_KEY_CHECKING"], documented["host_key_checking"]],
        "ANSIBLE_ASK_PASS": [base["DEFAULT_ASK_PASS"]],
        "ANSIBLE_BECOME_ASK_PASS": [base["DEFAULT_BECOME_ASK_PASS"]],
        "ANSIBLE_ASK_VAULT_PASS": [base["DEFAULT_ASK_VAULT_PASS"]],
        "ANSIBLE_COLLECTIONS_PATH": [base["COLLECTIONS_PATHS"]],
        "ANSIBLE_INVENTORY": [base["DEFAULT_HOST_LIST"]],
        "ANSIBLE_TRANSPORT": [base["DEFAULT_TRANSPORT"]],
        "ANSIBLE_SSH_ARGS": [documented["ssh_args"]],
        "ANSIBLE_PIPELINING": [base["ANSIBLE_PIPELINING"], documented["pipelining"]],
    }
    stated = {names[0]: set(names) for names, _, _ in OVERRIDDEN}
    for first, definitions in settings.items():
        names = {entry["name"] for definition in definitions for entry in definition.get("env", [])}
        assert names <= stated[first], (first, names - stated[first])


# --- a stand-in collection: apply and rollback run real ansible-playbook on the controller ----------------


def stand_in_playbooks(tmp_path: Path, tasks: str) -> tuple[dict[str, str], Path]:
    """GPUHOST_PLAYBOOKS naming playbooks whose gpuhost.passthrough.site and .rollback run `tasks` on
    localhost (the controller, local connection), and an inventory of that one host."""
    playbooks = tmp_path / "playbooks"
    collection = playbooks / "collections/ansible_collections/gpuhost/passthrough"
    (collection / "playbooks").mkdir(parents=True)
    (collection / "galaxy.yml").write_text("namespace: gpuhost\nname: passthrough\nversion: 0.0.1\n")
    (playbooks / "site.yml").write_text("- ansible.builtin.import_playbook: gpuhost.passthrough.site\n")
    play = f"- name: Configure for passthrough (a stand-in)\n  hosts: all\n  gather_facts: false\n  tasks:\n{tasks}"
    for name in ("site.yml", "rollback.yml"):
        (collection / "playbooks" / name).write_text(play)
    inventory = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-local": local}}}))
    return {"GPUHOST_PLAYBOOKS": str(playbooks), "PYTHONPATH": str(ROOT)}, inventory


def gpuhost(env: dict[str, str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuhost", *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


PAUSE = "    - name: Ask a person\n      ansible.builtin.pause:\n        prompt: Press enter\n"
NOTE = "    - name: Say it ran\n      ansible.builtin.debug:\n        msg: ran\n"


@pytest.mark.parametrize(
    "variable",
    ["ANSIBLE_ASK_PASS", "ANSIBLE_BECOME_ASK_PASS", "ANSIBLE_ASK_VAULT_PASS", "ANSIBLE_ENABLE_TASK_DEBUGGER", None],
)
def test_nothing_waits_for_a_person(variable: str | None, tmp_path: Path) -> None:
    """Class 2: a prompt setting from the shell sat at Ansible's prompt until killed; a prompt in a
    play (a pause) waits at the terminal ansible-runner gives it. Stdin is closed: neither waits."""
    env, inventory = stand_in_playbooks(tmp_path, PAUSE + NOTE)
    if variable is not None:
        env[variable] = "True"
    report = tmp_path / "report.json"
    try:
        result = gpuhost(env, "apply", "-i", str(inventory), "--check", "--report", str(report), timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"apply --check waited at a prompt ({variable or 'a pause'})")
    assert "Traceback" not in result.stderr
    # The stand-in writes no host report (its host ends not-reported, exit 1): Ansible's own run is the proof.
    data = json.loads(report.read_text())
    assert (data["ansible_status"], data["ansible_rc"]) == ("successful", 0), result.stdout + result.stderr
    if variable is not None:
        assert f"note: {variable} from the environment is not used: nothing waits" in result.stderr, result.stderr


# (LANG=C alone works already: Python coerces it to C.UTF-8, and its children inherit that.)
@pytest.mark.parametrize("locale", [{"LC_ALL": "C"}, {"LC_ALL": "POSIX", "LANG": "C"}], ids=["C", "POSIX"])
def test_a_c_locale_still_runs_ansible(locale: dict[str, str], tmp_path: Path) -> None:
    """Class 3: under a C or POSIX locale (cron, systemd units) ansible-playbook refused to start and
    apply said only 'ansible: failed (rc 1)'. gpuhost gives Ansible a UTF-8 locale."""
    env, inventory = stand_in_playbooks(tmp_path, NOTE)
    report = tmp_path / "report.json"
    result = gpuhost({**env, **locale}, "apply", "-i", str(inventory), "--check", "--report", str(report))
    assert "Traceback" not in result.stderr and report.is_file(), result.stdout + result.stderr
    data = json.loads(report.read_text())
    assert (data["ansible_status"], data["ansible_rc"]) == ("successful", 0), result.stdout + result.stderr


@pytest.mark.parametrize("verb", ["apply", "rollback", "audit", "plan"])
@pytest.mark.parametrize(
    ("shell", "names"),
    [
        ({"HOME": "/proc"}, "HOME=/proc is not writable"),
        ({"HOME": "TMP/a-file"}, "HOME=TMP/a-file is not writable"),
        ({"ANSIBLE_LOCAL_TEMP": "/proc/gpuhost-46"}, "ANSIBLE_LOCAL_TEMP=/proc/gpuhost-46 names a directory"),
    ],
    ids=["home-proc", "home-a-file", "local-temp-proc"],
)
def test_an_unwritable_home_or_temp_names_the_cause(
    shell: dict[str, str], names: str, verb: str, tmp_path: Path, listener: Listener
) -> None:
    """Class 4: a HOME that is not writable (containers) or an unwritable ANSIBLE_LOCAL_TEMP ended
    in Ansible's traceback from makedirs_safe. Named, exit 2, before anything connects."""
    _refused_for_its_directories(shell, names, verb, tmp_path, listener)


@pytest.mark.parametrize("verb", ["apply", "rollback"])
@pytest.mark.parametrize(
    ("shell", "names"),
    [
        ({"HOME": "/proc", "ANSIBLE_LOCAL_TEMP": "TMP/local-temp"}, "HOME=/proc is not writable: Ansible's control"),
        ({"ANSIBLE_SSH_CONTROL_PATH_DIR": "TMP/a-file/cp"}, "ANSIBLE_SSH_CONTROL_PATH_DIR names TMP/a-file/cp"),
    ],
    ids=["home", "control-path-dir"],
)
def test_an_unwritable_ssh_control_path_dir_names_the_cause(
    shell: dict[str, str], names: str, verb: str, tmp_path: Path, listener: Listener
) -> None:
    """Class 4: with Ansible's local temporary directory writable but not its ssh's control_path_dir
    (~/.ansible/cp), every host of apply and rollback 'failed' at its first task, as if at fault."""
    _refused_for_its_directories(shell, names, verb, tmp_path, listener)


def _refused_for_its_directories(
    shell: dict[str, str], names: str, verb: str, tmp_path: Path, listener: Listener
) -> None:
    inventory = tmp_path / "inventory.yml"
    host = {"ansible_host": "127.0.0.1", "ansible_port": listener.port}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    argv = {
        "apply": ["apply", "-i", str(inventory), "--check", "--report", str(tmp_path / "r.json")],
        "rollback": ["rollback", "-i", str(inventory), "--limit", "gpu01", "--yes"],
        "audit": ["audit", "-i", str(inventory)],
        "plan": ["plan", "-i", str(inventory)],
    }[verb]
    (tmp_path / "a-file").write_text("")
    shell = {name: value.replace("TMP", str(tmp_path)) for name, value in shell.items()}
    result = gpuhost({**shell, "PYTHONPATH": str(ROOT)}, *argv)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert names.replace("TMP", str(tmp_path)) in result.stderr, result.stderr
    assert "Ansible cannot start" in result.stderr
    time.sleep(0.3)
    assert listener.connections == 0


# --- host keys: a real sshd on loopback --------------------------------------------------------------------


@pytest.mark.ssh
@pytest.mark.parametrize(
    "shell",
    [
        {"ANSIBLE_HOST_KEY_CHECKING": "False"},
        {"ANSIBLE_SSH_HOST_KEY_CHECKING": "False"},
        {"ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_SSH_ARGS": "-o StrictHostKeyChecking=no"},
    ],
    ids=["host-key-checking", "ssh-host-key-checking", "ssh-args"],
)
def test_host_key_checking_switched_off_in_the_shell_is_overridden(
    shell: dict[str, str], sshd_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Class 1, against a real sshd whose key changed: with host key checking switched off in the
    shell (and StrictHostKeyChecking=no from the inventory's own ansible_ssh_extra_args, which ssh
    read first), Ansible connected and ran its task. gpuhost states StrictHostKeyChecking=yes first."""
    for name, value in shell.items():
        monkeypatch.setenv(name, value)
    known_hosts = sshd_server.write_wrong_known_hosts(tmp_path / "known_hosts")
    sessions = sshd_server.sessions()
    _, tracker = run_task_on_sshd_host(
        sshd_server, known_hosts, tmp_path, "ansible.builtin.ping", ansible_ssh_extra_args="-o StrictHostKeyChecking=no"
    )
    outcome = tracker.stopped["gpu01"]
    assert outcome.status is HostStatus.UNREACHABLE, outcome
    assert outcome.message.startswith("its SSH host key is not the one in known_hosts"), outcome.message
    assert sshd_server.sessions() == sessions, "nothing may run on a host whose key changed"


@pytest.mark.ssh
def test_rollback_names_a_changed_host_key(sshd_server: Any, tmp_path: Path) -> None:
    """Class 5: the real rollback playbook on a host whose key changed reported 'unreachable' with the
    detail 'All items completed' (its first task loops over files); apply named the host key."""
    known_hosts = sshd_server.write_wrong_known_hosts(tmp_path / "known_hosts")
    inventory = sshd_inventory(sshd_server, known_hosts, tmp_path)
    targets = inventory_targets(inventory, None, ConnectionDefaults())
    request = engine.RollbackRequest(inventory=inventory, limit=(exact_host_pattern("gpu01"),), reboot_timeout=60)
    failures = engine.rollback(request, targets, lambda line: None)
    outcome = failures["gpu01"]
    assert outcome.status is HostStatus.UNREACHABLE, outcome
    assert outcome.message.startswith("its SSH host key is not the one in known_hosts"), outcome.message
    assert str(known_hosts) in outcome.message


# --- class 8: SIGHUP ends a run as Ctrl-C does --------------------------------------------------------------

SLEEP = (
    "    - name: A task that outlives the terminal\n      ansible.builtin.shell: echo $$ > {pidfile}; exec sleep 300\n"
    "      check_mode: false\n"  # runs under apply --check too
)


def _ansible_playbooks_of(marker: str) -> list[int]:
    """The ansible-playbook processes whose command line names `marker` (this test's inventory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(words).decode(errors="replace")
        if "ansible-playbook" in text and marker in text:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("verb", ["apply", "apply-check", "rollback"])
def test_a_closed_terminal_stops_the_run_and_leaves_nothing_running(verb: str, tmp_path: Path) -> None:
    """Class 8: SIGHUP (the operator's SSH session dropped) ended gpuhost at once while its
    ansible-playbook, under ansible-runner's pty in a session of its own, went on unwatched. Now it
    stops every process of the run, writes the report (apply) and exits 130, as Ctrl-C does."""
    pidfile = tmp_path / "task.pid"
    env, inventory = stand_in_playbooks(tmp_path, SLEEP.format(pidfile=pidfile))
    report = tmp_path / "report.json"
    argv = {
        "apply": ["apply", "--yes", "--report", str(report)],
        "apply-check": ["apply", "--check", "--report", str(report)],
        "rollback": ["rollback", "--yes", "--limit", "gpu-local"],
    }[verb]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuhost", argv[0], "-i", str(inventory), *argv[1:]],
        cwd=ROOT,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (pidfile.is_file() and pidfile.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the task never started: {process.communicate()}")
        time.sleep(0.1)
    task = int(pidfile.read_text())
    assert _ansible_playbooks_of(str(inventory)), "the run's ansible-playbook must be running"
    out, err, _ = ctrl_c(process, signal.SIGHUP)
    assert "Traceback" not in err, err
    assert process.returncode == 130, out + err
    deadline = time.monotonic() + 5  # a killed process is reaped by its parent or init, not at once
    while (_ansible_playbooks_of(str(inventory)) or _alive(task)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ansible_playbooks_of(str(inventory)) == [], "no ansible-playbook of the run may outlive gpuhost"
    assert not _alive(task), "the task in progress must stop with the run"
    if verb != "rollback":
        entry = json.loads(report.read_text())["hosts"]["gpu-local"]
        assert entry["status"] == HostStatus.NOT_REPORTED.value, entry
        assert "interrupted during this host's batch" in entry["message"], entry


def test_ansible_that_stops_before_its_first_task_is_named(tmp_path: Path) -> None:
    """Every failure names its cause: ansible-playbook that stopped before it ran anything (here a
    playbook it cannot parse; under a C locale, its locale) left an empty table and 'failed (rc 1)'."""
    env, inventory = stand_in_playbooks(tmp_path, NOTE)
    site = tmp_path / "playbooks/collections/ansible_collections/gpuhost/passthrough/playbooks/site.yml"
    site.write_text("- hosts: all\n  tasks: [unbalanced\n")
    report = tmp_path / "report.json"
    result = gpuhost(env, "apply", "-i", str(inventory), "--check", "--report", str(report))
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert "ansible-playbook stopped before it ran anything:" in result.stderr, result.stderr
    assert "ERROR" in result.stderr and not report.exists(), result.stderr
