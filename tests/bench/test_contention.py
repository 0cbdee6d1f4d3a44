"""Another process on the GPU: named, and the run 'not representative' (issue 14).

The process list is what NVML answered on the H100 guest while a bf16 matmul loop ran beside the
suite (tests/fixtures/h100-smoke/issue14/nvml-busy.json, read with pynvml there).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpuhost.bench.contention import Contention, GpuProcess, judge_contention, merge, own_process, read_processes
from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.models import load_model_table
from gpuhost.bench.rules import Status
from gpuhost.bench.verdict import NOT_REPRESENTATIVE, judge
from tests.helpers import FIXTURES

ISSUE14 = FIXTURES / "h100-smoke" / "issue14"
BUSY = json.loads((ISSUE14 / "nvml-busy.json").read_text())


class FakeNvmlError(Exception):
    pass


def nvml_as_recorded(suite_pid: int | None = None) -> Any:
    """pynvml's answers on the busy H100 guest, plus our own suite when `suite_pid` is given."""
    compute = [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_gpu_memory"]) for p in BUSY["compute"]]
    if suite_pid is not None:
        compute.append(SimpleNamespace(pid=suite_pid, usedGpuMemory=600 << 20))
    names = {p["pid"]: p["name"] for p in BUSY["compute"]}

    def name(pid: int) -> str:
        if pid not in names:
            raise FakeNvmlError("not found")
        return names[pid]

    return SimpleNamespace(
        NVMLError=FakeNvmlError,
        nvmlDeviceGetComputeRunningProcesses=lambda handle: compute,
        nvmlDeviceGetGraphicsRunningProcesses=lambda handle: [],
        nvmlSystemGetProcessName=name,
    )


def test_the_other_process_is_read_with_pid_name_and_memory_and_our_suite_is_not() -> None:
    processes = read_processes(nvml_as_recorded(suite_pid=4242), None, 0, "during", is_own=lambda pid: pid == 4242)
    assert processes == (GpuProcess(0, 1018, "python3", 1184890880, "compute", ("during",)),)
    assert processes[0].describe() == "pid 1018 python3 (compute, 1.10 GiB; seen during)"


def test_own_process_knows_this_process_and_its_children(tmp_path: Path) -> None:
    import os

    assert own_process(os.getpid())
    child = tmp_path / "777"
    child.mkdir()
    (child / "stat").write_text(f"777 (gpuhost kernels) S {os.getpid()} 777 1 0 -1\n")
    stranger = tmp_path / "778"
    stranger.mkdir()
    (stranger / "stat").write_text("778 (python3) S 1 778 1 0 -1\n")
    assert own_process(777, proc=tmp_path)
    assert not own_process(778, proc=tmp_path)
    assert not own_process(779, proc=tmp_path)  # gone already


def test_phases_merge_into_one_entry_per_process() -> None:
    seen = [
        GpuProcess(0, 1018, "python3", 1 << 30, "compute", ("before",)),
        GpuProcess(0, 1018, "python3", 1184890880, "compute", ("during",)),
        GpuProcess(0, 1018, "python3", None, "compute", ("after",)),
    ]
    assert merge(seen) == (GpuProcess(0, 1018, "python3", 1184890880, "compute", ("before", "during", "after")),)


def busy_run() -> Any:
    return read_recorded(json.loads((ISSUE14 / "busy-quick.json").read_text()))


def test_a_busy_gpu_makes_the_run_not_representative_and_names_the_process() -> None:
    contention = Contention(
        merge(read_processes(nvml_as_recorded(), None, 0, "during", is_own=lambda pid: False)), (99,), True
    )
    verdict = judge(busy_run().run, model=load_model_table().lookup(0x2330), contention=contention)
    assert not verdict.representative and verdict.outcome == NOT_REPRESENTATIVE
    # The results are still there, as measured (BF16 GEMM at 26%).
    assert {m.metric: m.status for m in verdict.metrics}["cublas_bf16"] is Status.FAIL
    assert (
        "WARN contention (GPU 0): another process used the GPU around the run: pid 1018 python3 (compute, 1.10 GiB; "
        "seen during). The figures measure a shared GPU" in "\n".join(verdict.reasons)
    )


def test_an_idle_gpu_is_said_to_be_alone_and_unreadable_lists_are_not_taken_for_idle() -> None:
    (alone,) = judge_contention(Contention((), (0,), True))
    assert alone.status is Status.PASS and "no other process" in alone.detail and "GPU 0 0%" in alone.detail
    (unknown,) = judge_contention(Contention((), (None,), False))
    assert unknown.status is Status.INFO and "could not list" in unknown.detail
    assert judge_contention(None) == []
    verdict = judge(busy_run().run, model=None, contention=Contention((), (0,), True))
    assert verdict.representative and verdict.outcome == verdict.status.value
