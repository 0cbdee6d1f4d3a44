"""Judging capability and stability apart, on the repetitions of real H100 runs (issue 14).

tests/fixtures/h100-smoke/issue14/runs holds ten full runs back to back on the healthy H100 guest
(kernels with the stream fix, before judging by spread); busy-full.json ran beside a bf16 matmul loop.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.models import load_model_table
from gpuhost.bench.rules import Status
from gpuhost.bench.runner import below_pass, merge_remeasured
from gpuhost.bench.spread import percentile, spread_of
from gpuhost.bench.verdict import MetricVerdict, Verdict, judge
from tests.helpers import FIXTURES

ISSUE14 = FIXTURES / "h100-smoke" / "issue14"
RUNS = sorted((ISSUE14 / "runs").glob("full-*.json"), key=lambda path: int(path.stem.split("-")[1]))


def document(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def verdict_of(doc: dict[str, Any]) -> Verdict:
    recorded = read_recorded(doc)
    return judge(recorded.run, model=load_model_table().lookup(0x2330))


def metric(verdict: Verdict, name: str) -> MetricVerdict:
    return next(m for m in verdict.metrics if m.metric == name)


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 75) == pytest.approx(3.25)
    assert percentile([5.0], 75) == 5.0
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0 and percentile([3.0, 1.0, 2.0], 100) == 3.0


def test_ten_healthy_runs_every_capability_passes_but_one_link_spell_all_low() -> None:
    verdicts = {path.stem: verdict_of(document(path)) for path in RUNS}
    assert {name: v.status for name, v in verdicts.items() if v.status is not Status.PASS} == {"full-8": Status.WARN}
    # Run 8's both-ways copy was slow in 8 of its 10 repetitions (65-67 GB/s; 79 at best): judging
    # on the fast quarter does not hide a result that is low nearly every time. The live run
    # re-measures it before calling it (test_remeasured_* below).
    bidir = metric(verdicts["full-8"], "bidir_pinned")
    assert bidir.status is Status.WARN
    assert bidir.spread is not None and bidir.judged_value == pytest.approx(66.8, abs=0.1)
    assert bidir.spread.best == pytest.approx(79.1, abs=0.1)


def test_a_slow_spell_in_the_median_does_not_decide_the_capability() -> None:
    # Run 3's H2D ramped 33 -> 54 GB/s over its ten repetitions: median 47.9 (76%, near WARN),
    # capability 54.0 (86%); and the ramp is named as unstable, apart from the verdict.
    verdict = verdict_of(document(ISSUE14 / "runs" / "full-3.json"))
    h2d = metric(verdict, "h2d_pinned")
    assert h2d.value == pytest.approx(47.85, abs=0.1)
    assert h2d.judged_value == pytest.approx(54.0, abs=0.1)
    assert h2d.percent_of_reference == pytest.approx(100 * 54.0 / 63.01, abs=0.2)
    assert h2d.status is Status.PASS and verdict.status is Status.PASS
    assert verdict.unstable == (
        "h2d_pinned: unstable: samples from 33.3 to 54.4 GB/s (median 47.9; the middle 80% spans 36% of the median)",
    )


def test_steady_results_report_their_spread_and_are_not_unstable() -> None:
    verdict = verdict_of(document(ISSUE14 / "runs" / "full-1.json"))
    d2h = metric(verdict, "d2h_pinned").spread
    assert d2h is not None and d2h.samples == 10 and not d2h.unstable
    assert (round(d2h.worst, 1), round(d2h.median, 1), round(d2h.best, 1)) == (55.1, 55.1, 55.3)
    assert d2h.stability_pct < 1.0
    assert verdict.unstable == ()


def test_bimodal_samples_under_contention_are_named_with_both_groups() -> None:
    verdict = verdict_of(document(ISSUE14 / "busy-full.json"))
    copy_spread = metric(verdict, "copy").spread
    assert copy_spread is not None and copy_spread.bimodal
    assert "copy: unstable: 14 of 20 samples at 2972-2990 GB/s, 6 at 661-664 GB/s" in verdict.unstable
    # Latency is lower-is-better: its capability is the fast end of the times.
    launch = metric(verdict, "launch_roundtrip")
    assert launch.judged_value is not None and launch.value is not None and launch.judged_value < launch.value


@pytest.mark.parametrize("how", ["value", "samples"])
def test_copy_bandwidths_at_half_in_every_sample_fail(how: str) -> None:
    doc = document(ISSUE14 / "runs" / "full-1.json")
    for result in doc["suite"]["results"]:
        if result["unit"] == "GB/s" and result["name"] in ("copy", "triad", "h2d_pinned", "d2h_pinned"):
            if how == "value":
                result["value"] *= 0.5
            else:  # every repetition took twice as long
                result["samples_ms"] = [2 * s for s in result["samples_ms"]]
                result["median_ms"] *= 2
                result["value"] *= 0.5
    verdict = verdict_of(doc)
    assert verdict.status is Status.FAIL
    for name in ("copy", "triad", "h2d_pinned", "d2h_pinned"):
        assert metric(verdict, name).status is Status.FAIL, name


def test_spread_of_nothing_is_none() -> None:
    assert spread_of([], "GB/s", lower_is_better=False) is None


def with_benchmarks(doc: dict[str, Any]) -> dict[str, Any]:
    """The recorded runs predate the suite's "benchmark" key: add it as today's suite writes it."""
    suite = copy.deepcopy(doc["suite"])
    for result in suite["results"]:
        result["benchmark"] = "transfer" if "pinned" in result["name"] or "pageable" in result["name"] else "other"
    return suite


def test_results_below_pass_are_re_measured_once_and_judged_on_both_runs() -> None:
    slow_spell = with_benchmarks(document(ISSUE14 / "runs" / "full-8.json"))
    first = verdict_of({**document(ISSUE14 / "runs" / "full-8.json"), "suite": slow_spell})
    assert below_pass(first, slow_spell) == {"bidir_pinned": "transfer"}
    # A suite older than issue 14 names no benchmark: nothing to re-run.
    assert below_pass(first, document(ISSUE14 / "runs" / "full-8.json")["suite"]) == {}
    again = document(ISSUE14 / "runs" / "full-9.json")["suite"]  # the next run's transfer results
    merged = merge_remeasured(slow_spell, again, {"bidir_pinned"})
    bidir_raw = next(r for r in merged["results"] if r["name"] == "bidir_pinned")
    assert bidir_raw["reps"] == 20 and bidir_raw["extra"]["remeasured"]["first_reps"] == 10
    untouched = next(r for r in merged["results"] if r["name"] == "h2d_pinned")
    assert untouched == next(r for r in slow_spell["results"] if r["name"] == "h2d_pinned")
    verdict = verdict_of({**document(ISSUE14 / "runs" / "full-8.json"), "suite": merged})
    bidir = metric(verdict, "bidir_pinned")
    assert bidir.status is Status.PASS and verdict.status is Status.PASS
    assert "re-measured once: 66.6 GB/s at first, 85.9 GB/s again" in bidir.reason
    # Pooled, the two spells read as one wide spread (run 8's best repetition, 79 GB/s, bridges them).
    assert verdict.unstable == (
        "bidir_pinned: unstable: samples from 65.3 to 88 GB/s (median 80.1; the middle 80% spans 25% of the median)",
    )


def test_a_result_low_in_both_measurements_still_fails() -> None:
    doc = with_benchmarks(document(ISSUE14 / "runs" / "full-1.json"))
    for result in doc["results"]:
        if result["name"] == "h2d_pinned":
            result["value"] *= 0.5
    merged = merge_remeasured(doc, copy.deepcopy(doc), {"h2d_pinned"})
    verdict = verdict_of({**document(ISSUE14 / "runs" / "full-1.json"), "suite": merged})
    assert metric(verdict, "h2d_pinned").status is Status.FAIL
