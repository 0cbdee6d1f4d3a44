"""Issue 30: the four-H200 guest of tests/fixtures/h200x4-node, replayed with no GPU: the suite's NCCL
all_reduce and P2P copies against PyTorch's in the same run (twice), ten back-to-back `--all` runs
on the healthy node, one beside a matmul loop on GPU 2, and one against another as its baseline."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FIXTURES, replay_smoke_test

CAPTURE = FIXTURES / "h200x4-node"
HEALTHY = [f"all-{i}" for i in range(1, 11)]
PAIRS = [f"p2p {a}->{b}" for a in range(4) for b in range(4) if a != b]


def _load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((CAPTURE / f"{name}.json").read_text())
    return document


def _wall_times() -> dict[str, tuple[int, float]]:
    """wall-times.txt: each step's exit status and wall time, as the capture script wrote them."""
    rows = {}
    for line in (CAPTURE / "wall-times.txt").read_text().splitlines():
        found = re.fullmatch(r"(\S+) exit (\d+) wall ([\d.]+) s", line)
        assert found, line
        rows[found[1]] = (int(found[2]), float(found[3]))
    return rows


def test_the_capture_is_four_h200s_on_nvlink_with_the_software_it_names() -> None:
    assert (CAPTURE / "nvidia-smi-L.txt").read_text().count("NVIDIA H200 (UUID") == 4
    assert "Driver Version: 580.159.04" in (CAPTURE / "nvidia-smi.txt").read_text()
    assert "CUDA Version: 13.0" in (CAPTURE / "nvidia-smi.txt").read_text()
    topology = (CAPTURE / "topo.txt").read_text().splitlines()
    assert [line.split()[1:5].count("NV18") for line in topology if re.match(r"GPU\d\s", line)] == [3, 3, 3, 3]
    software = (CAPTURE / "software.txt").read_text()
    assert "libnccl2                         2.28.3-1+cuda13.0" in software
    assert "nccl (2, 28, 9)" in software


@pytest.mark.parametrize("name", ["node-vs-torch", "node-vs-torch-2"])
def test_the_suite_meets_torch_at_1_and_4_gib_and_beats_its_copy_on_every_pair(name: str) -> None:
    document = _load(name)
    rows = {row["what"]: row for row in document["rows"]}
    assert document["gpus"] == 4 and "nvidia/nccl" in document["nccl"]
    for size in (1, 4):
        row = rows[f"all_reduce busbw {size} GiB"]
        assert row["ratio"] == pytest.approx(row["suite"] / row["torch"])
        assert row["ratio"] >= 0.98  # issue 30's target, at both sizes
    assert rows["all_reduce busbw 4 GiB"]["suite"] > rows["all_reduce busbw 1 GiB"]["suite"]
    assert sorted(r for r in rows if r.startswith("p2p ")) == sorted(PAIRS)
    assert all(rows[pair]["ratio"] >= 1.0 for pair in PAIRS)  # every ordered pair, both runs
    # The host copies to and from every GPU at once: within 1% of PyTorch doing the same, or above.
    assert all(rows[f"{way}_all aggregate"]["ratio"] >= 0.99 for way in ("h2d", "d2h"))


def test_ten_back_to_back_runs_of_the_healthy_node_pass_as_recorded_with_their_wall_times() -> None:
    walls = _wall_times()
    for name in HEALTHY:
        recorded = _load(name)
        assert walls[name][0] == 0
        assert recorded["outcome"] == "PASS" and recorded["node"]["outcome"] == "PASS"
        assert [v["outcome"] for v in recorded["verdicts"]] == ["PASS"] * 4
        # The run's own clock agrees with the capture's wall time (which adds Python's start).
        assert recorded["seconds"] < walls[name][1] < recorded["seconds"] + 1.5
    # Cached build, every run: 33.5-35.9 s on four GPUs (issue 30's target is 20 s; not met).
    assert all(33 < walls[name][1] < 36 for name in HEALTHY)
    assert all(gpu["timings"]["build_cached"] for name in HEALTHY for gpu in _load(name)["gpus"])


@pytest.mark.parametrize("name", HEALTHY)
def test_each_healthy_run_replays_to_pass(name: str, tmp_path: Path) -> None:
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4


def test_a_matmul_loop_on_gpu_2_makes_only_gpu_2_and_its_figures_not_representative(tmp_path: Path) -> None:
    assert (CAPTURE / "hammer-gpu2.txt").read_text() == "hammer started on 2\n"
    assert _wall_times()["busy-gpu2"][0] == 2
    code, again = replay_smoke_test(CAPTURE / "busy-gpu2.json", tmp_path)
    assert code == 2 and again["outcome"] == "NOT REPRESENTATIVE"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS", "PASS", "NOT REPRESENTATIVE", "PASS"]
    busy = again["gpus"][2]["contention"]
    assert [(p["pid"], p["name"]) for p in busy["processes"]] == [(3308, "python3")]
    text = (CAPTURE / "busy-gpu2.txt").read_text()
    assert "another process used the GPU around the run: pid 3308 python3" in text
    assert "VERDICT GPU 2: NOT REPRESENTATIVE (another process used GPU 2; FAIL as measured)" in text
    node = again["node"]
    assert node["outcome"] == "NOT REPRESENTATIVE"
    for figure in node["figures"]:
        if 2 in figure["gpus"]:
            assert figure["status"] == "INFO" and "not judged: GPU(s) 2 busy" in figure["reason"]
        else:  # the pairs among GPUs 0, 1 and 3 are still judged
            assert figure["status"] == "PASS"
    judged = {f["metric"] for f in node["figures"] if f["status"] == "PASS"}
    assert judged == {f"p2p_pair_{a}_to_{b}" for a in (0, 1, 3) for b in (0, 1, 3) if a != b} | {
        "p2p_bidir_0_1",
        "p2p_bidir_0_3",
        "p2p_bidir_1_3",
    }
