"""Issue 30: `smoke-test --all --baseline FILE`, a node run against an earlier node run of the same GPUs.
Every case replays real captures (tests/fixtures/h100x4, tests/fixtures/h200x2-node): one run of a
node is the baseline of another run of that node. Nothing here needs a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from tests.helpers import FIXTURES, replay_smoke_test

H100X4 = FIXTURES / "h100x4"
H200X2 = FIXTURES / "h200x2-node"
FULL_SIZES = [8 << 20, 32 << 20, 128 << 20, 512 << 20, 1 << 30]
QUICK_SIZES = [8 << 20, 64 << 20, 1 << 30]


def _compared(document: dict) -> dict[tuple[str, int | None], dict]:
    baseline = document["node"]["baseline"]
    return {(c["metric"], c["size_bytes"]): c for c in baseline["comparisons"]}


def test_two_healthy_runs_of_the_two_gpu_node_compare_figure_by_figure_and_size_by_size(tmp_path: Path) -> None:
    code, again = replay_smoke_test(H200X2 / "all-3.json", tmp_path, "--baseline", str(H200X2 / "all-2.json"))
    assert code == 0 and again["node"]["outcome"] == "PASS"
    assert again["node"]["baseline"]["file"] == str(H200X2 / "all-2.json")
    compared = _compared(again)
    for op in ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter"):
        assert sorted(size for metric, size in compared if metric == op) == FULL_SIZES
    for key in [("p2p_pair_0_to_1", None), ("p2p_pair_1_to_0", None), ("h2d_all", None), ("d2h_all", None)]:
        assert compared[key]["status"] == "PASS"
    assert {c["status"] for c in compared.values()} == {"PASS"}
    # all-3's reduce_scatter at 1 GiB against all-2's: 269.1 against 276.2 GB/s.
    one_gib = compared[("nccl_reduce_scatter", 1 << 30)]
    assert one_gib["value"] == pytest.approx(269.1, abs=0.1) and one_gib["baseline"] == pytest.approx(276.2, abs=0.1)
    assert 97 < one_gib["percent_of_baseline"] < 98
    # Each GPU against its own run in the baseline, as the one-GPU comparison does it.
    for gpu in again["gpus"]:
        copy = next(m for m in gpu["metrics"] if m["metric"] == "copy")
        assert 99 < copy["percent_of_baseline"] < 101


def test_a_quick_run_against_a_full_baseline_compares_the_sizes_both_measured(tmp_path: Path) -> None:
    code, again = replay_smoke_test(H100X4 / "quick-1.json", tmp_path, "--baseline", str(H100X4 / "all-1.json"))
    assert code == 0 and again["outcome"] == "PASS"
    compared = _compared(again)
    assert sorted(size for metric, size in compared if metric == "nccl_all_reduce") == QUICK_SIZES
    assert compared[("nccl_all_reduce", 64 << 20)]["status"] == "INFO"
    assert "did not measure" in compared[("nccl_all_reduce", 64 << 20)]["reason"]
    assert compared[("nccl_all_reduce", 1 << 30)]["status"] == "PASS"
    assert len([key for key in compared if key[0].startswith("p2p_pair_")]) == 12
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4


def test_a_pair_through_the_host_falls_far_below_the_baseline_and_the_other_pairs_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code, again = replay_smoke_test(
        H100X4 / "fault-no-peer-0-1.json", tmp_path, "--baseline", str(H100X4 / "all-1.json")
    )
    out = capsys.readouterr().out
    assert code == 1 and again["node"]["outcome"] == "FAIL"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4  # every GPU's own run is kept
    compared = _compared(again)
    for pair in ("p2p_pair_0_to_1", "p2p_pair_1_to_0", "p2p_bidir_0_1"):
        assert compared[(pair, None)]["status"] == "FAIL" and compared[(pair, None)]["percent_of_baseline"] < 10
    pairs_through_host = {"p2p_pair_0_to_1", "p2p_pair_1_to_0"}
    others = [
        c for (metric, _), c in compared.items() if metric.startswith("p2p_pair_") and metric not in pairs_through_host
    ]
    assert len(others) == 10 and all(c["status"] == "PASS" for c in others)
    below = [f for f in again["node"]["findings"] if f["code"] == "smoke.node.baseline.below"]
    assert {f["check"] for f in below} >= {
        "P2P GPU 0 -> GPU 1 against the baseline",
        "P2P GPU 1 -> GPU 0 against the baseline",
    }
    assert "Against the baseline" in out and "7%" in out


def test_figures_that_involve_a_busy_gpu_are_not_judged_against_the_baseline_either(tmp_path: Path) -> None:
    code, again = replay_smoke_test(H100X4 / "busy-gpu2.json", tmp_path, "--baseline", str(H100X4 / "all-1.json"))
    assert code == 2 and again["node"]["outcome"] == "NOT REPRESENTATIVE"
    compared = _compared(again)
    with_gpu2 = [c for c in compared.values() if 2 in c["gpus"]]
    assert with_gpu2 and all(c["status"] == "INFO" and "busy" in c["reason"] for c in with_gpu2)
    assert compared[("p2p_pair_0_to_1", None)]["status"] == "PASS"
    assert not [f for f in again["node"]["findings"] if f["code"] == "smoke.node.baseline.below"]


def test_prometheus_carries_the_node_and_every_gpus_ratio_to_the_baseline(tmp_path: Path) -> None:
    prom = tmp_path / "node.prom"
    replay_smoke_test(
        H200X2 / "all-2.json", tmp_path, "--baseline", str(H200X2 / "all-1.json"), "--prometheus", str(prom)
    )
    text = prom.read_text()
    assert 'gpuhost_smoke_node_baseline_ratio{metric="nccl_all_reduce",size_bytes="1073741824"}' in text
    assert 'gpuhost_smoke_node_baseline_ratio{metric="p2p_pair_0_to_1",size_bytes=""}' in text
    assert 'gpuhost_smoke_node_baseline_status{metric="h2d_all",size_bytes="",status="PASS"} 1.0' in text
    assert text.count('gpuhost_smoke_baseline_ratio{gpu="') > 2 * 20  # both GPUs, each of their figures


def test_without_a_baseline_the_node_document_says_none(tmp_path: Path) -> None:
    code, again = replay_smoke_test(H200X2 / "all-1.json", tmp_path)
    assert code == 0 and again["node"]["baseline"] is None
    assert all(m["baseline"] is None for gpu in again["gpus"] for m in gpu["metrics"])


@pytest.mark.parametrize(
    ("baseline", "said"),
    [
        (
            H200X2 / "all-1.json",
            "was recorded on 2 GPU(s) (2 x 10de:2335), this node has 4 (4 x 10de:2330): a node is compared only "
            "with a run of the same GPUs",
        ),
        (
            FIXTURES / "h100x2-node" / "all-1.json",
            "was recorded on 2 GPU(s) (2 x 10de:2330), this node has 4 (4 x 10de:2330)",
        ),
        # One GPU's run (the two-H100 guest's `--device 0 --json`), given to --all.
        (FIXTURES / "h100x2" / "full-gpu0-1.json", "is one GPU's run"),
    ],
    ids=["other-count-and-model", "other-count", "one-gpu-run"],
)
def test_a_baseline_of_other_gpus_or_of_one_gpu_is_an_input_error_naming_the_file_and_the_fix(
    baseline: Path, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never.json"
    code = main(["smoke-test", "--replay", str(H100X4 / "all-1.json"), "--baseline", str(baseline), "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert f"the baseline {baseline}" in err and said in err
    assert "smoke-test --all --json" in err


def test_a_baseline_of_another_model_with_as_many_gpus_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = FIXTURES / "h100x2-node" / "all-1.json"  # two H100s, for the two-H200 guest
    code = main(["smoke-test", "--replay", str(H200X2 / "all-1.json"), "--baseline", str(baseline)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"the baseline {baseline} was recorded on 2 GPU(s) (2 x 10de:2330), this node has 2 (2 x 10de:2335)" in err


def test_a_baseline_missing_a_gpus_run_is_said_on_that_gpu(tmp_path: Path) -> None:
    document = json.loads((H200X2 / "all-1.json").read_text())
    document["gpus"] = [g for g in document["gpus"] if g["suite"]["device"]["index"] != 1]
    partial = tmp_path / "gpu1-stopped.json"
    partial.write_text(json.dumps(document))
    code, again = replay_smoke_test(H200X2 / "all-2.json", tmp_path, "--baseline", str(partial))
    assert code == 0  # a WARN
    gpu1 = again["gpus"][1]
    missing = [c for c in gpu1["checks"] if c["code"] == "smoke.baseline.missing-gpu"]
    assert missing and "holds no finished run of GPU 1" in missing[0]["detail"]
    assert gpu1["outcome"] == "WARN" and all(m["baseline"] is None for m in gpu1["metrics"])


def test_a_node_run_given_to_one_gpus_baseline_is_an_input_error_naming_the_file_and_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The other way round: the two-H100 node's --all run as the baseline of one GPU's run of a two-H100 guest."""
    baseline = FIXTURES / "h100x2-node" / "all-1.json"
    code = main(["smoke-test", "--replay", str(FIXTURES / "h100x2" / "full-gpu0-1.json"), "--baseline", str(baseline)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"the baseline {baseline} is a whole node's run (smoke-test --all --json)" in err
    assert "`--all --baseline FILE`" in err
