"""gpuhost.rollout: apply and rollback through the engine, with ansible-runner replaced by a recorder.

What Ansible sends is the real text of a lab run (tests/fixtures/ansible); the recorder also
keeps what the engine hands ansible-playbook (inventory sources, limit), so these tests see
the inventory read once per command and each host's gpuhost_known_hosts_file reach ssh.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gpuhost.cli.main import main
from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.fleet import PlanOutcome
from gpuhost.rollout.hostkeys import host_key_message
from gpuhost.rollout.report import HostStatus
from gpuhost.targets import ansible_inventory_settings
from tests.helpers import COLLECTION, FIXTURES, SNAPSHOTS

HOST_KEY_CHANGED = (FIXTURES / "ansible/unreachable-host-key-changed.txt").read_text()
PLANNER_TASK = "Compute the desired state with gpuhost's planner"
# site.yml's plays, by name.
PLAN_PLAY = "Plan every host (read-only; a refused host stops here, untouched)"
CONFIGURE_PLAY = "Configure for passthrough, rolling reboot, verify"


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """Two hosts on a closed loopback port; gpu01 keeps its host keys in its own known_hosts file."""
    known_hosts = tmp_path / "lab known_hosts"  # a space: the option must be quoted for ssh
    known_hosts.write_text("")
    hosts = {
        "gpu01": {
            "ansible_host": "127.0.0.1",
            "ansible_port": 9,
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
            "gpuhost_known_hosts_file": str(known_hosts),
        },
        "gpu02": {"ansible_host": "127.0.0.1", "ansible_port": 9},
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


@pytest.fixture
def inventory_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every time Ansible parses an inventory in this process."""
    ansible_inventory_settings()  # before Ansible's first import here: it reads its settings once
    from ansible.inventory.manager import InventoryManager

    reads: list[str] = []
    original = InventoryManager.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        reads.append(str(kwargs.get("sources")))
        original(self, *args, **kwargs)

    monkeypatch.setattr(InventoryManager, "__init__", counting)
    yield reads


def _recorder(
    events: list[dict[str, Any]], stats: dict[str, Any], rc: int
) -> tuple[Callable[..., SimpleNamespace], list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def run(**kwargs: Any) -> SimpleNamespace:
        sources = kwargs["inventory"]
        extra = [Path(p).read_text() for p in sources[1:]] if isinstance(sources, list) else []
        limit = kwargs["limit"]  # '@FILE': the file goes with the run's private directory
        calls.append({**kwargs, "extra_sources": extra, "limit_lines": Path(limit[1:]).read_text().split("\n")})
        for event in events:
            kwargs["event_handler"](event)
        return SimpleNamespace(stats=stats, rc=rc, status="failed" if rc else "successful")

    return run, calls


def _unreachable(host: str) -> dict[str, Any]:
    return {
        "event": "runner_on_unreachable",
        "event_data": {"host": host, "task": PLANNER_TASK, "play": PLAN_PLAY, "res": {"msg": HOST_KEY_CHANGED}},
    }


def _lab_plan(host: str) -> PlanOutcome:
    facts = build_facts(SnapshotTree(SNAPSHOTS / "lab-gpu-pair-fresh"))
    return PlanOutcome(
        host, plan_host(host, facts, PlanSettings.from_variables({"gpuhost_gpus": ["1234:1111"]}, host)), None
    )


def test_interactive_apply_reads_the_inventory_once_and_reports_an_unreachable_host_as_2(
    inventory: Path,
    inventory_reads: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, calls = _recorder([_unreachable("gpu01")], {"dark": {"gpu01": 1}, "ok": {}}, rc=4)
    monkeypatch.setattr("ansible_runner.run", run)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    monkeypatch.setattr(
        "gpuhost.plan.fleet.plan_fleet",
        lambda targets, forks, require_rescue=False: [_lab_plan(t.name) for t in targets],
    )
    report_path = tmp_path / "report.json"

    code = main(["apply", "-i", str(inventory), "--limit", "gpu01", "--report", str(report_path)])

    out = capsys.readouterr().out
    assert "vfio-pci <- 0000:" in out  # the plan was shown before the question
    assert len(inventory_reads) == 1, inventory_reads  # was 4: plan (2) and the checks before the run (2)
    (call,) = calls
    assert call["playbook"] == "gpuhost.passthrough.site"  # the collection's playbook, as AWX runs it
    assert call["limit_lines"] == ["~^gpu01\\Z", "localhost"]
    # Issue 13.4: the known_hosts file the audit uses is the one ssh gets, after the host's own options.
    extra = json.loads(call["extra_sources"][0])
    known_hosts = shlex.quote(str(tmp_path / "lab known_hosts"))
    assert extra == {
        "all": {
            "hosts": {
                "gpu01": {
                    "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts}"
                }
            }
        }
    }
    report = json.loads(report_path.read_text())
    assert set(report) == {"schema", "hosts", "ansible_stats", "ansible_rc", "ansible_status", "seconds"}
    entry = report["hosts"]["gpu01"]
    assert entry["status"] == HostStatus.UNREACHABLE.value
    assert entry["message"].startswith("its SSH host key is not the one in known_hosts")
    assert code == 2  # as audit and plan for a host that cannot be reached (was 1)


def test_a_host_the_recap_lists_but_no_task_reached_is_not_reached_and_exits_1(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed_task = {
        "event": "runner_on_failed",
        "event_data": {
            "host": "gpu01",
            "task": PLANNER_TASK,
            "play": CONFIGURE_PLAY,
            "res": {"msg": "gather failed"},
        },
    }
    planned = {
        "event": "runner_on_ok",
        "event_data": {"host": "gpu02", "task": PLANNER_TASK, "play": PLAN_PLAY, "res": {}},
    }
    run, _ = _recorder([planned, failed_task], {"failures": {"gpu01": 1}, "ok": {"gpu01": 1, "gpu02": 1}}, rc=2)
    monkeypatch.setattr("ansible_runner.run", run)
    report_path = tmp_path / "report.json"
    assert main(["apply", "-i", str(inventory), "--yes", "--report", str(report_path)]) == 1
    hosts = json.loads(report_path.read_text())["hosts"]
    assert hosts["gpu01"] == {"status": "failed", "message": f"{PLANNER_TASK}: gather failed"}
    assert hosts["gpu02"]["status"] == "not reached"


def test_interactive_rollback_reads_the_inventory_once_and_names_the_hosts_it_asks_about(
    inventory: Path,
    inventory_reads: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, calls = _recorder([_unreachable("gpu01")], {"dark": {"gpu01": 1}}, rc=4)
    monkeypatch.setattr("ansible_runner.run", run)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    prompts: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: prompts.append(prompt) or "y")

    code = main(["rollback", "-i", str(inventory), "--limit", "~gpu0[1]"])

    assert prompts == ["Remove gpuhost's configuration from gpu01 and reboot it? [y/N] "]
    assert len(inventory_reads) == 1, inventory_reads  # was 3: the checks (2) and the read-back (1)
    (call,) = calls
    assert call["playbook"] == "gpuhost.passthrough.rollback"
    assert call["limit_lines"] == ["~^gpu01\\Z"] and call["extra_sources"]
    out = capsys.readouterr().out
    assert "unreachable" in out and "its SSH host key is not the one in known_hosts" in out
    assert code == 2


def sshd_inventory(sshd_server: Any, known_hosts: Path, tmp_path: Path, **extra: str) -> Path:
    """An inventory of one host, gpu01, the real sshd, with `known_hosts` as its gpuhost_known_hosts_file."""
    host = {**sshd_server.ansible_host(known_hosts), **extra}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    return inventory


def run_task_on_sshd_host(
    sshd_server: Any, known_hosts: Path, tmp_path: Path, module: str, **extra: str
) -> tuple[int, Any]:
    """One play of one task (`module`, no arguments) on gpu01, the real sshd, as apply runs
    playbooks (ansible-runner, gpuhost's limit file and known_hosts); its return code and tracker.
    `extra`: more of gpu01's variables."""
    from gpuhost.rollout import engine
    from gpuhost.targets import ConnectionDefaults, exact_host_pattern, inventory_targets

    inventory = sshd_inventory(sshd_server, known_hosts, tmp_path, **extra)
    playbook = tmp_path / "one-task.yml"
    playbook.write_text(f"- hosts: all\n  gather_facts: false\n  tasks:\n    - name: One task\n      {module}:\n")
    targets = inventory_targets(inventory, None, ConnectionDefaults())
    tracker = engine.EventTracker(lambda line: None)
    _, rc, _ = engine.run_playbook(playbook, inventory, [exact_host_pattern("gpu01")], {}, "", targets, tracker)
    return rc, tracker


@pytest.mark.ssh
@pytest.mark.parametrize("key_matches", [True, False], ids=["known key", "changed key"])
@pytest.mark.hostile
def test_ansible_verifies_host_keys_against_gpuhost_known_hosts_file(
    key_matches: bool, sshd_server: Any, tmp_path: Path
) -> None:
    """Issue 13.4 against a real sshd: without the file handed to ssh, Ansible read ~/.ssh/known_hosts,
    found no key, and reported what reads as a possible interception."""
    write = sshd_server.write_known_hosts if key_matches else sshd_server.write_wrong_known_hosts
    known_hosts = write(tmp_path / "known_hosts")
    rc, tracker = run_task_on_sshd_host(sshd_server, known_hosts, tmp_path, "ansible.builtin.ping")

    if key_matches:
        assert rc == 0 and tracker.stopped == {}, tracker.stopped
    else:
        outcome = tracker.stopped["gpu01"]
        assert outcome.status is HostStatus.UNREACHABLE
        assert outcome.message.startswith("its SSH host key is not the one in known_hosts"), outcome.message
        assert str(known_hosts) in outcome.message  # ssh read the inventory's file, not ~/.ssh/known_hosts


@pytest.mark.ssh
def test_a_changed_host_key_makes_the_planners_host_unreachable_not_failed(sshd_server: Any, tmp_path: Path) -> None:
    """site.yml's first task, gpuhost.passthrough.plan, reads the host through the play's connection.
    A host whose key changed after the audit (the fault suite's fault 6, on a lab host) must end
    unreachable, as under any module, not failed with ssh's warning as the planner's message."""
    known_hosts = sshd_server.write_wrong_known_hosts(tmp_path / "known_hosts")
    _, tracker = run_task_on_sshd_host(sshd_server, known_hosts, tmp_path, "gpuhost.passthrough.plan")
    outcome = tracker.stopped["gpu01"]
    assert outcome.status is HostStatus.UNREACHABLE, outcome
    assert outcome.message.startswith("its SSH host key is not the one in known_hosts"), outcome.message


@pytest.mark.hostile
@pytest.mark.parametrize("verb", ["apply", "rollback"])
def test_ansibles_paramiko_connection_is_refused_before_anything_runs(
    verb: str, inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13.4: Ansible's paramiko connection reads only ~/.ssh/known_hosts, whatever
    gpuhost_known_hosts_file says, and for a key it does not know waits at a yes/no prompt (on the
    real sshd above, a run with ansible_connection paramiko hung at that prompt until killed, 15 min)."""
    hosts = yaml.safe_load(inventory.read_text())
    hosts["all"]["hosts"]["gpu01"]["ansible_connection"] = "paramiko"
    inventory.write_text(yaml.safe_dump(hosts))
    run, calls = _recorder([], {}, rc=0)
    monkeypatch.setattr("ansible_runner.run", run)
    report = tmp_path / "report.json"
    extra = ["--yes", "--report", str(report)] if verb == "apply" else ["--limit", "gpu01", "--yes"]
    assert main([verb, "-i", str(inventory), *extra]) == 2
    error = capsys.readouterr().err
    assert "inventory host gpu01: ansible_connection paramiko: apply and rollback run Ansible" in error
    assert "not gpuhost_known_hosts_file" in error and "Use ansible_connection: ssh" in error
    assert calls == [] and not report.exists()


def test_a_key_missing_from_known_hosts_is_not_called_an_interception() -> None:
    # What Ansible said for a host whose key was in no known_hosts file ssh read (real text).
    message = (FIXTURES / "ansible/unreachable-host-key-unknown.txt").read_text()
    said = host_key_message(message)
    assert said is not None and "gpuhost_known_hosts_file" in said and "intercept" not in said
    changed = host_key_message(HOST_KEY_CHANGED)
    assert changed is not None and "someone may be intercepting" in changed
    assert host_key_message("Failed to connect to the host via ssh: Connection refused") is None


@pytest.mark.hostile
def test_a_canceled_apply_exits_130_and_keeps_the_previous_report(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 class 8: Ctrl-C during a rollout (ansible-runner's status 'canceled')."""

    def run(**kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(stats={}, rc=-1, status="canceled")

    monkeypatch.setattr("ansible_runner.run", run)
    report_path = tmp_path / "report.json"
    report_path.write_text('{"schema": "gpuhost.apply/1", "hosts": {"gpu01": {"status": "ready"}}}\n')
    previous = report_path.read_bytes()
    assert main(["apply", "-i", str(inventory), "--yes", "--report", str(report_path)]) == 130
    assert report_path.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".report")) == []


@pytest.mark.hostile
def test_a_canceled_rollback_exits_130_and_reads_no_host_back(
    inventory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 class 8: a rollback stopped by Ctrl-C is not followed by reading the hosts back (an
    SSH audit of each, which Ctrl-C would then have to interrupt again) nor a table of results."""

    def run(**kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(stats={}, rc=-1, status="canceled")

    def read_back(target: Any) -> None:
        raise AssertionError(f"{target.name} was read back after Ctrl-C")

    monkeypatch.setattr("ansible_runner.run", run)
    monkeypatch.setattr("gpuhost.audit.audit_target", read_back)
    assert main(["rollback", "-i", str(inventory), "--limit", "gpu01", "--yes"]) == 130
    captured = capsys.readouterr()
    assert captured.err.strip() == "gpuhost rollback: interrupted" and "rolled back" not in captured.out


def test_the_report_filter_says_each_status_with_the_engines_enum(monkeypatch: pytest.MonkeyPatch) -> None:
    """filter/report.py's statuses are HostStatus's values (the engine reads them back with HostStatus.of)."""
    monkeypatch.syspath_prepend(str(COLLECTION.parents[2]))
    from ansible_collections.gpuhost.passthrough.plugins.filter.report import report_entry

    verified = {"gpuhost_plan_result": {"plan": {}}, "gpuhost_verify_result": {"verification": {"status": "ready"}}}
    entries = {
        HostStatus.UNREACHABLE_OR_NOT_RUN: {},
        HostStatus.REFUSED: {"gpuhost_plan_result": {"plan": {"refusals": [{"code": "plan.iommu.absent"}]}}},
        HostStatus.FAILED: {"gpuhost_plan_result": {"failed": True, "plan": {}}},
        HostStatus.NOT_VERIFIED: {"gpuhost_plan_result": {"plan": {}}},
        HostStatus.READY: verified,
    }
    for status, hostvars in entries.items():
        assert HostStatus.of(report_entry(hostvars)["status"]) is status


@pytest.mark.hostile
def test_an_interrupted_apply_reports_where_each_host_was(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46.8: a run interrupted (Ctrl-C, SIGTERM, SIGHUP) after it reached hosts writes the report:
    a host rebooting into its trial is left to its rescue, and the report says so; a host whose batch
    had not begun changed nothing."""
    reboot = "Reboot into the new kernel command line (only when /proc/cmdline differs from the plan)"
    events = [
        {"event": "runner_on_ok", "event_data": {"host": "gpu02", "task": PLANNER_TASK, "play": PLAN_PLAY, "res": {}}},
        {"event": "playbook_on_task_start", "event_data": {"task": reboot}},
        {"event": "runner_on_ok", "event_data": {"host": "gpu01", "task": "x", "play": "Configure for passthrough"}},
    ]

    def run(**kwargs: Any) -> SimpleNamespace:
        for event in events:
            kwargs["event_handler"](event)
        return SimpleNamespace(stats={}, rc=-1, status="canceled")

    monkeypatch.setattr("ansible_runner.run", run)
    report_path = tmp_path / "report.json"
    assert main(["apply", "-i", str(inventory), "--yes", "--report", str(report_path)]) == 130
    hosts = json.loads(report_path.read_text())["hosts"]
    assert hosts["gpu01"]["status"] == "not-reported" and "left to its rescue" in hosts["gpu01"]["message"], hosts
    assert hosts["gpu02"]["status"] == "not reached" and "nothing was changed" in hosts["gpu02"]["message"], hosts
