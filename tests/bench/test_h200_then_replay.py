"""Issue 30's --then on one H200, replayed: `tests/fixtures/h200-then/` (its README says how it was
recorded). Nothing here needs a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FIXTURES, capture_json, capture_wall_times, replay_smoke_test

CAPTURE = FIXTURES / "h200-then"
RUNS = [f"{code}-all-{i}" for i in (1, 2, 3) for code in ("main", "gate")]


@pytest.mark.parametrize("name", RUNS)
def test_every_all_run_of_either_tree_passes_on_replay_without_a_per_gpu_p2p(name: str, tmp_path: Path) -> None:
    assert capture_wall_times(CAPTURE)[name][0] == 0
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS" and [v["outcome"] for v in again["verdicts"]] == ["PASS"]
    (gpu,) = again["gpus"]
    assert [b["name"] for b in gpu["suite"]["benchmarks"]] == [
        "memory", "roofline", "reduction", "sgemm", "cublas", "softmax", "transfer", "launch"
    ]  # fmt: skip
    # No "expected but not measured" row for P2P: in a node run the node's matrix judges it.
    assert not [c for c in gpu["checks"] if c["check"].startswith("metric ")], gpu["checks"]


def test_one_process_a_gpu_was_the_faster_in_each_pair_of_runs() -> None:
    walls = capture_wall_times(CAPTURE)
    for i in (1, 2, 3):
        assert walls[f"gate-all-{i}"][1] < walls[f"main-all-{i}"][1]
        gate, main = capture_json(CAPTURE, f"gate-all-{i}"), capture_json(CAPTURE, f"main-all-{i}")
        assert gate["seconds"] < main["seconds"]
