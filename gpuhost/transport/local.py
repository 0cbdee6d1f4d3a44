"""Run commands on this machine: the audit's 'same code with the root /'."""

from __future__ import annotations

import subprocess

from gpuhost.transport import CommandResult, TransportError


class LocalTransport:
    description = "local"

    def __init__(self) -> None:
        self._round_trips = 0

    @property
    def round_trips(self) -> int:
        return self._round_trips

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 120.0) -> CommandResult:
        self._round_trips += 1
        try:
            completed = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as error:
            raise TransportError("timeout", f"{' '.join(argv)} did not finish within {timeout:g} s") from error
        except OSError as error:
            raise TransportError("command", f"cannot run {argv[0]}: {error.strerror}") from error
        return CommandResult(completed.returncode, completed.stdout, completed.stderr)

    def close(self) -> None:
        pass
