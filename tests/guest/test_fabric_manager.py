"""The `fabric-manager` step of `gpuhost guest up`: enable and start nvidia-fabricmanager.service in a
guest given the NVSwitches, and wait until systemd says it is active.

This machine has no systemd to start a service under and no NVSwitch for Fabric Manager to train,
so systemctl's answers are scripted (a unit that comes up after a while, one that fails, one that
never finishes starting): faults that cannot be caused here for real. The answers are the ones
`systemctl is-active` prints (one state a line; exit 0 only for active, 3 for the others). The
install of the package itself runs for real in tests/guest/test_offline_install.py.
"""

from __future__ import annotations

import pytest

from gpuhost.guest import provision
from gpuhost.transport import CommandResult


class SystemctlScript:
    """Answers systemctl and journalctl as a guest's systemd would, from a list of is-active states."""

    description = "scripted"

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.commands: list[list[str]] = []

    @property
    def round_trips(self) -> int:
        return len(self.commands)

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 120.0) -> CommandResult:
        self.commands.append(argv)
        if argv[:2] == ["systemctl", "is-active"]:
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return CommandResult(0 if state == "active" else 3, f"{state}\n".encode(), b"")
        if argv[0] == "journalctl":
            return CommandResult(0, b"nv-fabricmanager[812]: fabric manager version mismatch with driver\n", b"")
        return CommandResult(0, b"", b"")

    def close(self) -> None:
        pass


def no_log(argv: list[str], result: CommandResult) -> None:
    pass


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision, "FABRIC_MANAGER_POLL_S", 0.01)


def test_the_service_is_enabled_started_and_waited_for_until_active() -> None:
    guest = SystemctlScript(["activating", "activating", "active"])
    started = provision.start_fabric_manager(guest, log=no_log, timeout=10)
    assert guest.commands[0] == ["systemctl", "enable", "--now", "nvidia-fabricmanager.service"]
    assert guest.commands.count(["systemctl", "is-active", "nvidia-fabricmanager.service"]) == 3
    assert started.describe().startswith("nvidia-fabricmanager.service active after ")


def test_a_failed_service_is_named_with_its_journal_and_error_802() -> None:
    guest = SystemctlScript(["activating", "failed"])
    with pytest.raises(provision.RemoteCommandError, match=r"(?s)is failed; .*error 802.*version mismatch with driver"):
        provision.start_fabric_manager(guest, log=no_log, timeout=10)


def test_a_service_that_never_comes_up_ends_at_the_steps_timeout() -> None:
    guest = SystemctlScript(["activating"])
    with pytest.raises(TimeoutError, match=r"not active within 0\.1 s \(it is 'activating'\).*fabric_manager: SECONDS"):
        provision.start_fabric_manager(guest, log=no_log, timeout=0.1)
