"""The nouveau step of `gpuhost guest up` when nouveau holds the GPU, and the reboot that follows.

A guest without an NVIDIA GPU (the lab's) never binds nouveau, so the lab test covers only the
"not loaded" answer (tests/lab/test_guest_lifecycle.py). Here a scripted guest plays the parts no
machine here can: nouveau loaded and unused, nouveau in use, and a guest that answers from its
old boot before it goes down. What the guest says is scripted; what gpuhost asks, writes and
decides is what is tested.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuhost.guest import nouveau
from gpuhost.transport import CommandResult, TransportError

Reply = CommandResult | TransportError


class ScriptedGuest:
    """Answers each command from `replies` (by its argv joined with spaces) and records it."""

    def __init__(self, replies: dict[str, Reply], boot_id: bytes = b"") -> None:
        self.replies = replies
        self.boot_id = boot_id
        self.commands: list[tuple[str, bytes]] = []
        self.closed = False

    @property
    def description(self) -> str:
        return "scripted guest"

    @property
    def round_trips(self) -> int:
        return len(self.commands)

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 120.0) -> CommandResult:
        command = " ".join(argv)
        self.commands.append((command, stdin))
        if command == f"cat {nouveau.BOOT_ID}":
            return CommandResult(0, self.boot_id + b"\n", b"")
        reply = self.replies.get(command, CommandResult(0, b"", b""))
        if isinstance(reply, TransportError):
            raise reply
        return reply

    def close(self) -> None:
        self.closed = True


def log(argv: list[str], result: CommandResult) -> None:
    pass


def ran(guest: ScriptedGuest) -> list[str]:
    return [command for command, _ in guest.commands]


LOADED = "test -d /sys/module/nouveau"
UNLOAD = "modprobe -r nouveau"


def test_a_guest_without_nouveau_is_left_alone() -> None:
    guest = ScriptedGuest({LOADED: CommandResult(1, b"", b"")})
    assert nouveau.release_nouveau(guest, log=log, timeout=60) is nouveau.Nouveau.NOT_LOADED
    assert ran(guest) == [LOADED]


def test_an_unused_nouveau_is_blacklisted_and_unloaded_without_a_reboot() -> None:
    guest = ScriptedGuest({})
    assert nouveau.release_nouveau(guest, log=log, timeout=60) is nouveau.Nouveau.UNLOADED
    commands = ran(guest)
    assert commands[0] == LOADED and commands[-1] == UNLOAD
    assert f"dd of={nouveau.BLACKLIST_FILE} status=none" in commands
    written = dict(guest.commands)[f"dd of={nouveau.BLACKLIST_FILE} status=none"].decode()
    assert "blacklist nouveau\n" in written and "options nouveau modeset=0\n" in written
    # The initramfs is rebuilt before the unload is tried: a reboot, now or later, must not bring nouveau back.
    assert commands.index(UNLOAD) > next(i for i, c in enumerate(commands) if "update-initramfs -u" in c)


def test_a_nouveau_in_use_asks_for_a_reboot() -> None:
    in_use = CommandResult(1, b"", b"modprobe: FATAL: Module nouveau is in use.\n")
    guest = ScriptedGuest({UNLOAD: in_use})
    assert nouveau.release_nouveau(guest, log=log, timeout=60) is nouveau.Nouveau.NEEDS_REBOOT
    assert f"dd of={nouveau.BLACKLIST_FILE} status=none" in ran(guest)


def test_a_failed_blacklist_write_stops_the_step() -> None:
    guest = ScriptedGuest({f"dd of={nouveau.BLACKLIST_FILE} status=none": CommandResult(1, b"", b"read-only\n")})
    with pytest.raises(Exception, match="read-only"):
        nouveau.release_nouveau(guest, log=log, timeout=60)
    assert UNLOAD not in ran(guest)


def test_the_reboot_waits_for_an_answer_from_a_new_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nouveau, "REBOOT_POLL_S", 0.0)
    dropped = TransportError("unreachable", "connection closed by the guest")
    before = ScriptedGuest({"systemctl reboot": dropped}, boot_id=b"old-boot")
    # The first answer after the reboot command comes from the old boot, still going down.
    answers = [ScriptedGuest({}, boot_id=b"old-boot"), ScriptedGuest({}, boot_id=b"new-boot")]
    connect: Callable[[], ScriptedGuest] = lambda: answers.pop(0)  # noqa: E731
    after = nouveau.reboot_guest(before, connect, log=log, timeout=60)
    assert after.boot_id == b"new-boot" and not after.closed
    assert before.closed and "systemctl reboot" in ran(before)
    assert answers == []


def test_a_guest_that_never_comes_back_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nouveau, "REBOOT_POLL_S", 0.0)
    before = ScriptedGuest({}, boot_id=b"old-boot")
    with pytest.raises(TimeoutError, match=r"did not come back from its reboot within 0\.2 s"):
        nouveau.reboot_guest(before, lambda: ScriptedGuest({}, boot_id=b"old-boot"), log=log, timeout=0.2)
