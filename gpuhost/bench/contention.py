"""Other processes on the GPU before, during and after the run, read through NVML.

A bf16 matmul loop beside the suite took BF16 GEMM to 27% and launch + synchronize to 2455 us on
the H100 guest, and the report blamed the GPU. NVML lists the processes holding a
context on each GPU (compute and graphics); any process other than gpuhost and its suite makes
the run "not representative": the figures measure a shared GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpuhost.bench.rules import CheckOutcome, Status, found, passed
from gpuhost.problems import Stage, register

ProcessKind = Literal["compute", "graphics"]
Phase = Literal["before", "during", "after"]


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    name: str  # the executable NVML names ('?' when it cannot)
    used_memory_bytes: int | None  # None when NVML cannot say (e.g. without permission)
    kind: ProcessKind
    seen: tuple[Phase, ...]  # when it was on the GPU

    def describe(self) -> str:
        memory = "memory unknown" if self.used_memory_bytes is None else f"{self.used_memory_bytes / 2**30:.2f} GiB"
        return f"pid {self.pid} {self.name} ({self.kind}, {memory}; seen {', '.join(self.seen)})"


@dataclass(frozen=True)
class Contention:
    """What else used the GPUs around the run."""

    processes: tuple[GpuProcess, ...]
    utilization_before_pct: tuple[int | None, ...]  # per GPU index, just before the suite started
    readable: bool  # False when NVML could not list processes (then contention is unknown)

    @property
    def busy(self) -> bool:
        return bool(self.processes)


def own_process(pid: int, proc: Path = Path("/proc")) -> bool:
    """This gpuhost process or one it started (the suite binary): not contention."""
    me = os.getpid()
    if pid == me:
        return True
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    # Field 4 of /proc/PID/stat is the parent pid; the name (field 2) is in parentheses and may
    # hold spaces, so split after its closing one.
    fields = stat[stat.rfind(")") + 2 :].split()
    return len(fields) > 1 and fields[1] == str(me)


def _name(nvml: Any, pid: int) -> str:
    try:
        name = nvml.nvmlSystemGetProcessName(pid)
    except nvml.NVMLError:  # the process ended, or no permission: its name stays unknown
        return "?"
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def read_processes(
    nvml: Any, handle: Any, gpu: int, phase: Phase, is_own: Callable[[int], bool] = own_process
) -> tuple[GpuProcess, ...]:
    """The compute and graphics processes on one GPU other than our own. NVML errors propagate:
    the caller decides that contention is then unknown."""
    found = []
    readers: tuple[tuple[ProcessKind, str], ...] = (
        ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    )
    for kind, reader in readers:
        for info in getattr(nvml, reader)(handle):
            pid = int(info.pid)
            if is_own(pid):
                continue
            memory = getattr(info, "usedGpuMemory", None)
            found.append(
                GpuProcess(gpu, pid, _name(nvml, pid), None if memory is None else int(memory), kind, (phase,))
            )
    return tuple(found)


def merge(processes: Iterable[GpuProcess]) -> tuple[GpuProcess, ...]:
    """One entry per (GPU, pid, kind), with every phase it was seen in and its largest memory."""
    merged: dict[tuple[int, int, str], GpuProcess] = {}
    for process in processes:
        key = (process.gpu, process.pid, process.kind)
        known = merged.get(key)
        if known is None:
            merged[key] = process
            continue
        memories = [m for m in (known.used_memory_bytes, process.used_memory_bytes) if m is not None]
        seen = tuple(phase for phase in ("before", "during", "after") if phase in (*known.seen, *process.seen))
        merged[key] = GpuProcess(
            known.gpu, known.pid, known.name, max(memories) if memories else None, known.kind, seen
        )
    return tuple(sorted(merged.values(), key=lambda p: (p.gpu, p.pid, p.kind)))


CONTENTION = register(
    "smoke.contention",
    Stage.SMOKE_TEST,
    None,
    "another process used the GPU (warning; the run is not representative) or the processes are unreadable (info)",
)


def judge_contention(contention: Contention | None) -> list[CheckOutcome]:
    """Other processes on the GPUs around the run (none: a run recorded before contention was read)."""
    if contention is None:
        return []
    if contention.busy:
        by_gpu: dict[int, list[str]] = {}
        for process in contention.processes:
            by_gpu.setdefault(process.gpu, []).append(process.describe())
        return [
            found(
                CONTENTION,
                Status.WARN,
                "contention",
                f"another process used the GPU around the run: {'; '.join(described)}. The figures measure a "
                "shared GPU, not its capability: stop it and run again (or pass --allow-busy to judge them anyway)",
                gpu,
                "stop the other process and run again (or pass --allow-busy)",
            )
            for gpu, described in sorted(by_gpu.items())
        ]
    if not contention.readable:
        return [
            found(
                CONTENTION,
                Status.INFO,
                "contention",
                "NVML could not list the processes on the GPU: another process there would go unnoticed",
            )
        ]
    utilization = ", ".join(
        f"GPU {index} {'?' if pct is None else pct}%" for index, pct in enumerate(contention.utilization_before_pct)
    )
    return [
        passed(
            "contention",
            f"no other process on the GPU before, during or after the run (utilization before it: {utilization})",
        )
    ]
