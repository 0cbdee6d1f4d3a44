"""Issue 30: the four-H200 guest of tests/fixtures/h200x4-node, replayed with no GPU: the suite's NCCL
all_reduce and P2P copies against PyTorch's in the same run (twice), ten back-to-back `--all` runs
on the healthy node, one beside a matmul loop on GPU 2, and one against another as its baseline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, capture_json, capture_wall_times, replay_smoke_test

CAPTURE = FIXTURES / "h200x4-node"
HEALTHY = [f"all-{i}" for i in range(1, 11)]
PAIRS = [f"p2p {a}->{b}" for a in range(4) for b in range(4) if a != b]


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
    document = capture_json(CAPTURE, name)
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
    walls = capture_wall_times(CAPTURE)
    for name in HEALTHY:
        recorded = capture_json(CAPTURE, name)
        assert walls[name][0] == 0
        assert recorded["outcome"] == "PASS" and recorded["node"]["outcome"] == "PASS"
        assert [v["outcome"] for v in recorded["verdicts"]] == ["PASS"] * 4
        # The run's own clock agrees with the capture's wall time (which adds Python's start).
        assert recorded["seconds"] < walls[name][1] < recorded["seconds"] + 1.5
    # Cached build, every run: 33.5-35.9 s on four GPUs (issue 30's target is 20 s; not met).
    assert all(33 < walls[name][1] < 36 for name in HEALTHY)
    assert all(gpu["timings"]["build_cached"] for name in HEALTHY for gpu in capture_json(CAPTURE, name)["gpus"])


@pytest.mark.parametrize("name", HEALTHY)
def test_each_healthy_run_replays_to_pass(name: str, tmp_path: Path) -> None:
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4


def test_a_matmul_loop_on_gpu_2_makes_only_gpu_2_and_its_figures_not_representative(tmp_path: Path) -> None:
    assert (CAPTURE / "hammer-gpu2.txt").read_text() == "hammer started on 2\n"
    assert capture_wall_times(CAPTURE)["busy-gpu2"][0] == 2
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


# ------------------------------------------------------------------ one run as another's baseline
def _judged_values(name: str, capture: Path = CAPTURE) -> dict[tuple[int, str], float]:
    document = json.loads((capture / f"{name}.json").read_text())
    return {
        (gpu, m["metric"]): m["judged_value"]
        for gpu, run in enumerate(document["gpus"])
        for m in run["metrics"]
        if m["judged_value"]
    }


def _worst_healthy_ratio(metric: str, names: list[str], capture: Path = CAPTURE) -> float:
    """The lowest this-run/baseline-run ratio of one per-GPU figure over every ordered pair of
    `names` (the baseline over this run for a lower-is-better figure), as --baseline computes it."""
    values = {name: _judged_values(name, capture) for name in names}
    lower_is_better = metric.startswith("launch_")
    ratios = [
        (values[b][key] / values[a][key]) if lower_is_better else (values[a][key] / values[b][key])
        for a in names
        for b in names
        if a != b
        for key in values[a]
        if key[1] == metric and key in values[b]
    ]
    assert ratios
    return min(ratios)


def _worst_collective_ratio(size_bytes: int, names: list[str]) -> float:
    def points(name: str) -> dict[str, float]:
        return {
            f["metric"]: p["busbw_GBps"]
            for f in capture_json(CAPTURE, name)["node"]["figures"]
            if f["metric"].startswith("nccl_")
            for p in f["extra"]["points"]
            if p["bytes"] == size_bytes
        }

    seen = {name: points(name) for name in names}
    return min(seen[a][m] / seen[b][m] for a in names for b in names if a != b for m in seen[a])


def test_the_baseline_lines_sit_below_what_the_healthy_node_did_run_to_run() -> None:
    """The lines in gpuhost.bench.rules (RULES and NODE_RULES), against the spread of the 11 healthy runs:
    the default 95% (and 90% for the collectives) is tighter than each of these spreads."""
    from gpuhost.bench.rules import NCCL_SMALL_BYTES, node_rule, rule_for

    healthy = [*HEALTHY, "against-all-1"]
    worst = {metric: _worst_healthy_ratio(metric, healthy) for metric in ("cublas_bf16", "bidir_pinned")}
    worst["launch_queued"] = _worst_healthy_ratio("launch_queued", healthy)
    assert worst == {"cublas_bf16": pytest.approx(0.926, abs=5e-4), "bidir_pinned": pytest.approx(0.899, abs=5e-4),
                     "launch_queued": pytest.approx(0.671, abs=5e-4)}  # fmt: skip
    for metric in ("cublas_bf16", "cublas_fp16", "cublas_tf32", "bidir_pinned", "launch_queued"):
        rule = rule_for(metric)
        assert rule is not None
        assert _worst_healthy_ratio(metric, healthy) >= rule.baseline_pass > rule.baseline_fail
    # The four-H100 guest's three full runs (tests/fixtures/h100x4): FP16 at 0.907.
    h100 = FIXTURES / "h100x4"
    fp16 = rule_for("cublas_fp16")
    assert fp16 is not None
    assert 0.90 < _worst_healthy_ratio("cublas_fp16", ["all-1", "all-2", "all-3"], h100) < 0.95
    assert _worst_healthy_ratio("cublas_fp16", ["all-1", "all-2", "all-3"], h100) >= fp16.baseline_pass
    # FP32 without tensor cores holds within 0.5%: it keeps the default line.
    fp32 = rule_for("cublas_fp32")
    assert fp32 is not None and fp32.baseline_pass == 0.95
    assert _worst_healthy_ratio("cublas_fp32", healthy) > 0.99
    # The collectives: below 128 MiB their own line; from 128 MiB up the 0.90 one holds.
    small = min(_worst_collective_ratio(size << 20, healthy) for size in (8, 32))
    assert node_rule("nccl_small").baseline_pass <= small < node_rule("nccl").baseline_pass
    large = min(_worst_collective_ratio(size << 20, healthy) for size in (128, 512, 1024))
    assert large >= node_rule("nccl").baseline_pass
    assert NCCL_SMALL_BYTES == 128 << 20


@pytest.mark.parametrize("baseline", [*HEALTHY, "against-all-1"])
def test_every_healthy_run_passes_against_every_other_as_its_baseline(baseline: str) -> None:
    from gpuhost.bench import node
    from gpuhost.bench.suite import SmokeOptions

    for name in [*HEALTHY, "against-all-1"]:
        if name == baseline:
            continue
        outcome = node.replay_all(capture_json(CAPTURE, name), SmokeOptions(baseline=CAPTURE / f"{baseline}.json"))
        not_passed = [
            (o.run.device.index, m.metric, m.percent_of_baseline)
            for o in outcome.gpus
            for m in o.verdict.metrics
            if m.status.value not in ("PASS", "INFO")
        ] + [
            (c.metric, c.size_bytes, c.percent_of_baseline)
            for c in outcome.verdict.baseline
            if c.status.value != "PASS"
        ]
        assert outcome.outcome == "PASS", (name, not_passed)


def test_the_run_against_all_1_warned_on_the_machine_and_replays_to_pass(tmp_path: Path) -> None:
    """On the machine (95% for every figure, 90% for the collectives at every size) the healthy
    node WARNed against its own first run: GPU 0's back-to-back launch at 69%, reduce_scatter at
    8 MiB at 80%. Judged again with the lines the captured spread gave, PASS."""
    recorded = capture_json(CAPTURE, "against-all-1")
    assert recorded["outcome"] == "WARN" and recorded["node"]["baseline"]["file"] == "/tmp/x4-node/all-1.json"
    warned = [
        (gpu, m["metric"], round(m["percent_of_baseline"]))
        for gpu, run in enumerate(recorded["gpus"])
        for m in run["metrics"]
        if m["status"] == "WARN"
    ]
    assert warned == [(0, "launch_queued", 69)]
    node_warned = [c for c in recorded["node"]["baseline"]["comparisons"] if c["status"] != "PASS"]
    assert [(c["metric"], c["size_bytes"], round(c["percent_of_baseline"])) for c in node_warned] == [
        ("nccl_reduce_scatter", 8 << 20, 80)
    ]
    code, again = replay_smoke_test(CAPTURE / "against-all-1.json", tmp_path, "--baseline", str(CAPTURE / "all-1.json"))
    assert code == 0 and again["outcome"] == "PASS" and again["node"]["outcome"] == "PASS"
    compared = {(c["metric"], c["size_bytes"]): c for c in again["node"]["baseline"]["comparisons"]}
    as_recorded = {
        (c["metric"], c["size_bytes"]): c["percent_of_baseline"] for c in recorded["node"]["baseline"]["comparisons"]
    }
    assert {key: c["percent_of_baseline"] for key, c in compared.items()} == as_recorded
    assert {c["status"] for c in compared.values()} == {"PASS"}


def test_a_gpu_shared_with_a_matmul_loop_still_falls_below_the_wider_gemm_line() -> None:
    """busy-gpu2 against all-1: GPU 2's tensor-core GEMMs, shared with the loop, FAIL against the
    baseline at 48-67%; the other GPUs PASS."""
    from gpuhost.bench import node
    from gpuhost.bench.suite import SmokeOptions

    outcome = node.replay_all(capture_json(CAPTURE, "busy-gpu2"), SmokeOptions(baseline=CAPTURE / "all-1.json"))
    statuses = {(o.run.device.index, m.metric): m for o in outcome.gpus for m in o.verdict.metrics}
    for metric in ("cublas_bf16", "cublas_fp16", "cublas_tf32"):
        shared = statuses[(2, metric)]
        assert shared.status.value == "FAIL" and shared.percent_of_baseline is not None
        assert shared.percent_of_baseline < 70
    assert [o.verdict.status.value for o in outcome.gpus if o.run.device.index != 2] == ["PASS"] * 3


def test_the_four_h100_runs_that_warned_on_cublas_pass_against_each_other(tmp_path: Path) -> None:
    """docs/smoke-test.md's finding: all-2 against all-1 of tests/fixtures/h100x4 WARNed cuBLAS
    BF16/FP16 at 91-95% on three GPUs. With the tensor-core line at 85%: PASS."""
    h100 = FIXTURES / "h100x4"
    code, again = replay_smoke_test(h100 / "all-2.json", tmp_path, "--baseline", str(h100 / "all-1.json"))
    assert code == 0 and again["outcome"] == "PASS"
    percents = [
        m["percent_of_baseline"]
        for run in again["gpus"]
        for m in run["metrics"]
        if m["metric"] in ("cublas_bf16", "cublas_fp16")
    ]
    assert 90 < min(percents) < 95
