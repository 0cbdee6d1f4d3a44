"""Issue 30: the four-GPU guest, replayed. `tests/fixtures/h100x4/` is what `capture.sh` recorded on a
guest with four H100 SXM GPUs, every pair on NV18: `smoke-test --all` run after run, beside a matmul
loop on one GPU, with faults (a pair without peer access, NCCL that cannot initialise, no NCCL), and
the suite against PyTorch on the same machine. Nothing here needs a GPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuhost.bench.environment import NvlinkReading
from gpuhost.bench.models import load_model_table
from gpuhost.bench.node_json import read_record
from gpuhost.bench.node_judge import HOST_SLOW_GPU, NCCL_SLOW, NODE_BENCHMARK_FAILED, NVLINK_LINKS, judge_node
from gpuhost.bench.rules import Status
from gpuhost.cli.main import main
from tests.helpers import FIXTURES, replay_smoke_test

CAPTURE = FIXTURES / "h100x4"
HEALTHY = [CAPTURE / f"all-{i}.json" for i in (1, 2, 3)] + [CAPTURE / f"quick-{i}.json" for i in range(1, 11)]


def _record_of(name: str):
    return read_record(json.loads((CAPTURE / name).read_text())["node"]["record"])


H100 = load_model_table().lookup(0x2330)


@pytest.mark.parametrize("path", HEALTHY, ids=lambda path: path.stem)
def test_every_back_to_back_run_replays_to_pass_for_each_gpu_and_the_node(path: Path, tmp_path: Path) -> None:
    recorded = json.loads(path.read_text())
    assert recorded["outcome"] == "PASS" and recorded["node"]["outcome"] == "PASS"
    code, again = replay_smoke_test(path, tmp_path)
    assert code == 0 and again["outcome"] == "PASS"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4
    assert again["node"]["outcome"] == "PASS"


def test_the_full_matrix_collectives_and_links_of_a_healthy_run() -> None:
    record = _record_of("all-1.json")
    verdict = judge_node(record, [H100] * 4)
    figures = {f.metric: f for f in verdict.figures}
    pairs = [f"p2p_pair_{a}_to_{b}" for a in range(4) for b in range(4) if a != b]
    assert all(figures[p].status is Status.PASS and figures[p].reference_kind == "nvlink" for p in pairs)
    assert all(390 <= (figures[p].value or 0) <= 400 for p in pairs)  # 88% of 450 GB/s, every pair
    assert len([m for m in figures if m.startswith("p2p_bidir_")]) == 6
    sizes = [p["bytes"] for p in figures["nccl_all_reduce"].extra["points"]]
    assert sizes[0] == 8 << 20 and sizes[-1] == 1 << 30
    for collective in ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter"):
        assert figures[collective].status is Status.PASS and figures[collective].reference == 450
    assert 340 <= (figures["nccl_all_reduce"].value or 0) <= 370
    assert [(r.active, r.queried) for r in record.nvlinks] == [(18, 18)] * 4
    assert record.nccl_topology is not None and "<system" in record.nccl_topology  # what NCCL saw


def test_a_busy_gpu_is_named_and_only_its_figures_left_unjudged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bf16 matmul loop on GPU 2: that GPU and the node NOT REPRESENTATIVE (exit 2), naming the
    process; GPUs 0, 1 and 3 PASS; the node's figures that involve GPU 2 reported, not judged."""
    path = CAPTURE / "busy-gpu2.json"
    capsys.readouterr()
    code, again = replay_smoke_test(path, tmp_path)
    assert code == 2 and again["outcome"] == "NOT REPRESENTATIVE"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS", "PASS", "NOT REPRESENTATIVE", "PASS"]
    out = capsys.readouterr().out
    assert "VERDICT GPU 2 (0000:00:08.0): NOT REPRESENTATIVE (another process used GPU 2" in out
    assert "contention, GPU 2    pid 3361 python3" in out
    figures = {f["metric"]: f for f in again["node"]["figures"]}
    assert figures["p2p_pair_0_to_1"]["status"] == "PASS"
    assert figures["p2p_pair_0_to_2"]["status"] == "INFO" and "GPU(s) 2 busy" in figures["p2p_pair_0_to_2"]["reason"]
    assert figures["nccl_all_reduce"]["status"] == "INFO"


def test_a_pair_without_peer_access_is_named_and_the_others_kept(tmp_path: Path) -> None:
    code, again = replay_smoke_test(CAPTURE / "fault-no-peer-0-1.json", tmp_path)
    assert code == 1 and again["outcome"] == "FAIL"
    assert [v["outcome"] for v in again["verdicts"]] == ["PASS"] * 4
    findings = {(f["code"], f["check"]) for f in again["node"]["findings"] if f["code"]}
    assert ("smoke.node.p2p.no-access", "P2P GPU 0 -> GPU 1") in findings
    assert ("smoke.node.p2p.no-access", "P2P GPU 1 -> GPU 0") in findings
    assert ("smoke.node.p2p.below-median", "P2P GPU 0 -> GPU 1") in findings
    assert ("smoke.node.p2p.slow", "P2P all to all") in findings
    figures = {f["metric"]: f for f in again["node"]["figures"]}
    assert figures["p2p_pair_2_to_3"]["status"] == "PASS" and figures["nccl_all_reduce"]["status"] == "PASS"


def test_nccl_that_cannot_initialise_is_a_finding_with_the_rest_kept(tmp_path: Path) -> None:
    code, again = replay_smoke_test(CAPTURE / "fault-nccl-init.json", tmp_path)
    assert code == 1 and again["node"]["outcome"] == "FAIL"
    (nccl,) = [f for f in again["node"]["findings"] if f["code"] == "smoke.node.nccl.failed"]
    assert "ncclCommInitAll failed" in nccl["detail"]
    figures = {f["metric"]: f for f in again["node"]["figures"]}
    assert figures["p2p_all_to_all"]["status"] == "PASS" and "nccl_all_reduce" not in figures


def test_without_nccl_the_node_says_so_and_is_never_pass(tmp_path: Path) -> None:
    code, again = replay_smoke_test(CAPTURE / "fault-no-nccl.json", tmp_path)
    assert code == 0 and again["node"]["outcome"] == "WARN" and again["outcome"] == "WARN"
    assert [f["code"] for f in again["node"]["findings"] if f["code"]] == ["smoke.node.nccl.missing"]


def test_the_collectives_are_judged_against_the_table(tmp_path: Path) -> None:
    """The same healthy run with a table that doubles NVLink's bandwidth: the collectives (354 of 900
    GB/s) and the P2P pairs are below their link now."""
    table = json.loads((Path(__file__).parents[2] / "gpuhost" / "data" / "gpu_models.json").read_text())
    for model in table["models"]:
        if model["pci_device_ids"] == ["2330"]:
            model["nvlink_GBps"] = 900
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    code, again = replay_smoke_test(CAPTURE / "all-1.json", tmp_path, "--gpu-table", str(path))
    assert code == 0 and again["node"]["outcome"] == "WARN"
    assert {f["code"] for f in again["node"]["findings"] if f["check"].startswith("NCCL")} == {NCCL_SLOW}


def test_missing_links_a_slow_host_share_and_a_failed_node_run_are_findings() -> None:
    """Faults not caused on the machine, made from the healthy record: NVML reporting 12 of 18 links on
    GPU 3, GPU 1's share of the host copies halved, the node run stopped (a hang)."""
    record = _record_of("all-1.json")
    links = tuple(NvlinkReading(r.gpu, 12 if r.gpu == 3 else r.active, r.queried) for r in record.nvlinks)
    suite = json.loads(json.dumps(record.suite))
    for result in suite["results"]:
        if result["name"] == "h2d_all":
            result["extra"]["per_gpu"][1]["GBps"] /= 2
    verdict = judge_node(dataclasses.replace(record, nvlinks=links, suite=suite), [H100] * 4)
    codes = {(p.code, p.subject) for p in verdict.problems}
    assert (NVLINK_LINKS, "NVLink links, GPU 3") in codes
    assert (HOST_SLOW_GPU, "host -> every GPU at once, GPU 1") in codes
    assert verdict.status is Status.FAIL
    stopped = judge_node(dataclasses.replace(record, suite=None, suite_error="did not finish within 300 s"), [H100] * 4)
    assert NODE_BENCHMARK_FAILED in {p.code for p in stopped.problems} and stopped.status is Status.FAIL
    # The collectives of that run stand.
    assert {f.metric for f in stopped.figures} == {"nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter"}


def test_the_suite_meets_pytorch_on_the_same_machine() -> None:
    """all_reduce busbw >= 0.98x torch.distributed's at 1 GiB (same NCCL); each of the 12 pairs >= 1.00x."""
    rows = json.loads((CAPTURE / "node-vs-torch.json").read_text())["rows"]
    assert rows[0]["what"] == "all_reduce busbw 1 GiB" and rows[0]["ratio"] >= 0.98
    pairs = [row for row in rows if row["what"].startswith("p2p ")]
    assert len(pairs) == 12 and all(row["ratio"] >= 1.0 for row in pairs)


def test_prometheus_of_a_node_run_has_every_gpu_and_the_node(tmp_path: Path) -> None:
    prom = tmp_path / "node.prom"
    assert main(["smoke-test", "--replay", str(CAPTURE / "all-1.json"), "--prometheus", str(prom)]) == 0
    text = prom.read_text()
    assert text.count("gpuhost_smoke_verdict{gpu=") == 16  # four GPUs x four states
    assert 'gpuhost_smoke_node_verdict{status="PASS"} 1.0' in text
    every = ",".join(f"0000:00:0{6 + i}.0" for i in range(4))
    assert f'gpuhost_smoke_node_bandwidth_bytes_per_second{{gpus="{every}",metric="nccl_all_reduce"}}' in text
    # A pair's series names both GPUs by PCI address, source first; each GPU's, its index beside it.
    pair = 'gpuhost_smoke_node_bandwidth_bytes_per_second{gpus="0000:00:08.0,0000:00:06.0",metric="p2p_pair_2_to_0"}'
    assert pair in text
    assert 'gpuhost_smoke_up{gpu="0000:00:08.0",index="2",model="NVIDIA H100 80GB HBM3"} 1.0' in text


def test_a_gpu_whose_run_stops_is_a_finding_and_the_others_are_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPU 1 falls off the bus (its run stops: CUDA cannot use it), a fault not caused on the machine:
    GPUs 0, 2 and 3 keep their verdicts from the healthy record, the node its measurements, and
    GPU 1 is a FAIL with the reason, in the report, the JSON and its replay."""
    from gpuhost.bench import node
    from gpuhost.bench.environment import GpuUnavailable
    from gpuhost.bench.suite import SmokeOptions

    healthy = node.replay_all(json.loads((CAPTURE / "quick-1.json").read_text()), SmokeOptions())
    by_gpu = {o.run.device.index: o for o in healthy.gpus}

    def one_gpu(options: SmokeOptions, stop: object = None, schedule: object = None) -> object:
        if int(options.device) == 1:
            raise GpuUnavailable("the kernel suite could not use the GPU: cudaErrorDevicesUnavailable")
        return by_gpu[int(options.device)]

    class Nvml:
        def nvmlShutdown(self) -> None:
            pass

    monkeypatch.setattr(node, "load_pynvml", Nvml)
    monkeypatch.setattr(node, "open_nvml", lambda nvml: 4)
    monkeypatch.setattr(node, "read_environment", lambda nvml, count: healthy.gpus[0].environment)
    monkeypatch.setattr(node, "smoke_test", one_gpu)
    monkeypatch.setattr(node, "measure_node", lambda options, environment, judged, watch: healthy.record)
    capsys.readouterr()
    out_json = tmp_path / "all.json"
    assert main(["smoke-test", "--all", "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert "VERDICT GPU 1 (0000:00:07.0): FAIL (cannot run: the kernel suite could not use the GPU" in out
    assert (
        "VERDICT GPU 0 (0000:00:06.0): PASS" in out
        and "VERDICT GPU 3 (0000:00:09.0): PASS" in out
        and "VERDICT node: PASS" in out
    )
    document = json.loads(out_json.read_text())
    assert [(v["gpu"], v["outcome"]) for v in document["verdicts"]] == [
        (0, "PASS"),
        (1, "cannot run"),
        (2, "PASS"),
        (3, "PASS"),
    ]
    code, again = replay_smoke_test(out_json, tmp_path)
    assert code == 1 and again["outcome"] == "FAIL" and again["stopped"][0]["gpu"] == 1
