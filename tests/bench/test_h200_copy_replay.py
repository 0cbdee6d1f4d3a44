"""Issue 30, item 4, replayed: the suite's copy against PyTorch's on one H200, in the same run.
`tests/fixtures/h200-copy/` is what `capture.sh` recorded after the unroll-1 copy variants went into
kernels/memory.cu: three benchmarks/smoke_vs_torch.py runs and one full smoke-test. Nothing here
needs a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhost.cli.main import main
from tests.helpers import FIXTURES

CAPTURE = FIXTURES / "h200-copy"
COMPARISONS = sorted(CAPTURE.glob("vs-torch-*/vs_torch.json"))


def test_the_capture_has_its_three_comparisons() -> None:
    assert [path.parent.name for path in COMPARISONS] == ["vs-torch-1", "vs-torch-2", "vs-torch-3"]


@pytest.mark.parametrize("path", COMPARISONS, ids=lambda path: path.parent.name)
def test_the_suites_copy_is_at_least_torchs_in_each_run_and_an_unroll_1_variant_won(path: Path) -> None:
    comparison = json.loads(path.read_text())
    (copy,) = [row for row in comparison["targets"] if row["measure"] == "copy vs torch copy (GB/s)"]
    assert copy["ratio"] >= 1.0 and copy["met"], copy
    # The figure compared is the suite's own result in that run, and the variant that gave it.
    suite = json.loads((path.parent / "suite.json").read_text())
    (result,) = [r for r in suite["results"] if r["name"] == "copy"]
    assert result["value"] == copy["ours"] and result["verified"]
    assert result["extra"]["best_variant"].startswith("unroll1-"), result["extra"]["best_variant"]


def test_the_full_run_beside_them_replays_pass(tmp_path: Path) -> None:
    recorded = json.loads((CAPTURE / "smoke-full.json").read_text())
    assert recorded["verdict"]["status"] == "PASS"
    again = tmp_path / "again.json"
    assert main(["smoke-test", "--replay", str(CAPTURE / "smoke-full.json"), "--json", str(again)]) == 0
    assert json.loads(again.read_text())["verdict"]["status"] == "PASS"
