"""The trial reboot's rescue (gpuhost_verify's tasks/bmc_power_cycle.yml and the bmc_power_cycle action)
run by ansible-runner as `gpuhost apply` runs it, against real BMC endpoints on 127.0.0.1 (tests/bmc/emulators.py).

The play's host is this machine over the local connection, standing in for a host whose trial
never answered: a task named as the role's reboot fails as ansible.builtin.reboot does at its
deadline, inside a block whose rescue is the role's own tasks file. The BMC must have carried out
the power cycle, the facts and the report entry must carry the times, the engine must read the
outcome, and the BMC password must be in no event, output or file of the run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.rollout import engine
from gpuhost.rollout.report import HostStatus
from gpuhost.targets import ConnectionDefaults, inventory_targets
from tests.bmc.emulators import IPMI_USER, REDFISH_USER, RedfishEmulator, ipmi_simulator, redfish_emulator

REDFISH_PASSWORD = "Rf-Vaulted-6023"
IPMI_PASSWORD = "Ipmi-Env-3391"
VAULT_PASSWORD = "vault-pass-for-test"
REBOOT_TIMEOUT_MESSAGE = "Timed out waiting for last boot time check (timeout=900)"

PLAYBOOK = [
    {
        "name": "A trial reboot that never answers, rescued through the BMC",
        "hosts": "gpu01",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Reboot, with the BMC as the last resort",
                "block": [
                    {
                        "name": "Reboot into the new kernel command line (stands in: fails as at the deadline)",
                        "ansible.builtin.fail": {"msg": REBOOT_TIMEOUT_MESSAGE},
                    }
                ],
                "rescue": [
                    {
                        "name": "Power-cycle the trial once through the BMC",
                        "ansible.builtin.include_role": {
                            "name": "gpuhost.passthrough.gpuhost_verify",
                            "tasks_from": "bmc_power_cycle.yml",
                        },
                    }
                ],
            },
            {
                "name": "Keep what the rescue noted, and the host's report entry",
                "ansible.builtin.copy": {
                    "dest": "{{ gpuhost_test_out }}",
                    "content": "{{ {'power_cycle': gpuhost_verify_power_cycle, 'note': gpuhost_verify_power_cycle_note,"
                    " 'entry': hostvars[inventory_hostname] | gpuhost.passthrough.report_entry} | to_json }}",
                    "mode": "0600",
                },
            },
        ],
    }
]


class RecordingTracker(engine.EventTracker):
    """apply's tracker, keeping every event whole (to search it for the password)."""

    def __init__(self) -> None:
        super().__init__(lambda line: None, echo=self._echo)
        self.events: list[str] = []
        self.output: list[str] = []

    def _echo(self, text: str) -> None:
        self.output.append(text)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        self.events.append(json.dumps(event, default=str))
        return super().__call__(event)


def _vaulted(secret: str) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(VAULT_PASSWORD.encode()))]).encrypt(secret).decode()


def run_rescue(tmp_path: Path, host_variables: dict[str, Any], vaulted_password: str | None = None) -> RecordingTracker:
    out = tmp_path / "rescue.json"
    variables = {
        "ansible_connection": "local",
        "ansible_python_interpreter": os.sys.executable,  # type: ignore[attr-defined]
        "gpuhost_verify_bmc_settle_seconds": 0,
        "gpuhost_verify_reboot_timeout": 30,
        "gpuhost_test_out": str(out),
        **host_variables,
    }
    text = yaml.safe_dump({"all": {"hosts": {"gpu01": variables}}})
    if vaulted_password is not None:
        text += "".join(
            [
                "      gpuhost_bmc_password: !vault |\n",
                *(f"        {line}\n" for line in _vaulted(vaulted_password).splitlines()),
            ]
        )
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(text)
    playbook = tmp_path / "rescue.yml"
    playbook.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    tracker = RecordingTracker()
    targets = inventory_targets(inventory, "gpu01", ConnectionDefaults())
    engine.run_playbook(playbook, inventory, ["gpu01"], {}, "", targets, tracker)
    return tracker


def assert_password_nowhere(password: str, tracker: RecordingTracker, *files: Path) -> None:
    assert password not in "\n".join(tracker.events)
    assert password not in "\n".join(tracker.output)
    for path in files:
        if path.exists():
            assert password not in path.read_text(errors="replace"), path


@pytest.fixture
def vault_password_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "vault-pass"
    path.write_text(VAULT_PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(path))
    yield path


@pytest.fixture
def redfish(tmp_path: Path) -> Iterator[RedfishEmulator]:
    with redfish_emulator(tmp_path / "redfish", REDFISH_PASSWORD) as emulator:
        yield emulator


def redfish_bmc(emulator: RedfishEmulator) -> dict[str, Any]:
    return {
        "protocol": "redfish",
        "address": f"https://127.0.0.1:{emulator.port}",
        "user": REDFISH_USER,
        "ca_bundle": str(emulator.certificate),
    }


def test_a_trial_that_never_answers_is_power_cycled_once_through_redfish(
    tmp_path: Path, redfish: RedfishEmulator, vault_password_file: Path
) -> None:
    tracker = run_rescue(tmp_path, {"gpuhost_bmc": redfish_bmc(redfish)}, REDFISH_PASSWORD)
    assert redfish.resets() == 1 and redfish.power_state() in ("Off", "On")
    kept = json.loads((tmp_path / "rescue.json").read_text())
    cycle = kept["power_cycle"]
    assert cycle["action"] == "ForceRestart" and cycle["bmc"] == f"https://127.0.0.1:{redfish.port}"
    assert cycle["deadline_passed"] <= cycle["sent_at"] <= cycle["answered_at"]
    assert kept["entry"]["power_cycled"] == cycle
    assert kept["note"].startswith("power-cycled through the BMC (ForceRestart")
    # The reboot's failure was rescued and the host answered: the engine holds nothing against it.
    assert tracker.stopped == {}
    # The engine read the same fact from Ansible's events: apply's report keeps it for a reverted host too.
    assert tracker.power_cycled == {"gpu01": cycle}
    assert_password_nowhere(REDFISH_PASSWORD, tracker, tmp_path / "rescue.json", redfish.log)


def test_wrong_bmc_credentials_are_the_hosts_own_error_and_nothing_is_reset(
    tmp_path: Path, redfish: RedfishEmulator, vault_password_file: Path
) -> None:
    wrong = "Wrong-Vaulted-1184"
    tracker = run_rescue(tmp_path, {"gpuhost_bmc": redfish_bmc(redfish)}, wrong)
    assert redfish.resets() == 0
    outcome = tracker.stopped["gpu01"]
    assert outcome.status is HostStatus.UNREACHABLE
    assert outcome.message.startswith("did not come back from the trial reboot by its deadline, and power-cycling")
    assert "wrong credentials" in outcome.message and "gpuhost_bmc.user" in outcome.message
    assert_password_nowhere(wrong, tracker, redfish.log)


def test_a_bmc_certificate_no_ca_trusts_is_the_hosts_tls_error(
    tmp_path: Path, redfish: RedfishEmulator, vault_password_file: Path
) -> None:
    bmc = {**redfish_bmc(redfish), "ca_bundle": None}
    tracker = run_rescue(tmp_path, {"gpuhost_bmc": {k: v for k, v in bmc.items() if v}}, REDFISH_PASSWORD)
    assert redfish.resets() == 0
    outcome = tracker.stopped["gpu01"]
    assert outcome.status is HostStatus.UNREACHABLE and "TLS error" in outcome.message
    assert_password_nowhere(REDFISH_PASSWORD, tracker)


def test_ipmi_with_the_password_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU01_BMC_PASSWORD", IPMI_PASSWORD)
    with ipmi_simulator(tmp_path / "ipmi", IPMI_PASSWORD) as simulator:
        bmc = {
            "protocol": "ipmi",
            "address": f"127.0.0.1:{simulator.port}",
            "user": IPMI_USER,
            "password_env": "GPU01_BMC_PASSWORD",
        }
        tracker = run_rescue(tmp_path, {"gpuhost_bmc": bmc})
        kept = json.loads((tmp_path / "rescue.json").read_text())
        assert kept["power_cycle"]["action"] == "chassis power cycle"
        assert simulator.vm_commands == ["power off"]
    assert tracker.stopped == {}
    assert_password_nowhere(IPMI_PASSWORD, tracker, tmp_path / "rescue.json")


# The role's own reboot step (tasks/reboot.yml: ansible.builtin.reboot and its rescue) over a real
# sshd on 127.0.0.1. Its reboot command is `true`: the machine never reboots, so the reboot task
# reaches its deadline exactly as on a trial that hangs, and its rescue runs.
REBOOT_PLAYBOOK = [
    {
        "name": "The trial reboot of gpuhost_verify, on a host that never comes back",
        "hosts": "gpu01",
        "gather_facts": False,
        "tasks": [
            {
                "name": "The role's reboot step",
                "ansible.builtin.include_role": {
                    "name": "gpuhost.passthrough.gpuhost_verify",
                    "tasks_from": "reboot.yml",
                },
            },
            {
                "name": "Keep what the rescue noted",
                "ansible.builtin.copy": {
                    "dest": "{{ gpuhost_test_out }}",
                    "content": "{{ gpuhost_verify_power_cycle | to_json }}",
                    "mode": "0600",
                },
                "delegate_to": "localhost",
            },
        ],
    }
]


def run_reboot_step(tmp_path: Path, sshd_server: Any, host_variables: dict[str, Any]) -> RecordingTracker:
    known_hosts = sshd_server.write_known_hosts(tmp_path / "known_hosts")
    variables = {
        **sshd_server.ansible_host(known_hosts),
        "gpuhost_trial_now": True,
        # A trial's reboot waits for the plan's controller_wait_s (its rescues' time plus one boot).
        "gpuhost_plan": {"reboot_needed": True, "verify_command": "true", "rescue": {"controller_wait_s": 5}},
        "gpuhost_verify_reboot_command": "true",
        "gpuhost_verify_bmc_settle_seconds": 0,
        "gpuhost_test_out": str(tmp_path / "rescue.json"),
        **host_variables,
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": variables}}}))
    playbook = tmp_path / "reboot.yml"
    playbook.write_text(yaml.safe_dump(REBOOT_PLAYBOOK, sort_keys=False))
    tracker = RecordingTracker()
    targets = inventory_targets(inventory, "gpu01", ConnectionDefaults())
    # 5 s: under the inventory's lowest (30 s), so an extra var, as apply passes its own (a reboot
    # without a trial waits for it).
    extravars = {"gpuhost_verify_reboot_timeout": 5}
    engine.run_playbook(playbook, inventory, ["gpu01", "localhost"], extravars, "", targets, tracker)
    return tracker


@pytest.mark.ssh
def test_the_role_reboot_that_times_out_is_power_cycled_through_the_bmc(
    tmp_path: Path, sshd_server: Any, redfish: RedfishEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU01_BMC_PASSWORD", REDFISH_PASSWORD)
    bmc = {**redfish_bmc(redfish), "password_env": "GPU01_BMC_PASSWORD"}
    tracker = run_reboot_step(tmp_path, sshd_server, {"gpuhost_bmc": bmc})
    assert any("Timed out waiting for last boot time check" in event for event in tracker.events)
    assert redfish.resets() == 1
    cycle = json.loads((tmp_path / "rescue.json").read_text())
    assert cycle["action"] == "ForceRestart" and cycle["deadline_passed"] <= cycle["sent_at"] <= cycle["answered_at"]
    assert tracker.stopped == {}
    assert_password_nowhere(REDFISH_PASSWORD, tracker, tmp_path / "rescue.json", redfish.log)


@pytest.mark.ssh
def test_without_a_bmc_the_role_reboot_that_times_out_stays_unreachable(tmp_path: Path, sshd_server: Any) -> None:
    tracker = run_reboot_step(tmp_path, sshd_server, {})
    outcome = tracker.stopped["gpu01"]
    assert outcome.status is HostStatus.UNREACHABLE
    assert outcome.message.startswith("did not come back from the reboot within the timeout: Timed out")
    assert outcome.message.endswith("(no gpuhost_bmc to power-cycle it through)")
    assert not (tmp_path / "rescue.json").exists()


def test_a_password_in_clear_is_refused_by_the_action_itself_and_nothing_is_reset(
    tmp_path: Path, redfish: RedfishEmulator
) -> None:
    """The CLI refuses a clear-text gpuhost_bmc_password before anything runs; the collection's action
    refuses it too, for a playbook run without gpuhost's CLI (AWX, Molecule, ansible-playbook)."""
    import subprocess

    from gpuhost.rollout.environment import ansible_environment

    variables = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpuhost_test_out": str(tmp_path / "rescue.json"),
        "gpuhost_bmc": redfish_bmc(redfish),
        "gpuhost_bmc_password": REDFISH_PASSWORD,
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": variables}}}))
    playbook = tmp_path / "rescue.yml"
    playbook.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    ran = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)],
        env={**os.environ, **ansible_environment()},
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    out = ran.stdout + ran.stderr
    assert ran.returncode != 0
    assert "gpuhost_bmc_password is written in clear in the inventory (its value is not shown)" in out
    assert REDFISH_PASSWORD not in out
    assert redfish.resets() == 0
