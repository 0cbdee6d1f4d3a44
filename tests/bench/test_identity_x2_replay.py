"""Two H200s under a scheduler's CUDA_VISIBLE_DEVICES (tests/fixtures/h200x2-identity), replayed with no GPU.

With GPU 0 hidden (`1`), the code before the identity change failed GPU 1 ("invalid device ordinal")
and filed physical GPU 1's measurements under "GPU 0"; now GPU 1 is judged under its own name, ten
runs of ten PASS, and GPU 0 is named as left out, also while a job of someone else's runs on it. With
CUDA's order reversed (`1,0`) or the GPUs named by UUID, the node's figures are in NVML's numbering.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FIXTURES, replay_smoke_test

CAPTURE = FIXTURES / "h200x2-identity"
BUS = {0: "0000:00:06.0", 1: "0000:00:07.0"}
HIDE0 = [f"hide0-{i}" for i in range(1, 11)]


def _run(name: str) -> dict[str, Any]:
    return json.loads((CAPTURE / f"{name}.json").read_text())  # type: ignore[no-any-return]


def test_the_capture_is_two_h200s_and_every_new_run_exited_0() -> None:
    assert (CAPTURE / "nvidia-smi-L.txt").read_text().count("NVIDIA H200 (UUID: GPU-") == 2
    times = (CAPTURE / "wall-times.txt").read_text().splitlines()
    runs = [line for line in times if " setting " in line and not line.startswith("before-")]
    assert len(runs) == 3 + 10 + 4 and all(" exit 0 " in line for line in runs)


def test_before_the_change_a_hidden_gpu_0_failed_a_healthy_node_and_misfiled_gpu_1() -> None:
    before = _run("before-hide0")
    assert before["outcome"] == "FAIL"
    assert [(v["gpu"], v["outcome"]) for v in before["verdicts"]] == [(0, "PASS"), (1, "cannot run")]
    (measured,) = before["gpus"]
    # "GPU 0" of that run measured the GPU at 0000:00:07.0: NVML's GPU 1.
    assert measured["suite"]["device"]["index"] == 0 and measured["suite"]["device"]["pci_bus_id"] == BUS[1]
    assert "invalid device ordinal" in (CAPTURE / "before-hide0.txt").read_text()


@pytest.mark.parametrize("name", [*HIDE0, "hide0-busy-hidden-0"])
def test_with_gpu_0_hidden_gpu_1_is_judged_under_its_own_name_and_gpu_0_is_named_left_out(
    name: str, tmp_path: Path
) -> None:
    run = _run(name)
    assert run["outcome"] == "PASS"
    assert [(v["gpu"], v["pci_bus_id"], v["outcome"]) for v in run["verdicts"]] == [(1, BUS[1], "PASS")]
    (gpu,) = run["gpus"]
    assert gpu["gpu"]["index"] == 1 and gpu["gpu"]["cuda_ordinal"] == 0
    assert gpu["suite"]["device"]["index"] == 1 and gpu["suite"]["device"]["pci_bus_id"] == BUS[1]
    assert run["left_out"].startswith("CUDA_VISIBLE_DEVICES=1: ") and BUS[0] in run["left_out"]
    assert "VERDICT node: no node measurements (one GPU)" in (CAPTURE / f"{name}.txt").read_text()
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS" and again["left_out"] == run["left_out"]


def test_a_job_on_the_hidden_gpu_is_not_this_runs_contention() -> None:
    (gpu,) = _run("hide0-busy-hidden-0")["gpus"]
    assert gpu["outcome"] == "PASS" and gpu["contention"]["processes"] == []
    assert gpu["contention"]["utilization_before_pct"][0] >= 90  # the matmul loop on GPU 0 was running
    assert (CAPTURE / "hammer-gpu0.txt").read_text().startswith("hammer started on 0")


@pytest.mark.parametrize("name", ["unset-1", "unset-2", "unset-3", "reversed", "uuids"])
def test_the_node_is_in_nvml_numbering_whatever_cudas_order(name: str, tmp_path: Path) -> None:
    run = _run(name)
    assert run["outcome"] == "PASS"
    assert [(v["gpu"], v["pci_bus_id"]) for v in run["verdicts"]] == [(0, BUS[0]), (1, BUS[1])]
    for gpu in run["gpus"]:  # each GPU's suite measured the GPU NVML names
        assert gpu["suite"]["device"]["pci_bus_id"] == BUS[gpu["gpu"]["index"]]
    ordinals = {g["index"]: g["cuda_ordinal"] for g in run["node"]["record"]["gpus"]}
    assert ordinals == ({0: 0, 1: 1} if name.startswith("unset") else {0: 1, 1: 0})
    pairs = {f["metric"]: f for f in run["node"]["figures"] if f["metric"].startswith("p2p_pair_")}
    assert set(pairs) == {"p2p_pair_0_to_1", "p2p_pair_1_to_0"}
    assert pairs["p2p_pair_1_to_0"]["gpus"] == [1, 0] and pairs["p2p_pair_1_to_0"]["status"] == "PASS"
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS"


def test_one_gpu_named_by_uuid_under_a_reversed_order_is_that_gpu() -> None:
    run = _run("one-by-uuid")
    assert run["outcome"] == "PASS"
    assert run["gpu"] == {
        "index": 0,
        "uuid": "GPU-45f4d2ff-2ca7-9f87-7b1d-5d0d001a6f43",
        "pci_bus_id": BUS[0],
        "cuda_ordinal": 1,  # CUDA's device 1 under `1,0`
    }
    assert run["suite"]["device"]["pci_bus_id"] == BUS[0]
