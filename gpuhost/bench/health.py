"""GPU health the way DCGM reports it: NVRM Xid events in the kernel log during the run, NVML's Xid
event set during `smoke-test --all` (XidWatch), and PCIe replay counter growth (NVML) across it.

The driver logs each Xid as `NVRM: Xid (PCI:0000:cb:00): 13, pid=..., name=..., <detail>`
(older drivers: `NVRM: Xid (0000:01:00): 3, ...`). Meanings and what to check follow NVIDIA's Xid
catalog (docs.nvidia.com/deploy/xid-errors).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuhost.bench.rules import CheckOutcome, Status, found, passed
from gpuhost.problems import Severity, Stage, register

XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<address>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\): (?P<code>\d+),\s*(?P<detail>.*)"
)


@dataclass(frozen=True)
class XidMeaning:
    name: str
    status: Status  # FAIL: the GPU or its link is faulty or must be reset; WARN: usually the application
    check: str


XID_MEANINGS: dict[int, XidMeaning] = {
    13: XidMeaning(
        "graphics engine exception",
        Status.WARN,
        "usually an application's illegal instruction or address; if it repeats across applications, run "
        "`dcgmi diag -r 3`",
    ),
    31: XidMeaning(
        "GPU memory page fault (MMU fault)",
        Status.WARN,
        "usually an application's illegal memory access; repeated on this GPU only: run `dcgmi diag -r 3`",
    ),
    43: XidMeaning(
        "GPU stopped processing (a channel was reset)",
        Status.WARN,
        "the application faulted and its work was stopped; the GPU itself can carry on",
    ),
    48: XidMeaning(
        "double-bit ECC error",
        Status.FAIL,
        "uncorrectable memory error: reset the GPU (from the host) so the row is remapped; if it recurs, RMA",
    ),
    63: XidMeaning(
        "ECC page retirement or row remapping recorded",
        Status.WARN,
        "a memory row was marked for remapping: reset the GPU to apply it",
    ),
    64: XidMeaning(
        "ECC page retirement or row remapping failed",
        Status.FAIL,
        "the GPU could not remap a failing row: it needs service (RMA)",
    ),
    74: XidMeaning(
        "NVLink error",
        Status.FAIL,
        "check the NVLink bridges or the baseboard, reset the GPUs; if it persists, service",
    ),
    79: XidMeaning(
        "GPU has fallen off the bus",
        Status.FAIL,
        "the PCIe link was lost: check the slot, riser and power, the host's AER messages (`dmesg` on the "
        "host); reset or reboot the host",
    ),
    92: XidMeaning(
        "high single-bit ECC error rate",
        Status.WARN,
        "memory corrects errors at a high rate: watch remapped rows, run `dcgmi diag -r 3`",
    ),
    94: XidMeaning(
        "contained ECC error",
        Status.FAIL,
        "an uncorrectable error was contained to one application: reset the GPU when it is idle to remap the row",
    ),
    95: XidMeaning(
        "uncontained ECC error",
        Status.FAIL,
        "an uncorrectable error reached every application on the GPU: reset the GPU now; if it recurs, RMA",
    ),
}
UNKNOWN_XID = XidMeaning(
    "an Xid this gpuhost does not name",
    Status.WARN,
    "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)",
)


@dataclass(frozen=True)
class XidEvent:
    address: str  # PCI domain:bus:device as the driver logs it, e.g. 0000:cb:00
    code: int
    detail: str

    @property
    def meaning(self) -> XidMeaning:
        return XID_MEANINGS.get(self.code, UNKNOWN_XID)


@dataclass(frozen=True)
class Health:
    """Kernel-log Xid events that appeared during the run, and PCIe replay counters around it."""

    xid_events: tuple[XidEvent, ...]
    kernel_log_readable: bool
    pcie_replays_before: tuple[int | None, ...]  # per GPU index
    pcie_replays_after: tuple[int | None, ...]


@dataclass(frozen=True)
class GpuXid:
    """An Xid that NVML's event set reported on one GPU during `smoke-test --all`: the GPU by its NVML
    index, the Xid, and the phase of the run it came in ("GPU 2's run", "the node measurements")."""

    gpu: int
    code: int
    phase: str

    @property
    def meaning(self) -> XidMeaning:
        return XID_MEANINGS.get(self.code, UNKNOWN_XID)

    def describe(self) -> str:
        return f"NVML reported Xid {self.code} ({self.meaning.name}) on GPU {self.gpu} during {self.phase}"


class XidWatch:
    """NVML's event set for Xids (nvmlEventTypeXidCriticalError, what DCGM watches) over every GPU, open
    for a whole `--all` run: drained without waiting after each phase and while the node measurements
    run, so an Xid is named on the GPU it hit whatever was running, also where the kernel log cannot be
    read. The H100 guest's NVML registers it (tests/fixtures/h100x2-node/nvml-events.txt). Where NVML
    cannot, `unwatched` says why and nothing is drained."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self._events: Any = None
        # --all runs the GPUs' own benchmarks at once: each GPU's stop check drains from its thread.
        self._lock = threading.Lock()
        self.seen: list[GpuXid] = []
        self.unwatched: str | None = None
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if kind is None or not hasattr(nvml, "nvmlEventSetCreate"):
            self.unwatched = "this nvidia-ml-py has no NVML event sets"
            return
        try:
            self._events = nvml.nvmlEventSetCreate()
            for index in range(count):
                nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(index), kind, self._events)
        except nvml.NVMLError as error:
            self.unwatched = f"NVML could not register for Xid events: {error}"
            self.close()

    def drain(self, phase: str | Callable[[int], str]) -> tuple[GpuXid, ...]:
        """The Xids reported since the last drain, attributed to `phase` (or to the phase of the GPU each
        hit, where the GPUs' runs overlap); never waits."""
        if self._events is None:
            return ()
        nvml = self._nvml
        found: list[GpuXid] = []
        with self._lock:
            while True:
                try:
                    event = nvml.nvmlEventSetWait_v2(self._events, 0)
                except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing (more) pending
                    break
                try:
                    gpu = int(nvml.nvmlDeviceGetIndex(event.device))
                except nvml.NVMLError:  # the GPU is gone (fell off the bus): NVML cannot name it
                    gpu = -1
                found.append(GpuXid(gpu, int(event.eventData), phase if isinstance(phase, str) else phase(gpu)))
            self.seen.extend(found)
        return tuple(found)

    def since(self, start: int) -> tuple[GpuXid, ...]:
        """Every Xid drained so far from the `start`-th on, whichever thread drained it."""
        with self._lock:
            return tuple(self.seen[start:])

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(self._nvml.NVMLError):  # freeing is best effort: the run is over
                self._nvml.nvmlEventSetFree(self._events)
            self._events = None


def parse_xid_lines(text: str) -> tuple[XidEvent, ...]:
    events = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if match:
            events.append(XidEvent(match["address"].lower(), int(match["code"]), match["detail"].strip()))
    return tuple(events)


def lines_since(before: str, after: str) -> str:
    """The kernel-log lines in `after` that came after the last line of `before` (the ring buffer
    may have dropped old lines in between, so match on that last line, not on a count)."""
    previous = before.rstrip("\n").splitlines()
    current = after.splitlines()
    if not previous:
        return after
    last = previous[-1]
    for index in range(len(current) - 1, -1, -1):
        if current[index] == last:
            return "\n".join(current[index + 1 :])
    return after


def read_kernel_log() -> str | None:
    """The kernel ring buffer through dmesg; None when it cannot be read (no permission, no dmesg)."""
    try:
        completed = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return completed.stdout if completed.returncode == 0 else None


XID_UNREADABLE = register(
    "smoke.xid.unreadable", Stage.SMOKE_TEST, Severity.INFO, "the kernel log is unreadable: Xid events go unseen"
)
XID_EVENT = register(
    "smoke.xid.event", Stage.SMOKE_TEST, None, "an NVRM Xid event during the run (severity from the Xid catalog)"
)
PCIE_REPLAYS = register(
    "smoke.pcie-replays", Stage.SMOKE_TEST, Severity.WARNING, "the PCIe replay counter grew during the run"
)


def same_pci_device(logged_address: str, pci_bus_id: str) -> bool:
    """The kernel log's `0000:cb:00` (domain:bus:device) and NVML's `00000000:CB:00.0` name one device."""
    logged = logged_address.lower().split(":")
    nvml = pci_bus_id.lower().split(":")
    if len(logged) != 3 or len(nvml) != 3:
        return False
    try:
        return (int(logged[0], 16), logged[1], logged[2]) == (int(nvml[0], 16), nvml[1], nvml[2].split(".")[0])
    except ValueError:
        return False


def judge_gpu_xids(xids: tuple[GpuXid, ...], health: Health | None, pci_bus_id: str) -> list[CheckOutcome]:
    """One row per Xid NVML reported on this GPU during `--all`, its status from the Xid catalog; an
    Xid the kernel log of this GPU's own run already shows (same code, same PCI address) is not
    counted twice."""
    logged = {
        event.code
        for event in (health.xid_events if health is not None else ())
        if same_pci_device(event.address, pci_bus_id)
    }
    return [
        found(
            XID_EVENT,
            xid.meaning.status,
            f"xid {xid.code}",
            f"{xid.describe()}. Check: {xid.meaning.check}",
            xid.gpu,
            xid.meaning.check,
        )
        for xid in xids
        if xid.code not in logged
    ]


def judge_health(health: Health | None) -> list[CheckOutcome]:
    """One row per Xid event during the run, one per GPU whose replay counter grew."""
    if health is None:
        return []
    outcomes = []
    if not health.kernel_log_readable:
        outcomes.append(
            found(
                XID_UNREADABLE,
                Status.INFO,
                "xid",
                "the kernel log could not be read (dmesg): Xid events would go unseen",
                remedy="run the smoke-test as a user who may read the kernel log (dmesg)",
            )
        )
    elif not health.xid_events:
        outcomes.append(passed("xid", "no NVRM Xid event in the kernel log during the run"))
    for event in health.xid_events:
        meaning = event.meaning
        outcomes.append(
            found(
                XID_EVENT,
                meaning.status,
                f"xid {event.code}",
                f"NVRM Xid {event.code} ({meaning.name}) on PCI {event.address} during the run: {event.detail}. "
                f"Check: {meaning.check}",
                remedy=meaning.check,
            )
        )
    for index, (before, after) in enumerate(zip(health.pcie_replays_before, health.pcie_replays_after, strict=False)):
        if before is None or after is None:
            continue
        if after > before:
            outcomes.append(
                found(
                    PCIE_REPLAYS,
                    Status.WARN,
                    "pcie replays",
                    f"the PCIe replay counter grew by {after - before} during the run ({before} -> {after}): the "
                    "link retransmitted packets (signal integrity). Reseat the GPU or riser, check the slot and "
                    "cables; growing replays often precede Xid 79",
                    index,
                    "reseat the GPU or riser; check the slot and cables",
                )
            )
        else:
            outcomes.append(passed("pcie replays", f"replay counter steady at {after}", index))
    return outcomes
