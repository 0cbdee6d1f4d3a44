"""The smoke-test's NVSwitch fabric check (issue 15): NVML's GPU fabric info per GPU, in the
environment, the JSON and the verdict.

The GPU without a fabric is a capture: tests/fixtures/nvml-fabric (one H100 alone in a VM, driver
580.159.04; its README says how it was taken). No NVSwitch-attached GPU was at hand: those states
are the values of NVML's documented nvmlGpuFabricState_t enum (nvml.h; pynvml's constants mirror
it), not a capture.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuhost.bench.environment import Environment, FabricReading, FabricState, GpuUnavailable, parse_fabric, read_fabric
from gpuhost.bench.environment_judge import FABRIC, fabric_problems, judge_fabric, judge_gpu
from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.rules import Status
from gpuhost.bench.suite import SmokeOptions, run_suite_explained
from gpuhost.errors import InputError
from gpuhost.problems import Severity
from tests.bench.stand_in_kernels import stand_in_target
from tests.helpers import FIXTURES

CAPTURE = FIXTURES / "nvml-fabric" / "h100-single-580.159.04.txt"
RECORDED = FIXTURES / "h100-smoke" / "smoke-full.json"


def captured() -> dict[str, Any]:
    """The capture's GPU line: both NVML calls' return codes and struct fields."""
    line = next(line for line in CAPTURE.read_text().splitlines() if line.startswith("{"))
    document: dict[str, Any] = json.loads(line)
    return document


def captured_reading() -> FabricReading:
    fields = captured()["V2_struct"]
    return parse_fabric(fields["state"], fields["status"], fields["cliqueId"], fields["healthMask"])


def documented(state: int, status: int = pynvml.NVML_SUCCESS) -> FabricReading:
    return parse_fabric(state, status, 0, None)


def recorded_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(RECORDED.read_text())
    return document


def gpu_with(fabric: FabricReading | None) -> Any:
    return dataclasses.replace(read_recorded(recorded_document()).environment.gpus[0], fabric=fabric)


def test_the_captured_h100_without_nvswitch_reports_no_fabric_and_gets_no_finding() -> None:
    assert captured()["V2_return"] == captured()["V1_return"] == pynvml.NVML_SUCCESS
    reading = captured_reading()
    assert reading == FabricReading(FabricState.NOT_SUPPORTED, 0, 0, 0)
    assert judge_fabric(reading) is None
    rows = judge_gpu(gpu_with(reading), None, None)
    assert not any(row.check == "fabric" for row in rows)


def test_a_gpu_whose_fabric_manager_has_not_trained_the_fabric_fails_naming_fabric_manager_and_802() -> None:
    # Documented enum values, not a capture (no NVSwitch here).
    for state in (pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS):
        (row,) = [row for row in judge_gpu(gpu_with(documented(state)), None, None) if row.check == "fabric"]
        assert row.status is Status.FAIL and row.problem is not None
        assert row.problem.code == FABRIC and row.problem.severity is Severity.ERROR
        assert "error 802 (system not yet initialized)" in row.detail
        assert "Fabric Manager" in row.detail and "nvidia-fabricmanager" in row.problem.remedy


def test_a_completed_registration_passes_and_a_failed_one_fails() -> None:
    joined = documented(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    assert judge_fabric(joined) == (Status.PASS, "joined its NVSwitch fabric (clique 0)")
    # nvml.h: status "must be checked only if state returns complete"; NVML_ERROR_TIMEOUT is one
    # of nvmlReturn_t's documented values.
    timed_out = judge_fabric(documented(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_TIMEOUT))
    assert timed_out is not None and timed_out[0] is Status.FAIL
    assert f"NVML error {pynvml.NVML_ERROR_TIMEOUT}" in timed_out[1]
    # A state a newer NVML may add: said, not failed.
    unknown = judge_fabric(documented(7))
    assert unknown is not None and unknown[0] is Status.WARN


def test_the_fabric_travels_in_the_json_and_older_records_load_without_it() -> None:
    document = recorded_document()
    assert "fabric" not in document["environment"]["gpus"][0]
    assert read_recorded(document).environment.gpus[0].fabric is None
    reading = documented(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED)
    document["environment"]["gpus"][0]["fabric"] = json.loads(json.dumps(dataclasses.asdict(reading)))
    assert document["environment"]["gpus"][0]["fabric"]["state"] == "not-started"
    assert read_recorded(document).environment.gpus[0].fabric == reading
    document["environment"]["gpus"][0]["fabric"]["state"] = "trained"
    with pytest.raises(InputError, match=r"fabric\.state must be one of not-supported, .* not 'trained'"):
        read_recorded(document)


def test_the_older_nvml_call_answers_where_the_versioned_one_is_missing() -> None:
    """A driver before nvmlDeviceGetGpuFabricInfoV (a fault this machine, with no NVIDIA driver,
    cannot cause): the first call's struct, filled with the capture's values, is read instead."""
    fields = captured()["V1_struct"]

    def versioned(handle: object, info: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def first(handle: object, info: Any) -> None:
        struct = ctypes.cast(info, ctypes.POINTER(pynvml.c_nvmlGpuFabricInfo_t)).contents
        struct.state, struct.status, struct.cliqueId = fields["state"], fields["status"], fields["cliqueId"]

    nvml = SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        nvmlDeviceGetGpuFabricInfoV=versioned,
        c_nvmlGpuFabricInfoV_t=pynvml.c_nvmlGpuFabricInfoV_t,
        nvmlDeviceGetGpuFabricInfo=first,
        c_nvmlGpuFabricInfo_t=pynvml.c_nvmlGpuFabricInfo_t,
    )
    assert read_fabric(nvml, object()) == FabricReading(FabricState.NOT_SUPPORTED, 0, 0, None)
    assert read_fabric(SimpleNamespace(NVMLError=pynvml.NVMLError), object()) is None


def failing_suite(tmp_path: Path) -> Path:
    """A suite binary that stops as the real one does when cuInit fails (exit 2, the CUDA error on
    stderr): an NVSwitch guest without Fabric Manager cannot be made here."""
    binary = tmp_path / "gpuhost-bench"
    binary.write_text("#!/bin/sh\necho 'cuInit failed: CUDA error 802 (system not yet initialized)' >&2\nexit 2\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_a_suite_that_cannot_start_names_the_fabric_when_nvml_saw_it_not_ready(tmp_path: Path) -> None:
    environment = read_recorded(recorded_document()).environment
    not_ready = dataclasses.replace(
        environment,
        gpus=(dataclasses.replace(environment.gpus[0], fabric=documented(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED)),),
    )
    assert [problem.code for problem in fabric_problems(not_ready)] == [FABRIC]
    with pytest.raises(GpuUnavailable, match=r"(?s)CUDA error 802.*\[smoke\.fabric\] fabric \(GPU 0\): attached to"):
        run_suite_explained(failing_suite(tmp_path), SmokeOptions(), stand_in_target(0, "0000:00:06.0"), not_ready)


def test_a_suite_that_cannot_start_on_a_gpu_without_fabric_says_only_its_own_error(tmp_path: Path) -> None:
    environment: Environment = read_recorded(recorded_document()).environment
    alone = dataclasses.replace(
        environment, gpus=(dataclasses.replace(environment.gpus[0], fabric=captured_reading()),)
    )
    assert fabric_problems(alone) == ()
    with pytest.raises(GpuUnavailable) as raised:
        run_suite_explained(failing_suite(tmp_path), SmokeOptions(), stand_in_target(0, "0000:00:06.0"), alone)
    assert "smoke.fabric" not in str(raised.value)


def test_the_text_report_shows_the_fabric_row_and_the_verdict_fails_on_it() -> None:
    from gpuhost.bench.environment_judge import judge_environment
    from gpuhost.bench.models import load_model_table
    from gpuhost.bench.report import render
    from gpuhost.bench.verdict import judge

    recorded = read_recorded(recorded_document())
    model = load_model_table().lookup(0x2330)
    not_ready = dataclasses.replace(
        recorded.environment,
        gpus=(dataclasses.replace(gpu_with(documented(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED))),),
    )
    checks = judge_environment(not_ready, recorded.samples, {0: model})
    verdict = judge(recorded.run, model=model, checks=checks)
    assert verdict.status is Status.FAIL
    assert any(reason.startswith("FAIL fabric (GPU 0): attached to an NVSwitch fabric") for reason in verdict.reasons)
    text = render(verdict, recorded.run)
    assert "fabric" in text and "error 802" in text
