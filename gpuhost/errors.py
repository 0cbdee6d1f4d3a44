"""Errors that carry the exit code the CLI should use.

Only the CLI prints them; library code raises and never exits.
"""

from __future__ import annotations

from pathlib import Path

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_UNUSABLE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT (128 + 2)

# An error message quoting a multi-megabyte bad value would bury the line that names the fix.
MESSAGE_LIMIT = 2000


class GpuhostError(Exception):
    """A failure the user can act on: the message names what is wrong and the fix."""

    exit_code: int = EXIT_UNUSABLE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(GpuhostError):
    """Bad input: an inventory value, a command-line argument, a snapshot directory."""


class MissingDependencyError(GpuhostError):
    """An optional package that this command needs is not installed."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package '{package}', which is not installed. "
            f"Install it with: pip install 'gpuhost[{extra}]'"
        )


class NoHostsSelected(InputError):
    """A host selection (--limit, --host) that selects nothing: an error before any connection, never
    "every host". `pattern` is what the user gave (None: no --limit, an inventory without hosts)."""

    def __init__(self, inventory: Path, pattern: str | None, reason: str) -> None:
        super().__init__(f"inventory {inventory}: {reason}")
        self.inventory = inventory
        self.pattern = pattern


def shortened(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` cut in the middle to about `limit` characters: the start names the host and value,
    the end the fix, and the gap says how much was left out. Every error message that reaches a
    user goes through it: the CLI's error line, and each host's error in audit, plan and snapshot."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 3 // 4], text[-limit // 4 :]
    return f"{head} ... ({len(text) - len(head) - len(tail)} characters left out) ... {tail}"
