"""Errors of the lab: each message names what is wrong and what to do about it."""

from __future__ import annotations

from gpuhost.errors import GpuhostError


class LabError(GpuhostError):
    """The lab cannot do what was asked (missing tool, no root, no port, no memory, VM failure)."""


class ToolMissingError(LabError):
    """A program the lab runs is not installed; the message names the Debian package."""

    def __init__(self, program: str, package: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs '{program}', which is not installed. Install it with: sudo apt-get install {package}"
        )
