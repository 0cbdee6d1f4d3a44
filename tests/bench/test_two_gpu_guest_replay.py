"""Issue 18: the two-GPU guest, replayed. `tests/fixtures/h100x2/` is what `capture.sh` recorded on
a guest with two H100 SXM GPUs joined by NVLink (NV18) and an NVSwitch fabric: three full runs and a
`--quick` run per GPU, gpuhost's audit inside the guest, and the suite's peer-to-peer copy against
PyTorch's between the same GPUs in the same run. Nothing here needs a GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuhost.bench.environment import FabricState
from gpuhost.bench.environment_judge import judge_fabric
from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.models import load_model_table
from gpuhost.bench.rules import Status
from gpuhost.bench.verdict import judge
from gpuhost.cli.main import main
from tests.helpers import FIXTURES

CAPTURE = FIXTURES / "h100x2"
RUNS = sorted(CAPTURE.glob("full-gpu*-*.json")) + sorted(CAPTURE.glob("quick-gpu*.json"))


def test_the_capture_has_every_run_it_names() -> None:
    assert [path.name for path in RUNS] == [
        *(f"full-gpu{gpu}-{run}.json" for gpu in (0, 1) for run in (1, 2, 3)),
        "quick-gpu0.json",
        "quick-gpu1.json",
    ]


@pytest.mark.parametrize("path", RUNS, ids=lambda path: path.stem)
def test_every_run_on_either_gpu_replays_to_the_verdict_it_had(path: Path, tmp_path: Path) -> None:
    """The same verdict, PASS, run after run on both healthy GPUs, as recorded and as judged again now."""
    recorded = json.loads(path.read_text())
    assert recorded["verdict"]["status"] == "PASS"
    again = tmp_path / "again.json"
    assert main(["smoke-test", "--replay", str(path), "--json", str(again)]) == 0
    assert json.loads(again.read_text())["verdict"]["status"] == "PASS"


@pytest.mark.parametrize("path", RUNS, ids=lambda path: path.stem)
def test_both_nvlink_directions_run_near_link_speed(path: Path) -> None:
    run = read_recorded(json.loads(path.read_text()))
    model = load_model_table().lookup(run.environment.gpus[0].pci_device_id)
    assert model is not None and model.nvlink_gbps == 450
    p2p = {m.metric: m for m in judge(run.run, model=model).metrics if m.metric.startswith("p2p_")}
    assert p2p["p2p_access"].value == 2 and p2p["p2p_access"].status is Status.PASS
    for direction in ("p2p_0_to_1", "p2p_1_to_0"):
        figure = p2p[direction]
        assert figure.status is Status.PASS and figure.reference_kind == "nvlink"
        assert figure.percent_of_reference is not None and 85 <= figure.percent_of_reference <= 90


def test_the_fabric_of_both_gpus_is_completed_as_nvml_reported_it() -> None:
    """The only capture of a fabric that Fabric Manager trained: NVML's COMPLETED/success, which
    tests/bench/test_fabric.py otherwise takes from NVML's documented values."""
    for path in RUNS:
        gpus = read_recorded(json.loads(path.read_text())).environment.gpus
        assert len(gpus) == 2
        for gpu in gpus:
            assert gpu.fabric is not None and gpu.fabric.state is FabricState.COMPLETED and gpu.fabric.status == 0
            judged = judge_fabric(gpu.fabric)
            assert judged is not None and judged[0] is Status.PASS
    smi = (CAPTURE / "nvidia-smi-q.txt").read_text()
    assert len(re.findall(r"(?m)^        State +: Completed$", smi)) == 2


def test_the_suite_copies_peer_to_peer_as_fast_as_pytorch() -> None:
    comparison = json.loads((CAPTURE / "p2p-vs-torch.json").read_text())
    assert [row["pair"] for row in comparison["pairs"]] == ["0->1", "1->0"]
    for row in comparison["pairs"]:
        assert row["suite_status"] == "PASS" and row["suite_over_torch"] >= 0.98, row


def test_the_audit_inside_the_two_gpu_guest() -> None:
    (report,) = [json.loads(line) for line in (CAPTURE / "audit.jsonl").read_text().splitlines() if line.strip()]
    assert report["role"] == "guest" and report["ready"] and report["status"] == "ready"
    assert report["counts"] == {"error": 0, "warning": 0, "info": 7}
    text = (CAPTURE / "audit.txt").read_text()
    assert "READY — passthrough guest, 2 GPUs [10de:2330] on Gen5 x16" in text


@pytest.mark.parametrize("gpu", [0, 1])
def test_a_busy_gpu_is_named_not_judged_on_either_gpu(gpu: int, capsys: pytest.CaptureFixture[str]) -> None:
    """A bf16 matmul loop on the measured GPU (the other idle): the run is NOT REPRESENTATIVE (exit 2),
    naming that process on that GPU, on both GPUs of the guest."""
    path = CAPTURE / f"busy-gpu{gpu}.json"
    contention = json.loads(path.read_text())["contention"]
    assert [(p["gpu"], p["name"], p["seen"]) for p in contention["processes"]] == [
        (gpu, "python3", ["before", "during", "after"])
    ]
    capsys.readouterr()
    assert main(["smoke-test", "--replay", str(path)]) == 2
    out = capsys.readouterr().out
    assert "VERDICT: NOT REPRESENTATIVE" in out
    assert f"contention [GPU {gpu}]" in out and f"pid {contention['processes'][0]['pid']} python3" in out
