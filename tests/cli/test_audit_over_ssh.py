"""`gpuhost audit` and `gpuhost snapshot` over real SSH to real sshd instances on 127.0.0.1.

The servers (tests/sshd.py, fixtures in conftest.py) run on this machine as root, so an audit
over SSH must find exactly what a local audit finds; only the host name in messages differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SshdFactory
from sshd import Sshd, free_port, is_listening

from gpuhost.cli.main import main

pytestmark = pytest.mark.ssh

Finding = tuple[str, str, str]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """gpuhost in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def ssh_args(server: Sshd, known_hosts: Path) -> list[str]:
    return ["--private-key", str(server.client_key), "--known-hosts", str(known_hosts), "--connect-timeout", "10"]


def json_lines(out: str) -> list[dict[str, Any]]:
    """--json output: every non-empty line must be one JSON object."""
    lines = [line for line in out.splitlines() if line.strip()]
    objects = [json.loads(line) for line in lines]
    assert all(isinstance(obj, dict) for obj in objects), out
    return objects


def findings(host: dict[str, Any]) -> list[Finding]:
    return sorted((f["code"], f["severity"], f["subject"]) for f in host["findings"])


def by_host(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["host"]: obj for obj in objects}


@pytest.fixture(scope="module")
def local_findings() -> list[Finding]:
    """What `gpuhost audit --json` finds on this machine without SSH (a subprocess: the real CLI)."""
    completed = subprocess.run(
        [sys.executable, "-m", "gpuhost", "audit", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode in (0, 1), completed.stderr
    (host,) = json_lines(completed.stdout)
    assert host["reachable"] is True and host["source"] == "local"
    assert host["findings"], "a local audit always reports something (at least info findings)"
    return findings(host)


def test_audit_over_ssh_matches_local_audit(
    sshd_server: Sshd, sshd_known_hosts: Path, local_findings: list[Finding]
) -> None:
    # Through the installed entry point, as a user runs it.
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhost",
            "audit",
            "--json",
            *ssh_args(sshd_server, sshd_known_hosts),
            sshd_server.target,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode in (0, 1), completed.stdout + completed.stderr
    (host,) = json_lines(completed.stdout)
    assert host["host"] == sshd_server.target
    assert host["source"] == "ssh"
    assert host["reachable"] is True and host["error"] is None
    assert host["round_trips"] == 1
    assert findings(host) == local_findings
    # Messages name the host the audit went to, not the local machine's name.
    assert all(sshd_server.target in f["message"] for f in host["findings"] if f["severity"] != "info")
    assert completed.returncode == (1 if host["counts"]["error"] else 0)
    assert sshd_server.connections() == 1
    assert sshd_server.sessions() == 1


def test_unknown_host_key_is_refused_by_default(
    capsys: pytest.CaptureFixture[str], sshd_server: Sshd, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "empty_known_hosts"
    known_hosts.write_text("")
    status, out, _ = run_cli(capsys, "audit", "--json", *ssh_args(sshd_server, known_hosts), sshd_server.target)
    assert status == 2
    (host,) = json_lines(out)
    assert host["reachable"] is False
    assert host["error_kind"] == "host-key-unknown"
    assert f"127.0.0.1:{sshd_server.port}" in host["error"]
    assert "--accept-new-host-keys" in host["error"]
    assert known_hosts.read_text() == "", "a refused key must not be recorded"
    assert sshd_server.sessions() == 0, "nothing may run on a host whose key was not verified"
    # The human report says the same.
    status, out, _ = run_cli(capsys, "audit", *ssh_args(sshd_server, known_hosts), sshd_server.target)
    assert status == 2
    assert sshd_server.target in out and "--accept-new-host-keys" in out


def test_accept_new_host_keys_records_the_key(
    capsys: pytest.CaptureFixture[str], sshd_server: Sshd, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "new" / "known_hosts"  # neither the file nor its directory exists yet
    status, out, _ = run_cli(
        capsys, "audit", "--json", "--accept-new-host-keys", *ssh_args(sshd_server, known_hosts), sshd_server.target
    )
    (host,) = json_lines(out)
    assert host["reachable"] is True, host["error"]
    assert status in (0, 1)
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd_server.port} {sshd_server.host_public_key}\n"
    # Second run: the recorded key is trusted without the flag, and nothing new is appended.
    status, out, _ = run_cli(capsys, "audit", "--json", *ssh_args(sshd_server, known_hosts), sshd_server.target)
    (host,) = json_lines(out)
    assert host["reachable"] is True, host["error"]
    assert status in (0, 1)
    assert known_hosts.read_text().count("\n") == 1


def test_changed_host_key_aborts_only_that_host(
    capsys: pytest.CaptureFixture[str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    good, changed = sshd_factory("good"), sshd_factory("changed")
    known_hosts = tmp_path / "known_hosts"
    good.write_known_hosts(tmp_path / "good")
    changed.write_wrong_known_hosts(tmp_path / "changed")
    known_hosts.write_text((tmp_path / "good").read_text() + (tmp_path / "changed").read_text())
    before = known_hosts.read_text()
    status, out, _ = run_cli(
        capsys,
        "audit",
        "--json",
        "--accept-new-host-keys",  # must not override a changed key
        "--known-hosts",
        str(known_hosts),
        "--private-key",
        str(good.client_key),
        good.target,
        changed.target,
    )
    assert status == 2
    hosts = by_host(json_lines(out))
    assert hosts[good.target]["reachable"] is True, hosts[good.target]["error"]
    assert hosts[good.target]["round_trips"] == 1
    bad = hosts[changed.target]
    assert bad["reachable"] is False
    assert bad["error_kind"] == "host-key-changed"
    assert "CHANGED" in bad["error"] and f"127.0.0.1:{changed.port}" in bad["error"]
    assert bad["round_trips"] == 0
    assert known_hosts.read_text() == before, "a changed key must never be written over"
    assert changed.sessions() == 0
    # Offering the client key to `changed` is harmless (it has a different authorized key) but
    # the abort happens before authentication: the key exchange is where the key is checked.
    assert "Accepted publickey" not in changed.log()


def test_closed_port_fails_fast_and_spares_the_rest(
    capsys: pytest.CaptureFixture[str], sshd_server: Sshd, sshd_known_hosts: Path
) -> None:
    closed = free_port()
    assert not is_listening(closed)
    dead = f"root@127.0.0.1:{closed}"
    started = time.monotonic()
    status, out, _ = run_cli(
        capsys, "audit", "--json", *ssh_args(sshd_server, sshd_known_hosts), dead, sshd_server.target
    )
    elapsed = time.monotonic() - started
    assert status == 2
    hosts = by_host(json_lines(out))
    assert [obj for obj in hosts] == [dead, sshd_server.target], "results keep the command line's order"
    assert hosts[dead]["reachable"] is False
    assert hosts[dead]["error_kind"] == "unreachable"
    assert f"127.0.0.1:{closed}" in hosts[dead]["error"]
    assert hosts[sshd_server.target]["reachable"] is True, hosts[sshd_server.target]["error"]
    # A refused connection is not a timeout: well under --connect-timeout (10 s).
    assert elapsed < 5, elapsed
    # The human report names the dead host too.
    status, out, _ = run_cli(capsys, "audit", *ssh_args(sshd_server, sshd_known_hosts), dead)
    assert status == 2
    assert dead in out and "unreachable" in out.lower()


def test_snapshot_then_offline_audit_gives_the_live_findings(
    capsys: pytest.CaptureFixture[str], sshd_server: Sshd, sshd_known_hosts: Path, tmp_path: Path
) -> None:
    options = ssh_args(sshd_server, sshd_known_hosts)
    status, out, _ = run_cli(capsys, "audit", "--json", *options, sshd_server.target)
    (live,) = json_lines(out)
    assert live["reachable"] is True, live["error"]

    snapshot = tmp_path / "host.snap"
    status, out, err = run_cli(capsys, "snapshot", *options, sshd_server.target, "-o", str(snapshot))
    assert status == 0, err
    assert str(snapshot) in out
    assert (snapshot / "proc/cmdline").read_text() == Path("/proc/cmdline").read_text()
    assert (snapshot / "commands/status.txt").is_file()
    meta = json.loads((snapshot / "snapshot.json").read_text())
    assert meta["host"] == sshd_server.target
    assert meta["source"] == f"ssh://root@127.0.0.1:{sshd_server.port}"
    assert not list(tmp_path.glob(".host.snap.*")), "the staging directory is renamed into place"

    status, out, _ = run_cli(capsys, "audit", "--json", "--from-snapshot", str(snapshot))
    (offline,) = json_lines(out)
    assert offline["source"] == "snapshot"
    assert offline["reachable"] is True
    assert offline["round_trips"] == 0
    assert findings(offline) == findings(live)
    assert status == (1 if live["counts"]["error"] else 0)
    assert sshd_server.connections() == 2  # the live audit and the snapshot; the offline audit none


def write_inventory(path: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    """A YAML inventory: JSON is YAML, and json.dumps quotes every hostile string exactly."""
    path.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}, indent=2))
    return path


def inventory_host(server: Sshd, known_hosts: Path, **overrides: Any) -> dict[str, Any]:
    variables: dict[str, Any] = {
        "ansible_host": "127.0.0.1",
        "ansible_port": server.port,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(server.client_key),
        "gpuhost_known_hosts_file": str(known_hosts),
    }
    variables.update(overrides)
    return variables


def test_inventory_and_limit(capsys: pytest.CaptureFixture[str], sshd_factory: SshdFactory, tmp_path: Path) -> None:
    first, second = sshd_factory("gpu01"), sshd_factory("gpu02")
    inventory = write_inventory(
        tmp_path / "inventory.yml",
        {
            "gpu01": inventory_host(first, first.write_known_hosts(tmp_path / "kh1")),
            "gpu02": inventory_host(second, second.write_known_hosts(tmp_path / "kh2")),
        },
    )
    status, out, err = run_cli(capsys, "audit", "--json", "-i", str(inventory))
    assert status in (0, 1), err
    hosts = by_host(json_lines(out))
    assert sorted(hosts) == ["gpu01", "gpu02"]
    assert all(host["reachable"] and host["round_trips"] == 1 for host in hosts.values()), hosts
    assert (first.connections(), second.connections()) == (1, 1)

    status, out, err = run_cli(capsys, "audit", "--json", "-i", str(inventory), "--limit", "gpu02")
    assert status in (0, 1), err
    (host,) = json_lines(out)
    assert host["host"] == "gpu02" and host["reachable"] is True
    assert (first.connections(), second.connections()) == (1, 2)

    status, _, err = run_cli(capsys, "audit", "--json", "-i", str(inventory), "--limit", "gpu99")
    assert status == 2
    assert "no hosts" in err


HOSTILE = [
    pytest.param({"ansible_port": "22;reboot"}, "ansible_port", id="port"),
    pytest.param({"ansible_host": "$(id)"}, "ansible_host", id="host"),
    pytest.param({"ansible_user": "root\nx"}, "ansible_user", id="user"),
    pytest.param({"gpuhost_gpus": ["10de:2330;reboot"]}, "gpuhost_gpus", id="gpus"),
]


@pytest.mark.parametrize(("hostile", "variable"), HOSTILE)
def test_hostile_inventory_values_are_rejected_before_connecting(
    capsys: pytest.CaptureFixture[str],
    sshd_server: Sshd,
    sshd_known_hosts: Path,
    tmp_path: Path,
    hostile: dict[str, Any],
    variable: str,
) -> None:
    # A good host first and the hostile one second: if validation ran per host as it connected,
    # the good host would be reached before the bad value was seen.
    inventory = write_inventory(
        tmp_path / "inventory.yml",
        {
            "good01": inventory_host(sshd_server, sshd_known_hosts),
            "evil01": inventory_host(sshd_server, sshd_known_hosts, **hostile),
        },
    )
    status, out, err = run_cli(capsys, "audit", "--json", "-i", str(inventory))
    assert status == 2
    assert out == ""
    assert "evil01" in err and variable in err, err
    assert "gpuhost audit: error:" in err
    assert sshd_server.connections() == 0, sshd_server.log()
    # The same for the snapshot verb, which must not create its output either.
    output = tmp_path / "snap"
    status, out, err = run_cli(capsys, "snapshot", "-i", str(inventory), "-o", str(output))
    assert status == 2
    assert "evil01" in err and variable in err, err
    assert not output.exists()
    assert sshd_server.connections() == 0, sshd_server.log()
