"""One H200 under every form of CUDA_VISIBLE_DEVICES (tests/fixtures/h200-identity), replayed with no GPU.

Each run measured the GPU it names: the suite process's own PCI address (its `device`) is the one
NVML gives the GPU, and the run's identity (NVML index, UUID, PCI address, CUDA ordinal) is written
in its JSON; the settings that name nothing, a GPU twice, an unknown UUID or a MIG instance, and
--device of no GPU or with --all, ended with exit 2 and one error line each, no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhost.bench.identity import pci_address
from tests.helpers import FIXTURES, replay_smoke_test

CAPTURE = FIXTURES / "h200-identity"
UUID = "GPU-d4e3a02e-e949-ae50-e3df-9ad944749bce"
RUNS = ("unset-all", "zero-all", "uuid-all", "stops-at-2", "unset-one", "prefix-by-bus")


def _gpu_documents(document: dict[str, object]) -> list[dict[str, object]]:
    gpus = document.get("gpus")
    return gpus if isinstance(gpus, list) else [document]  # --all's per-GPU documents, or the one run's


def test_the_capture_is_one_h200_and_its_identity() -> None:
    assert (CAPTURE / "nvidia-smi-L.txt").read_text().strip() == f"GPU 0: NVIDIA H200 (UUID: {UUID})"
    assert (CAPTURE / "nvidia-smi-ids.csv").read_text().splitlines()[1] == f"0, {UUID}, 00000000:00:06.0"
    times = (CAPTURE / "wall-times.txt").read_text()
    assert all(f"{name} setting" in times for name in RUNS) and times.count(" exit 0 ") == len(RUNS) + 1


@pytest.mark.parametrize("name", RUNS)
def test_every_run_measured_the_gpu_nvml_names_and_passes_again(name: str, tmp_path: Path) -> None:
    recorded = json.loads((CAPTURE / f"{name}.json").read_text())
    for gpu in _gpu_documents(recorded):
        suite, environment, identity = gpu["suite"], gpu["environment"], gpu["gpu"]  # type: ignore[index]
        (listed,) = environment["gpus"]
        assert pci_address(suite["device"]["pci_bus_id"]) == pci_address(listed["pci_bus_id"]) == "0000:00:06.0"
        assert identity == {"index": 0, "uuid": UUID, "pci_bus_id": "0000:00:06.0", "cuda_ordinal": 0}
        assert listed["uuid"] == UUID
    code, again = replay_smoke_test(CAPTURE / f"{name}.json", tmp_path)
    assert code == 0 and again["outcome"] == "PASS"
    for gpu in _gpu_documents(again):  # the replay keeps each run's identity
        assert gpu["gpu"] == {"index": 0, "uuid": UUID, "pci_bus_id": "0000:00:06.0", "cuda_ordinal": 0}
    text = (CAPTURE / f"{name}.txt").read_text()
    assert "VERDICT: PASS" in text and "Traceback" not in text
    if name.endswith("-all") or name == "stops-at-2":
        assert "VERDICT GPU 0 (0000:00:06.0): PASS" in text


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("empty", "CUDA_VISIBLE_DEVICES='' leaves no GPU visible ('' names no GPU of this machine)"),
        ("minus-one", "CUDA_VISIBLE_DEVICES='-1' leaves no GPU visible"),
        ("twice", "CUDA_VISIBLE_DEVICES=0,0 names GPU 0 (0000:00:06.0) twice ('0'): name each GPU once"),
        ("unknown-uuid", "leaves no GPU visible ('GPU-00000000-dead' names no GPU of this machine)"),
        ("mig", "smoke-test measures whole GPUs, and a MIG slice is not one"),
        ("no-such-device", "--device '1' names no GPU of this guest"),
        ("all-and-device", "--all judges every visible GPU and --device 0 one: give one of them"),
    ],
)
def test_a_bad_setting_was_exit_2_with_one_error_naming_it(name: str, error: str) -> None:
    assert f"{name} setting " in (CAPTURE / "refusals.txt").read_text()
    line = next(r for r in (CAPTURE / "refusals.txt").read_text().splitlines() if r.startswith(f"{name} "))
    assert line.endswith(" exit 2")
    text = (CAPTURE / f"{name}.txt").read_text()
    assert text.startswith("gpuhost smoke-test: error: ") and error in text and "Traceback" not in text
    if name in ("empty", "minus-one", "unknown-uuid"):  # what there is to name instead
        assert f"GPU 0 (0000:00:06.0) {UUID}" in text
