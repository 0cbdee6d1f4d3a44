"""Issue 30, --all's wall time: tests/fixtures/h200x4-node/wall replayed with no GPU. Three runs with
the GPUs one after another (main) and three with their local benchmarks at once, alternating in one
call on four H200s, and one of the latter beside a matmul loop on GPU 2."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from gpuhost.bench.suite import LINK_BENCHMARKS
from tests.helpers import FIXTURES, capture_json, capture_wall_times, replay_smoke_test

CAPTURE = FIXTURES / "h200x4-node" / "wall"
RUNS = [f"{code}-{i}" for code in ("old", "new") for i in (1, 2, 3)]


@pytest.mark.parametrize("name", RUNS)
def test_every_run_of_either_schedule_passes_on_replay(name: str, tmp_path: Path) -> None:
    assert capture_wall_times(CAPTURE)[name][0] == 0
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4
    # The same document either way: every GPU's suite ran every benchmark, in the suite's order.
    for gpu in again["gpus"]:
        assert [b["name"] for b in gpu["suite"]["benchmarks"]] == [
            "memory", "roofline", "reduction", "sgemm", "cublas", "softmax", "transfer", "launch", "p2p"
        ]  # fmt: skip


def test_the_new_schedule_is_faster_in_every_run_and_says_so_in_its_timings() -> None:
    walls = capture_wall_times(CAPTURE)
    assert max(walls[f"new-{i}"][1] for i in (1, 2, 3)) < min(walls[f"old-{i}"][1] for i in (1, 2, 3))
    for i in (1, 2, 3):
        old, new = capture_json(CAPTURE, f"old-{i}"), capture_json(CAPTURE, f"new-{i}")
        # Old: the GPUs' runs add up to the run less the node; new: they overlap, so they add up to more.
        gpus_old = sum(g["timings"]["total_s"] for g in old["gpus"])
        gpus_new = sum(g["timings"]["total_s"] for g in new["gpus"])
        assert gpus_old < old["seconds"] - old["node"]["record"]["seconds"]
        assert gpus_new > new["seconds"] - new["node"]["record"]["seconds"]


def _local_figures(code: str) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    for i in (1, 2, 3):
        for gpu in capture_json(CAPTURE, f"{code}-{i}")["gpus"]:
            for result in gpu["suite"]["results"]:
                if result["benchmark"] not in LINK_BENCHMARKS and result["value"] is not None:
                    figures.setdefault(result["name"], []).append(result["value"])
    return figures


def test_the_local_figures_measured_beside_the_other_gpus_agree_with_those_measured_alone() -> None:
    old, new = _local_figures("old"), _local_figures("new")
    assert old.keys() == new.keys() and len(old) == 15
    for name, values in old.items():
        spread = (max(values) - min(values)) / statistics.median(values)
        moved = abs(statistics.median(new[name]) / statistics.median(values) - 1)
        assert moved <= max(spread, 0.001), name


def test_a_matmul_loop_on_gpu_2_makes_only_gpu_2_and_the_figures_with_it_not_representative(tmp_path: Path) -> None:
    assert capture_wall_times(CAPTURE)["busy-gpu2-new"][0] == 2
    code, again = replay_smoke_test(CAPTURE / "busy-gpu2-new.json", tmp_path)
    assert code == 2 and again["outcome"] == "NOT REPRESENTATIVE"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS", "PASS", "NOT REPRESENTATIVE", "PASS"]
    # The other GPUs' suite processes ran beside each GPU's: none of them is contention.
    assert [[(p["gpu"], p["pid"], p["name"]) for p in g["contention"]["processes"]] for g in again["gpus"]] == [
        [],
        [],
        [(2, 2167, "python3")],
        [],
    ]
    for figure in again["node"]["figures"]:
        assert figure["status"] == ("INFO" if 2 in figure["gpus"] else "PASS"), figure["metric"]
    assert (
        "VERDICT GPU 2: NOT REPRESENTATIVE (another process used GPU 2; FAIL as measured)"
        in (CAPTURE / "busy-gpu2-new.txt").read_text()
    )
