"""Verdict logic on the real H100 (and 2x H200) smoke-test output recorded on the device machine."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpuhost.bench.environment import GpuEnvironment, PcieLinkReading, RunSamples
from gpuhost.bench.environment_judge import DRIVER, GPUS, MODEL_UNKNOWN, PCIE_LINK, judge_environment, judge_gpu
from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.models import GpuModel, load_model_table
from gpuhost.bench.results import Measurement, SuiteError, SuiteRun, parse_suite_document
from gpuhost.bench.rules import FULL_METRICS, Status, found, rule_for, worst
from gpuhost.bench.verdict import judge, judge_measurement, measured_ridge
from gpuhost.problems import Severity
from tests import helpers

FIXTURES = helpers.FIXTURES / "h100-smoke"
H100 = 0x2330


def recorded(name: str = "smoke-full.json") -> Any:
    return read_recorded(json.loads((FIXTURES / name).read_text()))


def steady(measurement: Measurement, value: float) -> Measurement:
    """`measurement` at `value` in every repetition, so that its judged figure is exactly `value`."""
    assert measurement.median_ms is not None
    return dataclasses.replace(measurement, value=value, samples_ms=(measurement.median_ms,) * measurement.reps)


def h100() -> GpuModel:
    model = load_model_table().lookup(H100)
    assert model is not None
    return model


def replace_measurement(run: SuiteRun, name: str, **changes: Any) -> SuiteRun:
    measurements = tuple(dataclasses.replace(m, **changes) if m.name == name else m for m in run.measurements)
    return dataclasses.replace(run, measurements=measurements)


def test_recorded_h100_run_passes_every_measurement_with_a_percentage() -> None:
    rec = recorded()
    verdict = judge(rec.run, model=h100())
    assert verdict.status is Status.PASS
    by_name = {m.metric: m for m in verdict.metrics}
    assert set(FULL_METRICS) <= set(by_name)
    for name in (
        "copy",
        "triad",
        "dot",
        "roofline",
        "sgemm",
        "cublas_bf16",
        "cublas_fp16",
        "cublas_tf32",
        "cublas_fp32",
        "softmax_online",
        "h2d_pinned",
        "d2h_pinned",
        "bidir_pinned",
    ):
        metric = by_name[name]
        assert metric.status is Status.PASS, (name, metric.reason)
        assert metric.percent_of_reference is not None
        assert metric.reference is not None
        # Judged on the capability figure (the fast quarter's edge), which is at least the median.
        assert metric.judged_value is not None and metric.value is not None
        assert metric.judged_value >= metric.value
        assert metric.percent_of_reference == pytest.approx(100 * metric.judged_value / metric.reference)
    assert by_name["copy"].reference == 3350
    assert by_name["cublas_bf16"].reference == pytest.approx(989.4)
    assert by_name["h2d_pinned"].reference == pytest.approx(63.008)
    # Pageable copies and the speed-up ratios are reported, not judged.
    assert by_name["h2d_pageable"].status is Status.INFO
    assert by_name["softmax_online_speedup"].status is Status.INFO


def test_a_table_claiming_twice_the_bandwidth_fails_naming_the_measurements() -> None:
    rec = recorded()
    wrong = dataclasses.replace(h100(), memory_bandwidth_gbps=2 * 3350)
    verdict = judge(rec.run, model=wrong)
    assert verdict.status is Status.FAIL
    failed = {m.metric for m in verdict.metrics if m.status is Status.FAIL}
    assert {"copy", "triad", "dot", "softmax_online"} <= failed
    assert any(reason.startswith("FAIL copy: ") and "of 6700 GB/s" in reason for reason in verdict.reasons)


def test_threshold_edges_for_copy() -> None:
    rec = recorded()
    copy = rec.run.get("copy")
    assert copy is not None
    model = h100()
    for fraction, expected in ((0.80, Status.PASS), (0.7999, Status.WARN), (0.70, Status.WARN), (0.6999, Status.FAIL)):
        measurement = steady(copy, fraction * 3350)
        assert judge_measurement(measurement, model, None, 1).status is expected, fraction


def test_an_unverified_result_fails_even_when_fast() -> None:
    rec = recorded()
    run = replace_measurement(rec.run, "sgemm", verified=False, check="3 unwritten, sample error 0.5")
    verdict = judge(run, model=h100())
    assert verdict.status is Status.FAIL
    sgemm = next(m for m in verdict.metrics if m.metric == "sgemm")
    assert sgemm.status is Status.FAIL
    assert "wrong result" in sgemm.reason and "sample error 0.5" in sgemm.reason


def test_unknown_model_is_measured_without_percentages() -> None:
    rec = recorded()
    verdict = judge(rec.run, model=None)
    copy = next(m for m in verdict.metrics if m.metric == "copy")
    assert copy.percent_of_reference is None and copy.status is Status.INFO
    assert "unknown GPU model" in copy.reason
    # Absolute limits (launch latency) still apply without a model.
    launch = next(m for m in verdict.metrics if m.metric == "launch_roundtrip")
    assert launch.status is Status.PASS


def test_unknown_model_environment_check_warns() -> None:
    rec = recorded()
    findings = judge_environment(rec.environment, rec.samples, {0: None})
    model_check = next(f for f in findings if f.check == "model")
    assert model_check.status is Status.WARN
    assert "not in the GPU model table" in model_check.detail


def test_baseline_comparison() -> None:
    rec = recorded()
    same = judge(rec.run, model=h100(), baseline=rec.run)
    copy = next(m for m in same.metrics if m.metric == "copy")
    assert copy.percent_of_baseline == pytest.approx(100.0)
    assert same.status is Status.PASS
    # A copy at 85% of the baseline's bandwidth fails the baseline rule though it passes the datasheet.
    slow = replace_measurement(rec.run, "copy", value=0.85 * rec.run.get("copy").value)  # type: ignore[union-attr]
    verdict = judge(slow, model=h100(), baseline=rec.run)
    copy = next(m for m in verdict.metrics if m.metric == "copy")
    assert copy.status is Status.FAIL and copy.percent_of_baseline == pytest.approx(85.0)
    # Latency: lower is better, so 2.5x the baseline latency is 40% of the baseline (FAIL past 2x).
    slow_launch = replace_measurement(
        rec.run,
        "launch_roundtrip",
        value=2.5 * rec.run.get("launch_roundtrip").value,  # type: ignore[union-attr]
    )
    launch = next(
        m for m in judge(slow_launch, model=h100(), baseline=rec.run).metrics if m.metric == "launch_roundtrip"
    )
    assert launch.percent_of_baseline == pytest.approx(40.0) and launch.status is Status.FAIL


def test_baseline_from_another_gpu_is_not_compared() -> None:
    rec = recorded()
    other = recorded("h200x2-smoke-full.json")
    verdict = judge(rec.run, model=h100(), baseline=other.run)
    assert all(m.baseline is None for m in verdict.metrics)
    assert any(f.check == "baseline" and f.status is Status.WARN for f in verdict.checks)


def test_latency_limits() -> None:
    rec = recorded()
    launch = rec.run.get("launch_queued")
    assert launch is not None
    assert judge_measurement(steady(launch, 10.0), None, None, 1).status is Status.PASS
    assert judge_measurement(steady(launch, 30.0), None, None, 1).status is Status.WARN
    assert judge_measurement(steady(launch, 51.0), None, None, 1).status is Status.FAIL


def test_suite_errors() -> None:
    rec = recorded()
    crashed = dataclasses.replace(rec.run, errors=(SuiteError("softmax", "cudaErrorIllegalAddress"),))
    verdict = judge(crashed, model=h100())
    assert verdict.status is Status.FAIL
    assert any("benchmark softmax" in r and "cudaErrorIllegalAddress" in r for r in verdict.reasons)
    no_cublas = dataclasses.replace(
        rec.run,
        errors=(SuiteError("cublas", "built without cuBLAS (headers or libraries were not found at build time)"),),
    )
    assert judge(no_cublas, model=h100()).status is Status.WARN


def test_missing_expected_metric_warns_unless_benchmarks_were_selected() -> None:
    rec = recorded()
    without = dataclasses.replace(rec.run, measurements=tuple(m for m in rec.run.measurements if m.name != "dot"))
    verdict = judge(without, model=h100())
    assert verdict.status is Status.WARN
    assert any("metric dot" in r for r in verdict.reasons)
    assert judge(without, model=h100(), complete=False).status is Status.PASS


def test_recorded_quick_run_passes() -> None:
    rec = recorded("smoke-quick.json")
    assert rec.run.quick
    verdict = judge(rec.run, model=h100())
    assert verdict.status is Status.PASS
    assert {m.metric for m in verdict.metrics} >= {"copy", "triad", "cublas_bf16", "h2d_pinned", "launch_roundtrip"}


def test_recorded_environment_checks_pass() -> None:
    rec = recorded()
    findings = judge_environment(rec.environment, rec.samples, {0: h100()})
    statuses = {f.check: f.status for f in findings}
    for check in ("pcie link", "virtualization", "ecc", "memory health", "clocks", "bar1", "persistence", "model"):
        assert statuses[check] is Status.PASS, check
    link = next(f for f in findings if f.check == "pcie link")
    assert link.detail.startswith("Gen5 x16 under load")


def _gpu(**changes: Any) -> GpuEnvironment:
    return dataclasses.replace(recorded().environment.gpus[0], **changes)


def _samples(**changes: Any) -> RunSamples:
    return dataclasses.replace(recorded().samples[0], **changes)


def _status(findings: list[Any], check: str) -> Status:
    return next(f.status for f in findings if f.check == check)


def test_downtrained_link_under_load_fails() -> None:
    findings = judge_gpu(_gpu(), _samples(max_link_gen=4), h100())
    assert _status(findings, "pcie link") is Status.FAIL
    narrow = judge_gpu(_gpu(), _samples(max_link_width=8), h100())
    detail = next(f.detail for f in narrow if f.check == "pcie link")
    assert "Gen5 x8" in detail and "down-trained" in detail


def test_slot_capping_the_link_warns() -> None:
    capped = _gpu(link=PcieLinkReading(4, 16, 4, 16, 5))
    findings = judge_gpu(capped, _samples(max_link_gen=4), h100())
    assert _status(findings, "pcie link") is Status.WARN


def test_environment_health_checks() -> None:
    model = h100()
    assert _status(judge_gpu(_gpu(virtualization_mode=0), _samples(), model), "virtualization") is Status.INFO
    assert _status(judge_gpu(_gpu(virtualization_mode=2), _samples(), model), "virtualization") is Status.WARN
    assert _status(judge_gpu(_gpu(ecc_current=False), _samples(), model), "ecc") is Status.WARN
    assert _status(judge_gpu(_gpu(remapped_rows_failure=True), _samples(), model), "memory health") is Status.FAIL
    assert _status(judge_gpu(_gpu(remapped_rows_pending=True), _samples(), model), "memory health") is Status.WARN
    assert _status(judge_gpu(_gpu(bar1_bytes=256 << 20), _samples(), model), "bar1") is Status.WARN
    assert _status(judge_gpu(_gpu(persistence_mode=False), _samples(), model), "persistence") is Status.INFO
    hot = judge_gpu(_gpu(), _samples(throttle_reasons=0x40 | 0x4), model)
    assert _status(hot, "clocks") is Status.FAIL
    assert "hw_thermal_slowdown" in next(f.detail for f in hot if f.check == "clocks")
    assert _status(judge_gpu(_gpu(), _samples(throttle_reasons=0x20), model), "clocks") is Status.WARN
    assert _status(judge_gpu(_gpu(), _samples(throttle_reasons=0x4), model), "clocks") is Status.PASS


def test_p2p_on_the_recorded_two_gpu_guest() -> None:
    rec = recorded("h200x2-smoke-full.json")
    table = load_model_table()
    model = table.lookup(rec.environment.gpus[0].pci_device_id)
    assert model is not None and model.nvlink_gbps == 450
    verdict = judge(rec.run, model=model)
    assert verdict.status is Status.PASS
    p2p = [m for m in verdict.metrics if m.metric.startswith("p2p_") and m.metric != "p2p_access"]
    assert {m.metric for m in p2p} == {"p2p_0_to_1", "p2p_1_to_0"}
    assert all(m.status is Status.PASS and m.reference_kind == "nvlink" for m in p2p)
    # The same guest without peer access is a finding, not a skip.
    access = rec.run.get("p2p_access")
    assert access is not None
    blocked = judge_measurement(dataclasses.replace(access, value=0.0), model, None, 2)
    assert blocked.status is Status.FAIL and "through host memory" in blocked.reason
    # A model without P2P (GeForce) only reports it.
    geforce = table.lookup(0x2684)
    assert judge_measurement(dataclasses.replace(access, value=0.0), geforce, None, 2).status is Status.INFO


def test_single_gpu_p2p_is_reported_as_not_applicable() -> None:
    access = recorded().run.get("p2p_access")
    assert access is not None
    verdict = judge_measurement(access, h100(), None, 1)
    assert verdict.status is Status.INFO and "one GPU" in verdict.reason


def test_roofline_ridge_from_the_recorded_sweep() -> None:
    sweep = recorded().run.get("roofline")
    assert sweep is not None
    ridge = measured_ridge(sweep)
    # The H100's datasheet ridge is 66.9 TFLOP/s / 3350 GB/s = 20 FLOP/byte.
    assert ridge is not None and 10 < ridge < 40


def test_rules_and_worst() -> None:
    assert rule_for("p2p_3_to_4") is not None
    assert rule_for("no_such_metric") is None
    assert worst([Status.PASS, Status.INFO]) is Status.PASS
    assert worst([Status.INFO, Status.WARN, Status.PASS]) is Status.WARN
    assert worst([Status.WARN, Status.FAIL]) is Status.FAIL


def test_missing_value_fails() -> None:
    copy = recorded().run.get("copy")
    assert copy is not None
    result = judge_measurement(dataclasses.replace(copy, value=None), h100(), None, 1)
    assert result.status is Status.FAIL and "not measured" in result.reason


def test_parsed_fixture_types() -> None:
    run = parse_suite_document(json.loads((FIXTURES / "suite-raw.json").read_text()))
    assert isinstance(run.measurements[0], Measurement)
    assert run.device.name == "NVIDIA H100 80GB HBM3"


def test_a_check_that_does_not_pass_is_a_registered_problem() -> None:
    """A WARN/FAIL/INFO row carries its Problem (code, severity, GPU, value, remedy); a PASS row none."""
    rec = recorded()
    unknown = next(c for c in judge_environment(rec.environment, rec.samples, {0: None}) if c.check == "model")
    assert unknown.problem is not None
    assert unknown.problem.code == MODEL_UNKNOWN and unknown.problem.severity is Severity.WARNING
    assert unknown.problem.subject == "GPU 0" and "GPU 0" in unknown.problem.message
    assert "H100" in unknown.problem.message and "gpu_models.json" in unknown.problem.remedy
    down = next(c for c in judge_gpu(_gpu(), _samples(max_link_gen=4), h100()) if c.check == "pcie link")
    assert down.problem is not None and down.problem.code == PCIE_LINK and down.problem.severity is Severity.ERROR
    assert "Gen4 x16" in down.problem.message and down.status is Status.FAIL
    checks = judge_environment(rec.environment, rec.samples, {0: h100()})
    assert next(c for c in checks if c.check == "pcie link").problem is None
    verdict = judge(rec.run, model=h100(), checks=checks)
    assert [p.code for p in verdict.problems] == [GPUS, DRIVER]  # the recorded H100 passes every other check
    assert all(p.severity is Severity.INFO and p.subject == "environment" for p in verdict.problems)
    with pytest.raises(ValueError, match="a pass is not a problem"):
        found(MODEL_UNKNOWN, Status.PASS, "model", "known")
