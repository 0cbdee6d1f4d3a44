"""The timed steps of `gpuhost guest up`: each under its own timeout, reported as it goes, recorded with its time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuhost.guest.errors import GuestStepError

T = TypeVar("T")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StepTime:
    step: str
    seconds: float
    detail: str = ""


class Steps:
    """Runs each step on a worker thread so that a hung libvirt or SSH call still ends in a
    timeout error naming the step; records the time of each."""

    def __init__(self, vm: str, host: str, progress: Progress) -> None:
        self.vm, self.host, self.progress = vm, host, progress
        self.times: list[StepTime] = []
        self.created = False  # once something exists on the host, a failure says how to remove it

    def run(self, step: str, timeout: float, action: Callable[[], T], detail: Callable[[T], str] | None = None) -> T:
        self.progress(f"{step} ...")
        started = time.monotonic()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = action()
            except BaseException as error:  # handed to the caller's thread
                box["error"] = error

        worker = threading.Thread(target=work, name=f"gpuhost-guest-{step}", daemon=True)
        worker.start()
        # The action's own timeouts come first; this one is the backstop for calls that have none.
        worker.join(timeout + 30.0)
        seconds = time.monotonic() - started
        hint = (
            "\n(what was created stays for inspection, e.g. `gpuhost guest logs`; `gpuhost guest down` removes it)"
            if self.created
            else ""
        )
        if worker.is_alive():
            raise GuestStepError(step, self.vm, self.host, f"did not finish within {timeout:g} s{hint}")
        error = box.get("error")
        if error is not None:
            raise GuestStepError(step, self.vm, self.host, _describe(error) + hint) from error
        value: T = box["value"]
        text = detail(value) if detail is not None else ""
        self.times.append(StepTime(step, seconds, text))
        self.progress(f"{step}: {seconds:.1f} s{f' ({text})' if text else ''}")
        return value

    def skipped(self, step: str, why: str) -> None:
        self.times.append(StepTime(step, 0.0, f"skipped: {why}"))
        self.progress(f"{step}: skipped ({why})")


def _describe(error: BaseException) -> str:
    libvirt = _libvirt_or_none()
    if libvirt is not None and isinstance(error, libvirt.libvirtError):
        return f"libvirt: {error.get_error_message()}"
    if isinstance(error, TimeoutError):
        return str(error) or "timed out"
    return str(error) or type(error).__name__


def _libvirt_or_none() -> Any:
    try:
        import libvirt
    except ImportError:
        return None
    return libvirt
