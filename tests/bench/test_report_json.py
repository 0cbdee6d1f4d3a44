"""Report text, the JSON document (schema, round trip as a baseline and as a replay), the plot."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from gpuhost.bench.environment_judge import judge_environment
from gpuhost.bench.jsonout import SCHEMA, build_document, dumps, load_baseline, load_recorded, read_recorded
from gpuhost.bench.models import load_model_table
from gpuhost.bench.plot import draw_roofline, roofline_points
from gpuhost.bench.report import render
from gpuhost.bench.rules import Status
from gpuhost.bench.verdict import judge
from gpuhost.errors import InputError
from tests import helpers

FIXTURES = helpers.FIXTURES / "h100-smoke"


def test_report_shows_checks_results_percentages_and_verdict() -> None:
    rec = load_recorded(FIXTURES / "smoke-full.json")
    table = load_model_table()
    model = table.lookup(0x2330)
    findings = judge_environment(rec.environment, rec.samples, {0: model})
    verdict = judge(rec.run, model=model, checks=findings)
    text = render(verdict, rec.run, timings=rec.timings, model_table=table.origin)
    assert "Environment (NVML)" in text and "pcie link [GPU 0]" in text and "Gen5 x16 under load" in text
    copy_line = next(line for line in text.splitlines() if "copy, bytes read + written" in line)
    assert copy_line.startswith("PASS") and "90%" in copy_line and "3350 GB/s" in copy_line
    bf16_line = next(line for line in text.splitlines() if "cuBLASLt BF16 GEMM" in line)
    assert "83%" in bf16_line and "TFLOP/s" in bf16_line
    assert text.rstrip().endswith("VERDICT: PASS")
    assert "% baseline" not in text
    with_baseline = render(judge(rec.run, model=model, baseline=rec.run), rec.run, with_baseline=True)
    assert "% baseline" in with_baseline and "100%" in with_baseline


def test_report_of_a_failed_run_lists_the_reasons() -> None:
    rec = load_recorded(FIXTURES / "smoke-quick.json")
    model = load_model_table().lookup(0x2330)
    assert model is not None
    import dataclasses

    verdict = judge(rec.run, model=dataclasses.replace(model, memory_bandwidth_gbps=6700))
    text = render(verdict, rec.run, verbose=True)
    assert "VERDICT: FAIL" in text
    assert "  - FAIL copy: " in text and "  - FAIL triad: " in text
    assert "Why each threshold" in text


def test_document_schema_and_round_trip(tmp_path: Path) -> None:
    rec = load_recorded(FIXTURES / "smoke-full.json")
    model = load_model_table().lookup(0x2330)
    findings = judge_environment(rec.environment, rec.samples, {0: model})
    verdict = judge(rec.run, model=model, checks=findings)
    document = build_document(
        verdict=verdict,
        suite_document=rec.suite_document,
        environment=rec.environment,
        samples=rec.samples,
        model_table="gpuhost/data/gpu_models.json",
        timings=rec.timings,
        build=rec.build,
        created=datetime.datetime(2026, 11, 22, tzinfo=datetime.timezone.utc),
    )
    text = dumps(document)
    parsed = json.loads(text)
    assert parsed["schema"] == SCHEMA
    assert set(parsed) == {
        "schema",
        "gpuhost_version",
        "created",
        "verdict",
        "model",
        "model_table",
        "environment",
        "samples",
        "checks",
        "metrics",
        "timings",
        "build",
        "suite",
        "outcome",  # issue 14: PASS/WARN/FAIL or NOT REPRESENTATIVE
        "contention",  # null: this recording predates the process checks
        "health",  # likewise for the Xid and PCIe replay checks
    }
    assert parsed["outcome"] == "PASS" and parsed["contention"] is None and parsed["health"] is None
    assert parsed["verdict"]["status"] == "PASS"
    assert parsed["model"]["pci_device_ids"] == ["2330"]
    copy_metric = next(m for m in parsed["metrics"] if m["metric"] == "copy")
    assert copy_metric["status"] == "PASS" and copy_metric["reference"] == 3350
    assert copy_metric["percent_of_reference"] == pytest.approx(100 * copy_metric["judged_value"] / 3350)
    assert copy_metric["spread"]["samples"] > 0
    assert copy_metric["spread"]["slowest"] <= copy_metric["value"] <= copy_metric["judged_value"]
    assert copy_metric["spread"]["capability"] == copy_metric["judged_value"]
    assert parsed["verdict"]["unstable"] == []
    # The checks keep check/status/detail/gpu and add the Problem's code/severity/remedy (null on a PASS).
    rows = {row["check"]: row for row in parsed["checks"]}
    assert rows["pcie link"] == {
        "check": "pcie link",
        "status": "PASS",
        "detail": rows["pcie link"]["detail"],
        "gpu": 0,
        "code": None,
        "severity": None,
        "remedy": None,
    }
    assert rows["driver"]["status"] == "INFO" and rows["driver"]["code"] == "smoke.driver"
    assert rows["driver"]["severity"] == "info" and rows["driver"]["gpu"] is None
    # The document we write reads back as a recorded run and as a baseline.
    path = tmp_path / "run.json"
    path.write_text(text)
    again = read_recorded(parsed)
    assert again.run == rec.run and again.environment == rec.environment and again.samples == rec.samples
    assert load_baseline(path) == rec.run
    # The recorded fixture itself is a document of this schema (written by the CLI on the H100).
    original = json.loads((FIXTURES / "smoke-full.json").read_text())
    assert set(original) == set(parsed) - {"outcome", "contention", "health"}  # keys added since, none renamed
    assert [m["metric"] for m in original["metrics"]] == [m["metric"] for m in parsed["metrics"]]


def test_baseline_accepts_raw_suite_output_and_rejects_other_files(tmp_path: Path) -> None:
    run = load_baseline(FIXTURES / "suite-raw.json")
    assert run.device.name == "NVIDIA H100 80GB HBM3"
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(InputError, match="neither a smoke-test JSON nor a suite output"):
        load_baseline(other)
    with pytest.raises(InputError, match="cannot read"):
        load_baseline(tmp_path / "missing.json")
    with pytest.raises(InputError, match="not a smoke-test JSON"):
        read_recorded(json.loads((FIXTURES / "suite-raw.json").read_text()))


def test_roofline_points_and_plot(tmp_path: Path) -> None:
    rec = load_recorded(FIXTURES / "smoke-full.json")
    points = roofline_points(rec.run)
    labels = {p.label for p in points}
    assert {"triad", "dot", "sgemm", "cublas_bf16"} <= labels
    assert sum(label.startswith("FMA sweep") for label in labels) == 10
    bf16 = next(p for p in points if p.label == "cublas_bf16")
    # 8192^3 BF16: 2*8192^3 FLOPs over 3 matrices of 8192^2 two-byte elements.
    assert bf16.flop_per_byte == pytest.approx(2 * 8192**3 / (2 * 3 * 8192**2))
    model = load_model_table().lookup(0x2330)
    target = tmp_path / "roofline.png"
    draw_roofline(rec.run, model, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_run_has_no_flop_points_to_plot(tmp_path: Path) -> None:
    rec = load_recorded(FIXTURES / "smoke-quick.json")
    # A quick run still has triad and BF16, so it can be plotted; only a run without them cannot.
    assert {p.label for p in roofline_points(rec.run)} == {"triad", "cublas_bf16"}
    import dataclasses

    empty = dataclasses.replace(rec.run, measurements=())
    with pytest.raises(InputError, match="nothing with FLOPs"):
        draw_roofline(empty, None, tmp_path / "x.png")


def test_recorded_verdict_matches_the_device_run() -> None:
    # What the CLI printed on the H100 (recorded in the document) is what the logic gives now.
    original = json.loads((FIXTURES / "smoke-full.json").read_text())
    rec = read_recorded(original)
    model = load_model_table().lookup(0x2330)
    verdict = judge(rec.run, model=model, checks=judge_environment(rec.environment, rec.samples, {0: model}))
    assert verdict.status is Status(original["verdict"]["status"])
    assert {m.metric: m.status.value for m in verdict.metrics} == {
        m["metric"]: m["status"] for m in original["metrics"]
    }
