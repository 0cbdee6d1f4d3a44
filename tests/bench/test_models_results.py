"""The GPU model table and the suite-output parser."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpuhost.bench.models import load_model_table, parse_model_table, pcie_ceiling_gbps
from gpuhost.bench.results import ResultParseError, parse_suite_document, parse_suite_output
from gpuhost.errors import EXIT_UNUSABLE, InputError
from tests import helpers

FIXTURES = helpers.FIXTURES / "h100-smoke"
PACKAGED = Path(__file__).parents[2] / "gpuhost" / "data" / "gpu_models.json"


def table_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(PACKAGED.read_text())
    return document


def test_packaged_table_covers_the_reference_models_with_sources() -> None:
    table = load_model_table()
    expected = {
        0x2330: 3350,
        0x2331: 2000,
        0x2321: 3900,
        0x2335: 4800,
        0x233B: 4800,
        0x20B0: 1555,
        0x20B2: 2039,
        0x20B5: 1935,
        0x26B9: 864,
        0x27B8: 300,
        0x2236: 600,
        0x2684: 1008,
        0x2B85: 1792,
        0x2BB1: 1792,
        0x2BB4: 1792,
        0x2BB5: 1792,
        0x2901: 7700,
    }
    for device_id, bandwidth in expected.items():
        model = table.lookup(device_id)
        assert model is not None, hex(device_id)
        assert model.memory_bandwidth_gbps == bandwidth
        assert model.sources and all(isinstance(s, str) and s for s in model.sources)
    h100 = table.lookup(0x2330)
    assert h100 is not None
    assert (h100.bf16_tflops, h100.fp32_tflops, h100.pcie_gen, h100.pcie_width) == (989.4, 66.9, 5, 16)
    assert h100.peak("pcie") == pytest.approx(63.0, abs=0.1)
    assert h100.peak("pcie_both") == pytest.approx(126.0, abs=0.2)
    assert table.lookup(0x1234) is None
    # An unknown figure stays unknown rather than guessed.
    pro = table.lookup(0x2BB1)
    assert pro is not None and pro.bf16_tflops is None and pro.peak("bf16") is None


def test_every_source_of_the_packaged_table_is_a_public_document_not_a_path() -> None:
    """The sources are shown to users (the smoke-test's JSON report): a path in some checkout
    (shared/notes/...) names nothing in a clone or an installed wheel."""
    sources = table_document()["sources"]
    paths = [text for text in sources.values() if any("/" in word and "." in word for word in text.split())]
    assert paths == []
    assert all(model.sources for model in load_model_table().models)


def test_pcie_ceilings() -> None:
    assert pcie_ceiling_gbps(4, 16) == pytest.approx(31.5, abs=0.05)
    assert pcie_ceiling_gbps(5, 16) == pytest.approx(63.0, abs=0.05)
    assert pcie_ceiling_gbps(9, 16) is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["models"][0].update(memory_bandwidth_GBps=-1), "positive number"),
        (lambda d: d["models"][0].update(sources=[]), "provenance"),
        (lambda d: d["models"][0].update(sources=["nowhere"]), "not defined"),
        (lambda d: d["models"][1].update(pci_device_ids=["2330"]), "listed for both"),
        (lambda d: d["models"][0].update(pci_device_ids=["zz"]), "bad PCI device ID"),
        (lambda d: d["models"][0].update(pcie_gen=9), "pcie_gen"),
        (lambda d: d.update(format=2), "format"),
    ],
)
def test_bad_tables_are_rejected(mutate: Any, message: str) -> None:
    document = table_document()
    mutate(document)
    with pytest.raises(InputError, match=message):
        parse_model_table(json.dumps(document), "test.json")


def test_alternative_table_file(tmp_path: Path) -> None:
    document = table_document()
    document["models"][0]["memory_bandwidth_GBps"] = 6700
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(document))
    table = load_model_table(path)
    assert table.origin == str(path)
    model = table.lookup(0x2330)
    assert model is not None and model.memory_bandwidth_gbps == 6700
    with pytest.raises(InputError, match="cannot read"):
        load_model_table(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model_table(tmp_path / "bad.json")


def raw_suite() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / "suite-raw.json").read_text())
    return document


def test_parse_real_suite_output() -> None:
    run = parse_suite_output((FIXTURES / "suite-raw.json").read_text())
    assert run.device.name == "NVIDIA H100 80GB HBM3"
    assert run.device.compute_capability == "9.0" and run.device.sm_count == 132
    assert not run.quick and not run.errors
    copy_result = run.get("copy")
    assert copy_result is not None
    assert copy_result.unit == "GB/s" and copy_result.verified and copy_result.reps == 20
    assert len(copy_result.samples_ms) == 20
    assert copy_result.median_ms is not None and copy_result.min_ms is not None
    assert copy_result.min_ms <= copy_result.median_ms
    assert copy_result.spread is not None and copy_result.spread >= 0
    assert copy_result.params["bytes_per_buffer"] == 1 << 30
    # 2 bytes moved per byte copied: value = 2 * 1 GiB / median time.
    assert copy_result.value == pytest.approx(2 * (1 << 30) / (copy_result.median_ms * 1e6), rel=1e-6)
    speedup = run.get("softmax_online_speedup")
    assert speedup is not None and speedup.median_ms is None and speedup.reps == 0
    assert run.get("no-such") is None
    assert set(run.benchmark_seconds) == {
        "memory",
        "roofline",
        "reduction",
        "sgemm",
        "cublas",
        "softmax",
        "transfer",
        "launch",
        "p2p",
    }
    with pytest.raises(TypeError):
        copy_result.params["bytes_per_buffer"] = 0  # type: ignore[index]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(suite="other"), "expected suite"),
        (lambda d: d.pop("device"), "lacks 'device'"),
        (lambda d: d["results"][0].pop("verified"), "lacks 'verified'"),
        (lambda d: d["results"][0].update(value="fast"), "number or null"),
        (lambda d: d["results"][0].update(reps=True), "wrong type"),
        (lambda d: d["errors"].append("boom"), "errors\\[0\\]"),
    ],
)
def test_malformed_suite_output(mutate: Any, message: str) -> None:
    document = copy.deepcopy(raw_suite())
    mutate(document)
    with pytest.raises(ResultParseError, match=message) as caught:
        parse_suite_document(document)
    assert caught.value.exit_code == EXIT_UNUSABLE


def test_null_value_parses_as_missing() -> None:
    document = raw_suite()
    document["results"][0]["value"] = None
    run = parse_suite_document(document)
    assert run.measurements[0].value is None


def test_not_json() -> None:
    with pytest.raises(ResultParseError, match="not JSON"):
        parse_suite_output("gpuhost-kernels: crashed")


def test_a_non_finite_datasheet_figure_is_refused_even_past_the_json_reader() -> None:
    # Issue 13 class 6: a NaN figure compared false with every threshold, so its check was dropped
    # and the run passed. The strict reader refuses NaN in a file; the table's own check does too.
    from gpuhost.bench.models import parse_model_document

    document = json.loads((Path(__file__).resolve().parents[2] / "gpuhost/data/gpu_models.json").read_text())
    for figure in (float("nan"), float("inf")):
        document["models"][0]["bf16_tflops"] = figure
        with pytest.raises(InputError, match="'bf16_tflops' must be a positive number or null"):
            parse_model_document(document, "edited table")
