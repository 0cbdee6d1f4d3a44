"""The error of a guest lifecycle step: it names the step, the VM and the host."""

from __future__ import annotations

from gpuhost.errors import GpuhostError


class GuestStepError(GpuhostError):
    """A lifecycle step failed or ran past its timeout; `step` says which."""

    def __init__(self, step: str, vm: str, host: str, message: str) -> None:
        self.step = step
        super().__init__(f"guest {vm} on {host}: step '{step}' failed: {message}")
