"""A render conflict: a `Problem` of the render stage."""

from __future__ import annotations

from gpuhost.problems import Problem, Severity


def render_conflict(code: str, subject: str, message: str, remedy: str = "") -> Problem:
    """One reason the VM cannot be rendered; the message and remedy read as one sentence when joined."""
    return Problem(code, Severity.ERROR, subject, message, remedy)
