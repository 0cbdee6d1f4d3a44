"""smoke-test --all's schedule (issue 30, the wall time): every GPU's local benchmarks at once, then
each GPU's host copies alone; the halves make the document one suite run makes, less its P2P (the node's
matrix measures every pair).
The suite is stood in for by the halves of a real run (tests/fixtures/h200x4-node/wall/old-1.json)."""

from __future__ import annotations

import itertools
import json
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhost.bench import node, runner, suite
from gpuhost.bench.environment import GpuUnavailable
from gpuhost.bench.health import XidWatch
from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.results import parse_suite_document
from gpuhost.bench.runner import NodeSchedule
from gpuhost.bench.suite import SmokeOptions, SuiteCrashed, combined_documents, split_benchmarks
from gpuhost.bench.verdict import judge
from tests.bench.stand_in_kernels import stand_in_target
from tests.bench.test_node_xid import InjectingNvml
from tests.helpers import FIXTURES

WALL = FIXTURES / "h200x4-node" / "wall"


def _whole_run() -> dict[str, Any]:
    """A whole --all run of the old schedule (every GPU's suite in one process)."""
    document: dict[str, Any] = json.loads((WALL / "old-1.json").read_text())
    return document


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
    assert set(local) | set(link) == set(suite.SUITE_BENCHMARKS) and not set(local) & set(link)


def test_the_two_halves_make_the_document_of_one_run() -> None:
    whole = _one_run(0)
    local, link = split_benchmarks(SmokeOptions())
    combined = combined_documents(_half(whole, local), _half(whole, link))
    assert [r["name"] for r in combined["results"]] == [r["name"] for r in whole["results"]]
    assert combined["results"] == whole["results"]
    assert [b["name"] for b in combined["benchmarks"]] == [b["name"] for b in whole["benchmarks"]]
    assert combined["device"] == whole["device"] and combined["seed"] == whole["seed"]
    assert combined["elapsed_s"] == pytest.approx(sum(b["seconds"] for b in whole["benchmarks"]))


STAND_IN = Path(__file__).resolve().parent / "stand_in_kernels.py"


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tests/bench/stand_in_kernels.py as the suite binary: a real process speaking --then on its pipes."""
    binary = tmp_path / "gpuhost-kernels"
    binary.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(STAND_IN))} "$@"\n')
    binary.chmod(0o755)
    log = tmp_path / "suite.log"
    log.touch()
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    return binary


def _sets(binary: Path) -> dict[tuple[int, str], tuple[float, float]]:
    """Each (GPU, set) the stand-in ran: its start and end."""
    times: dict[tuple[int, str], dict[str, float]] = {}
    for line in (binary.parent / "suite.log").read_text().splitlines():
        device, which, edge, at = line.split()
        times.setdefault((int(device), which), {})[edge] = float(at)
    return {key: (edges["start"], edges["end"]) for key, edges in times.items()}


def _run_gpus(binary: Path, gpus: int, monkeypatch: pytest.MonkeyPatch) -> dict[int, Any]:
    monkeypatch.setenv("STAND_IN_GPUS", str(gpus))
    environment = read_recorded(_whole_run()["gpus"][0]).environment
    schedule = NodeSchedule(range(gpus))
    documents: dict[int, Any] = {}

    def one(gpu: int) -> None:
        try:
            target = stand_in_target(gpu, environment.gpus[gpu].pci_bus_id)
            documents[gpu] = runner._scheduled(binary, SmokeOptions(), target, environment, None, None, schedule)
        except (GpuUnavailable, SuiteCrashed) as error:
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


def test_every_gpus_local_benchmarks_run_at_once_and_each_gpus_host_copies_alone_after_them_in_the_same_process(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = _run_gpus(stand_in, 4, monkeypatch)
    sets = _sets(stand_in)
    local = [times for (gpu, which), times in sets.items() if which == "first"]
    link = sorted((times for (gpu, which), times in sets.items() if which == "then"), key=lambda t: t[0])
    assert sorted(gpu for gpu, which in sets if which == "then") == [0, 1, 2, 3]
    # The local sets overlapped (the stand-in waits for all four to start); no link set overlaps any other set.
    assert max(start for start, _ in local) < min(end for _, end in local)
    assert link[0][0] >= max(end for _, end in local)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(link))
    # Each GPU's document is its one run's but for P2P: every other result, in the suite's order.
    for gpu in range(4):
        assert documents[gpu]["results"] == [r for r in _one_run(gpu)["results"] if r["benchmark"] != "p2p"]


def test_a_gpu_whose_suite_cannot_use_it_holds_no_other_gpus_link_turn_back(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_FAIL", "1:local")
    documents = _run_gpus(stand_in, 4, monkeypatch)
    assert isinstance(documents[1], GpuUnavailable) and "stand-in" in str(documents[1])
    assert sorted(gpu for gpu, which in _sets(stand_in) if which == "then") == [0, 2, 3]


def test_an_xid_another_gpus_check_drained_still_stops_the_gpu_it_hit_and_is_named_on_it() -> None:
    nvml = InjectingNvml()
    watch = XidWatch(nvml, 4)
    stops = {gpu: node.fatal_xid(watch, node.gpu_phase, (gpu,)) for gpu in range(4)}
    nvml.inject(2, 79)
    assert stops[0]() is None  # GPU 0's check drains it: not its GPU
    assert stops[2]() == "NVML reported Xid 79 (GPU has fallen off the bus) on GPU 2 during GPU 2's run"
    assert stops[1]() is None and stops[3]() is None
    assert [(x.gpu, x.code, x.phase) for x in watch.seen] == [(2, 79, "GPU 2's run")]


def test_a_suite_crash_in_the_link_half_is_that_gpus_crash_and_the_others_finish(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_FAIL", "0:then")
    documents = _run_gpus(stand_in, 2, monkeypatch)
    assert isinstance(documents[0], SuiteCrashed) and "status 139" in str(documents[0]), documents[0]
    assert documents[1]["results"] == [r for r in _one_run(1)["results"] if r["benchmark"] != "p2p"]


def test_a_stop_while_the_second_set_runs_ends_the_suite_with_the_reason(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fatal Xid on this GPU while its host copies run stops its suite within about STOP_POLL_S."""
    monkeypatch.setenv("STAND_IN_GPUS", "1")
    monkeypatch.setenv("STAND_IN_THEN_SECONDS", "30")
    reason: list[str] = []
    local = SmokeOptions(benchmarks=("memory",))
    target = stand_in_target(0, "0000:00:06.0")
    with suite.SuiteInTwo(stand_in, local, target, ("transfer",), lambda: reason[0] if reason else None) as running:
        assert {r["benchmark"] for r in running.first()["results"]} == {"memory"}
        reason.append("NVML reported Xid 79 (GPU has fallen off the bus) on GPU 0")
        started = time.monotonic()
        with pytest.raises(SuiteCrashed, match=r"the kernel suite was stopped: NVML reported Xid 79"):
            running.second()
        assert time.monotonic() - started < 10
    assert "0 then start" in (stand_in.parent / "suite.log").read_text()
    assert "0 then end" not in (stand_in.parent / "suite.log").read_text()


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
