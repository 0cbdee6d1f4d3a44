"""The one layer that reaches hosts: run a command there, feed it stdin, get its output back.

Local runs a subprocess; SSH (paramiko, imported only by ssh.py) runs it over one channel.
A snapshot needs no transport: it is read from disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: bytes
    stderr: bytes


class TransportError(Exception):
    """The host could not be reached or refused us. `kind` says which, for reports and tests."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # unreachable, auth, host-key-unknown, host-key-changed, timeout, command


class Transport(Protocol):
    @property
    def description(self) -> str:
        """'local' or 'ssh://user@host:port', for reports."""
        ...

    @property
    def round_trips(self) -> int:
        """Commands run so far: each costs one network round trip (or more) on SSH."""
        ...

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 120.0) -> CommandResult: ...

    def close(self) -> None: ...
