"""Issue 30 on two H200s with today's --all, replayed: `tests/fixtures/h200x2-wall/` (its README
says how it was recorded). Nothing here needs a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.bench import node
from gpuhost.bench.runner import SmokeOptions
from tests.helpers import FIXTURES, capture_json, capture_wall_times, replay_smoke_test

CAPTURE = FIXTURES / "h200x2-wall"
HEALTHY = [f"all-{i}" for i in range(1, 11)]


@pytest.mark.parametrize("name", HEALTHY)
def test_each_of_ten_back_to_back_runs_passes_as_recorded_and_on_replay(name: str, tmp_path: Path) -> None:
    recorded = capture_json(CAPTURE, name)
    assert recorded["outcome"] == "PASS" and [v["outcome"] for v in recorded["verdicts"]] == ["PASS", "PASS"]
    assert capture_wall_times(CAPTURE)[name][0] == 0
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS" and again["node"]["outcome"] == "PASS"
    for gpu in again["gpus"]:  # P2P is the node's: no GPU ran the per-GPU p2p, none misses it
        assert "p2p" not in [b["name"] for b in gpu["suite"]["benchmarks"]]
        assert not [c for c in gpu["checks"] if c["check"].startswith("metric ")]


def test_the_node_judges_both_p2p_directions_and_every_collective() -> None:
    for name in HEALTHY:
        figures = {f["label"]: f for f in capture_json(CAPTURE, name)["node"]["figures"]}
        for label in ("P2P GPU 0 -> GPU 1", "P2P GPU 1 -> GPU 0", "P2P GPU 0 <-> GPU 1, both at once"):
            assert figures[label]["status"] == "PASS" and 85 <= figures[label]["percent_of_reference"] <= 90
        for collective in ("all_reduce", "all_gather", "reduce_scatter"):
            assert figures[f"NCCL {collective} bus bandwidth"]["status"] == "PASS"


def test_the_matmul_loop_on_gpu_1_makes_only_gpu_1_and_the_node_not_representative() -> None:
    assert capture_wall_times(CAPTURE)["busy-gpu1"][0] == 2
    outcome = node.replay_all(capture_json(CAPTURE, "busy-gpu1"), SmokeOptions())
    assert [o.verdict.outcome for o in outcome.gpus] == ["PASS", "NOT REPRESENTATIVE"]
    assert outcome.gpus[1].contention is not None
    assert "python3" in " ".join(outcome.gpus[1].verdict.reasons)
