"""The collection's audit playbook (gpuhost.passthrough.audit) against `gpuhost audit --json`.

Both read the same host, a real sshd on 127.0.0.1 (tests/sshd.py): the CLI through its own SSH
transport, the playbook through Ansible's ssh connection and ansible-runner (as `gpuhost apply`
runs playbooks). Each host's JSON object must be the same apart from the audit's duration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.cli.main import main
from gpuhost.rollout import engine
from gpuhost.rollout.environment import AUDIT_PLAYBOOK
from gpuhost.targets import ConnectionDefaults, inventory_targets

# Fields that measure the run rather than describe the host.
TIMING = ("seconds",)


def _without_timing(audit: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in audit.items() if key not in TIMING}


@pytest.mark.ssh
def test_the_audit_playbook_writes_what_gpuhost_audit_json_prints_for_the_same_host(
    sshd_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known_hosts = sshd_server.write_known_hosts(tmp_path / "known_hosts")
    hosts = {
        "gpu01": sshd_server.ansible_host(known_hosts),
        # No valid gpuhost_gpus: its own error line and object; the play goes on for gpu01.
        "misconfigured": {"ansible_connection": "local", "gpuhost_gpus": ["not-a-gpu"]},
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))

    def cli_audit() -> dict[str, Any]:
        assert main(["audit", "-i", str(inventory), "--limit", "gpu01", "--json"]) in (0, 1)
        (line,) = capsys.readouterr().out.splitlines()
        return _without_timing(json.loads(line))

    # The host is this machine, shared with other work (packages installed, modules loaded): a
    # comparison holds only while it stayed the same, so the playbook's audit is bracketed by two of
    # the CLI's and the round repeated (at most 3 times) when they differ.
    for _ in range(3):
        before = cli_audit()
        sessions_before = sshd_server.sessions()
        report = tmp_path / "audit.jsonl"
        tracker = engine.EventTracker(lambda line: None)
        targets = inventory_targets(inventory, "gpu01", ConnectionDefaults())  # its known_hosts file for ssh
        _, rc, _ = engine.run_playbook(
            # Its report is written by a play on the controller's localhost, which the limit names (as apply's).
            AUDIT_PLAYBOOK,
            inventory,
            [*hosts, "localhost"],
            {"gpuhost_audit_report_path": str(report)},
            "",
            targets,
            tracker,
        )
        sessions = sshd_server.sessions() - sessions_before
        if cli_audit() == before:
            break
    else:
        pytest.fail(f"the host changed during each of 3 rounds; last CLI audit before the playbook: {before}")

    lines = [json.loads(line) for line in report.read_text().splitlines()]
    by_host = {line["host"]: line for line in lines}
    assert list(by_host) == ["gpu01", "misconfigured"], lines
    assert before["status"] != "unreachable", before  # a real audit, not two identical errors
    assert _without_timing(by_host["gpu01"]) == before
    assert sessions == 1  # the gather: one command, nothing else
    misconfigured = by_host["misconfigured"]
    assert (misconfigured["status"], misconfigured["error_kind"]) == ("unreachable", "input")
    assert "gpuhost_gpus entry 'not-a-gpu'" in misconfigured["error"]
    assert set(tracker.stopped) == {"misconfigured"}, tracker.stopped
    assert "gpuhost_gpus entry 'not-a-gpu'" in tracker.stopped["misconfigured"].message
    assert rc == 2  # a host failed; the play ran to its report
