"""smoke-test --all's schedule (issue 30, the wall time): every GPU's local benchmarks at once, then
each GPU's host copies alone; the halves make the document one suite run makes, less its P2P (the node's
matrix measures every pair).
The suite is stood in for by the halves of a real run (tests/fixtures/h200x4-node/wall/old-1.json)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest

from gpuhost.bench import node, runner
from gpuhost.bench.environment import GpuUnavailable
from gpuhost.bench.health import XidWatch
from gpuhost.bench.results import parse_suite_document
from gpuhost.bench.runner import (
    LINK_BENCHMARKS,
    NodeSchedule,
    SmokeOptions,
    SuiteCrashed,
    combined_documents,
    split_benchmarks,
)
from gpuhost.bench.verdict import judge
from tests.bench.test_node_xid import InjectingNvml
from tests.helpers import FIXTURES

WALL = FIXTURES / "h200x4-node" / "wall"


def _one_run(gpu: int) -> dict[str, Any]:
    """GPU `gpu`'s suite document from a run of the old schedule (the whole suite in one process)."""
    document = json.loads((WALL / "old-1.json").read_text())
    suite: dict[str, Any] = next(g["suite"] for g in document["gpus"] if g["suite"]["device"]["index"] == gpu)
    return suite


def _half(document: dict[str, Any], benchmarks: tuple[str, ...]) -> dict[str, Any]:
    """What the suite prints for `--bench` of these benchmarks: the same run, those results only."""
    return {
        **document,
        "benchmarks": [b for b in document["benchmarks"] if b["name"] in benchmarks],
        "results": [r for r in document["results"] if r["benchmark"] in benchmarks],
        "errors": [],
        "elapsed_s": sum(b["seconds"] for b in document["benchmarks"] if b["name"] in benchmarks),
    }


def test_the_host_copies_and_p2p_are_the_link_benchmarks_and_the_rest_local() -> None:
    local, link = split_benchmarks(SmokeOptions())
    assert local == ("memory", "roofline", "reduction", "sgemm", "cublas", "softmax", "launch")
    assert link == ("transfer", "p2p")
    assert split_benchmarks(SmokeOptions(quick=True)) == (("memory", "cublas", "launch"), ("transfer", "p2p"))
    assert split_benchmarks(SmokeOptions(benchmarks=("p2p", "sgemm"))) == (("sgemm",), ("p2p",))
    assert split_benchmarks(SmokeOptions(benchmarks=("memory",))) == (("memory",), ())
    # Every benchmark the suite runs on one GPU is on exactly one side.
    assert set(local) | set(link) == set(runner.SUITE_BENCHMARKS) and not set(local) & set(link)


def test_the_two_halves_make_the_document_of_one_run() -> None:
    whole = _one_run(0)
    local, link = split_benchmarks(SmokeOptions())
    combined = combined_documents(_half(whole, local), _half(whole, link))
    assert [r["name"] for r in combined["results"]] == [r["name"] for r in whole["results"]]
    assert combined["results"] == whole["results"]
    assert [b["name"] for b in combined["benchmarks"]] == [b["name"] for b in whole["benchmarks"]]
    assert combined["device"] == whole["device"] and combined["seed"] == whole["seed"]
    assert combined["elapsed_s"] == pytest.approx(sum(b["seconds"] for b in whole["benchmarks"]))


class RecordingSuite:
    """run_suite_explained standing in for the suite: each call's GPU, benchmarks and interval.
    Local calls meet at a barrier: were they run one after another, it would time out."""

    def __init__(self, gpus: int, fail_local: int | None = None) -> None:
        self.calls: list[tuple[int, tuple[str, ...], float, float]] = []
        self._lock = threading.Lock()
        self._together = threading.Barrier(gpus - (fail_local is not None), timeout=10)
        self.fail_local = fail_local

    def __call__(
        self, binary: object, options: SmokeOptions, environment: object, stop: object = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        local = not set(options.benchmarks) & LINK_BENCHMARKS
        if local and options.device == self.fail_local:
            raise GpuUnavailable("the kernel suite could not use the GPU")
        if local:
            self._together.wait()
        time.sleep(0.05)
        with self._lock:
            self.calls.append((options.device, options.benchmarks, started, time.monotonic()))
        return _half(_one_run(options.device), options.benchmarks)


def _run_gpus(monkeypatch: pytest.MonkeyPatch, suite: RecordingSuite, gpus: int) -> dict[int, Any]:
    monkeypatch.setattr(runner, "run_suite_explained", suite)
    schedule = NodeSchedule(range(gpus))
    documents: dict[int, Any] = {}

    def one(gpu: int) -> None:
        try:
            documents[gpu] = runner._scheduled(None, SmokeOptions(device=gpu), None, None, None, schedule)  # type: ignore[arg-type]
        except GpuUnavailable as error:
            documents[gpu] = error
        finally:
            schedule.local_done(gpu)

    threads = [threading.Thread(target=one, args=(gpu,)) for gpu in range(gpus)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return documents


def test_every_gpus_local_benchmarks_run_at_once_and_each_gpus_link_ones_alone_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    suite = RecordingSuite(4)
    documents = _run_gpus(monkeypatch, suite, 4)
    local = [c for c in suite.calls if not set(c[1]) & LINK_BENCHMARKS]
    link = [c for c in suite.calls if set(c[1]) & LINK_BENCHMARKS]
    assert sorted(c[0] for c in local) == [0, 1, 2, 3] and all("transfer" not in c[1] for c in local)
    assert sorted(c[0] for c in link) == [0, 1, 2, 3] and all(c[1] == ("transfer",) for c in link)
    # The local runs overlapped (they met at the barrier); no link run overlaps any other run.
    assert max(c[2] for c in local) < min(c[3] for c in local)
    last_local = max(c[3] for c in local)
    ordered = sorted(link, key=lambda c: c[2])
    assert ordered[0][2] >= last_local
    assert all(a[3] <= b[2] for a, b in itertools.pairwise(ordered))
    # Each GPU's document is its one run's but for P2P: every other result, in the suite's order.
    for gpu in range(4):
        assert documents[gpu]["results"] == [r for r in _one_run(gpu)["results"] if r["benchmark"] != "p2p"]
        assert not any(r["benchmark"] == "p2p" for r in documents[gpu]["results"])


def test_a_gpu_whose_run_stops_holds_no_other_gpus_link_turn_back(monkeypatch: pytest.MonkeyPatch) -> None:
    suite = RecordingSuite(4, fail_local=1)
    documents = _run_gpus(monkeypatch, suite, 4)
    assert isinstance(documents[1], GpuUnavailable)
    assert sorted(c[0] for c in suite.calls if "transfer" in c[1]) == [0, 2, 3]


def test_an_xid_another_gpus_check_drained_still_stops_the_gpu_it_hit_and_is_named_on_it() -> None:
    nvml = InjectingNvml()
    watch = XidWatch(nvml, 4)
    stops = {gpu: node.fatal_xid(watch, node.gpu_phase, (gpu,)) for gpu in range(4)}
    nvml.inject(2, 79)
    assert stops[0]() is None  # GPU 0's check drains it: not its GPU
    assert stops[2]() == "NVML reported Xid 79 (GPU has fallen off the bus) on GPU 2 during GPU 2's run"
    assert stops[1]() is None and stops[3]() is None
    assert [(x.gpu, x.code, x.phase) for x in watch.seen] == [(2, 79, "GPU 2's run")]


def test_a_suite_crash_in_the_link_half_is_the_gpus_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def crashing(binary: object, options: SmokeOptions, environment: object, stop: object = None) -> dict[str, Any]:
        if "transfer" in options.benchmarks:
            raise SuiteCrashed("the kernel suite exited with status 139")
        return _half(_one_run(options.device), options.benchmarks)

    monkeypatch.setattr(runner, "run_suite_explained", crashing)
    schedule = NodeSchedule([0])
    with pytest.raises(SuiteCrashed):
        runner._scheduled(None, SmokeOptions(device=0), None, None, None, schedule)  # type: ignore[arg-type]


def test_a_gpus_own_verdict_in_a_node_run_expects_no_p2p_and_a_one_gpu_run_still_does() -> None:
    """Under --all the node's matrix judges P2P (peer access included): a GPU's verdict without its
    p2p results is complete; a one-GPU run without them still says what it did not measure."""
    document = _one_run(0)
    local, link = split_benchmarks(SmokeOptions())
    without_p2p = parse_suite_document(_half(document, (*local, *(b for b in link if b != "p2p"))))
    in_node = judge(without_p2p, model=None, in_node=True)
    alone = judge(without_p2p, model=None)
    assert not [c for c in in_node.checks if c.check.startswith("metric ")], in_node.checks
    assert [c.check for c in alone.checks if c.check.startswith("metric ")] == ["metric p2p_access"]
