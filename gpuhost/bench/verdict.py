"""PASS / WARN / FAIL: each measurement against the model's datasheet figure (and a baseline
run when given), and the NVML environment checks, with the thresholds and their reasons.

The thresholds, each with its reason, are gpuhost.bench.rules' (RULES, P2P_RULE; the node's
NODE_RULES), and docs/reference/thresholds.md is generated from them.

Each timed result is judged on its capability figure, the 75th percentile of its repetitions
towards the fast end (gpuhost.bench.spread), not on its median; the spread (slowest, median,
fastest, stability) is reported beside it, and an unstable one gets its own line.

Against a baseline (an earlier run, e.g. bare metal): each rule's baseline lines, by default PASS
at >= 95% of the baseline's figure and FAIL below 90%, because well-configured KVM passthrough
reaches 98-100% of bare metal; wider where one healthy node moves more than that run to run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpuhost.bench.contention import Contention, judge_contention
from gpuhost.bench.models import GpuModel
from gpuhost.bench.results import Measurement, SuiteRun
from gpuhost.bench.rules import (
    FULL_METRICS,
    NO_CUBLAS,
    NODE_JUDGED_METRICS,
    P2P_RULE,
    QUICK_METRICS,
    CheckOutcome,
    Rule,
    Status,
    absolute_status,
    found,
    rule_for,
    threshold_status,
    worst,
)
from gpuhost.bench.spread import CAPABILITY_PERCENTILE, Spread, figures_of, spread_of
from gpuhost.problems import Problem, Severity, Stage, register


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    label: str
    value: float | None
    unit: str
    reference: float | None  # the datasheet figure compared with
    reference_kind: str | None
    percent_of_reference: float | None
    baseline: float | None
    percent_of_baseline: float | None  # >100 is better than the baseline, for every metric
    verified: bool
    status: Status
    reason: str
    judged_value: float | None = None  # the capability figure the status was decided on
    spread: Spread | None = None  # of the timed repetitions; None for untimed results


BASELINE_OTHER_GPU = register(
    "smoke.baseline.other-gpu", Stage.SMOKE_TEST, Severity.WARNING, "the baseline ran on another GPU model"
)

BENCHMARK_NO_CUBLAS = register(
    "smoke.benchmark.no-cublas", Stage.SMOKE_TEST, Severity.WARNING, "suite built without cuBLAS: GEMMs unmeasured"
)

BENCHMARK_FAILED = register("smoke.benchmark.failed", Stage.SMOKE_TEST, Severity.ERROR, "a benchmark did not complete")

METRIC_MISSING = register(
    "smoke.metric.missing", Stage.SMOKE_TEST, Severity.WARNING, "an expected measurement is missing"
)


@dataclass(frozen=True)
class Verdict:
    status: Status
    model: GpuModel | None
    metrics: tuple[MetricVerdict, ...]
    checks: tuple[CheckOutcome, ...]
    reasons: tuple[str, ...]  # one line per WARN/FAIL, naming the measurement or check
    # One line per judged result whose repetitions split in two or spread wide: said apart from
    # the capability verdict, which it does not lower.
    unstable: tuple[str, ...] = ()
    # False when another process used the GPU: the figures measure a shared GPU, and the outcome
    # is "not representative" whatever the status says.
    representative: bool = True

    @property
    def outcome(self) -> str:
        return self.status.value if self.representative else NOT_REPRESENTATIVE

    @property
    def problems(self) -> tuple[Problem, ...]:
        """The environment checks' problems (INFO/WARN/FAIL rows), in table order."""
        return tuple(check.problem for check in self.checks if check.problem is not None)


NOT_REPRESENTATIVE = "NOT REPRESENTATIVE"


def _fmt(value: float, unit: str) -> str:
    return f"{value:.3g} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"


def _p2p_reference(measurement: Measurement, model: GpuModel | None) -> tuple[str | None, float | None]:
    if model is None:
        return None, None
    if not measurement.params.get("peer_access", False):
        return None, None  # staged through the host: the p2p_access check carries the finding
    if model.nvlink_gbps is not None:
        return "nvlink", model.nvlink_gbps
    return "pcie", model.pcie_ceiling_gbps


def measured_ridge(measurement: Measurement) -> float | None:
    """Where the roofline sweep turns compute-bound: its FLOP plateau over its best bandwidth."""
    points = measurement.extra.get("points") or []
    bandwidths = [float(p["GBps"]) for p in points if isinstance(p, dict) and p.get("GBps")]
    if not bandwidths or measurement.value is None:
        return None
    return measurement.value * 1000.0 / max(bandwidths)


def measurement_spread(measurement: Measurement, lower_is_better: bool) -> Spread | None:
    """The spread of a timed result's repetitions (None when it has no samples)."""
    if measurement.value is None or not measurement.median_ms or not measurement.samples_ms:
        return None
    figures = figures_of(measurement.value, measurement.median_ms, measurement.samples_ms, lower_is_better)
    return spread_of(figures, measurement.unit, lower_is_better)


def _judged(measurement: Measurement, rule: Rule | None) -> float | None:
    if measurement.value is None:
        return None
    spread = measurement_spread(measurement, rule is not None and rule.lower_is_better)
    return spread.capability if spread is not None else measurement.value


def judge_measurement(
    measurement: Measurement, model: GpuModel | None, baseline: Measurement | None, gpu_count: int
) -> MetricVerdict:
    rule = rule_for(measurement.name)
    label = rule.label if rule else measurement.name
    pair = re.fullmatch(r"p2p_(\d+)_to_(\d+)", measurement.name)
    if pair:
        label = f"{label}, GPU {pair.group(1)} -> GPU {pair.group(2)}"
    elif measurement.name == "p2p_access":
        label = "GPU pairs with peer access"
    spread = measurement_spread(measurement, rule is not None and rule.lower_is_better)
    # Judged on the capability figure; the median stays the reported `value`.
    value = _judged(measurement, rule)
    statuses: list[Status] = []
    reasons: list[str] = []
    reference_kind: str | None = None
    reference: float | None = None
    percent: float | None = None

    if not measurement.verified:
        statuses.append(Status.FAIL)
        reasons.append(f"wrong result, not timed as a pass: {measurement.check}")
    if value is None:
        statuses.append(Status.FAIL)
        reasons.append("not measured")
    elif spread is not None and rule is not None and rule.pass_at is not None:
        reasons.append(f"the {CAPABILITY_PERCENTILE}th percentile of {spread.samples} repetitions towards the fast end")

    if measurement.name == "p2p_access":
        pairs = int(measurement.params.get("ordered_pairs", 0))
        if gpu_count < 2:
            statuses.append(Status.INFO)
            reasons.append("one GPU in this guest: no peer path to test")
        elif value is not None and value >= pairs:
            statuses.append(Status.PASS)
            reasons.append(f"peer access between all {pairs} ordered pairs")
        else:
            expected = model is None or model.p2p_expected
            statuses.append(Status.FAIL if expected else Status.INFO)
            reasons.append(
                f"peer access on {value:.0f} of {pairs} ordered GPU pairs: multi-GPU copies go through host memory"
                + (" (ACS/ATS or the VM's PCIe topology block P2P)" if expected else " (this model has no P2P)")
            )
    elif rule is None:
        statuses.append(Status.INFO)
        reasons.append("no rule for this measurement")
    elif value is not None:
        if rule is P2P_RULE:
            reference_kind, reference = _p2p_reference(measurement, model)
        elif rule.reference is not None and model is not None:
            reference_kind, reference = rule.reference, model.peak(rule.reference)
        if rule.reference is not None:
            if reference is not None and reference > 0:
                percent = 100.0 * value / reference
                if rule.pass_at is not None:
                    status = threshold_status(value / reference, rule)
                    statuses.append(status)
                    needed = f"PASS needs >= {rule.pass_at:.0%}"
                    reasons.append(f"{percent:.0f}% of {_fmt(reference, measurement.unit)} ({needed}): {rule.why}")
                else:
                    statuses.append(Status.INFO)
                    reasons.append(rule.why)
            else:
                statuses.append(Status.INFO)
                reasons.append(
                    "no datasheet figure to compare with"
                    + ("" if model is not None else " (unknown GPU model)")
                    + ("" if rule is not P2P_RULE or measurement.params.get("peer_access") else "; staged through host")
                )
        elif rule.pass_at is not None:
            status = absolute_status(value, rule)
            statuses.append(status)
            bound = "<=" if rule.lower_is_better else ">="
            reasons.append(f"PASS needs {bound} {rule.pass_at:g} {measurement.unit}: {rule.why}")
        else:
            statuses.append(Status.INFO)
            reasons.append(rule.why)

    remeasured = measurement.extra.get("remeasured")
    if isinstance(remeasured, dict):
        reasons.append(
            f"re-measured once: {_fmt(float(remeasured.get('first_value') or 0), measurement.unit)} at first, "
            f"{_fmt(float(remeasured.get('again_value') or 0), measurement.unit)} again; judged on both together"
        )
    ridge = measured_ridge(measurement) if measurement.name == "roofline" else None
    if ridge is not None:
        reasons.append(f"the sweep turns compute-bound near {ridge:.0f} FLOP/byte")

    baseline_value: float | None = None
    baseline_percent: float | None = None
    baseline_judged = _judged(baseline, rule) if baseline is not None else None
    if baseline_judged is not None and value is not None and baseline_judged > 0 and value > 0:
        baseline_value = baseline_judged
        lower_better = rule is not None and rule.lower_is_better
        fraction = baseline_value / value if lower_better else value / baseline_value
        baseline_percent = 100.0 * fraction
        if rule is not None and rule.pass_at is not None:  # judged rules only
            status = (
                Status.PASS
                if fraction >= rule.baseline_pass
                else Status.WARN
                if fraction >= rule.baseline_fail
                else Status.FAIL
            )
            statuses.append(status)
            if status is not Status.PASS:
                reasons.append(
                    f"{baseline_percent:.0f}% of the baseline (PASS needs >= {rule.baseline_pass:.0%}): "
                    + rule.baseline_why
                )
    elif baseline is not None and value is not None and rule is not None and rule.pass_at is not None:
        # The comparison asked for cannot be made: said, never skipped in silence.
        statuses.append(Status.WARN)
        shown = "null" if baseline_judged is None else f"{baseline_judged:g}"
        reasons.append(f"the baseline's figure is {shown}: not compared with it (is the baseline a finished run?)")

    final = worst(statuses) if statuses else Status.INFO
    if statuses and all(s is Status.INFO for s in statuses):
        final = Status.INFO
    return MetricVerdict(
        metric=measurement.name,
        label=label,
        value=measurement.value,
        unit=measurement.unit,
        reference=reference,
        reference_kind=reference_kind,
        percent_of_reference=percent,
        baseline=baseline_value,
        percent_of_baseline=baseline_percent,
        verified=measurement.verified,
        status=final,
        reason="; ".join(reasons),
        judged_value=value,
        spread=spread,
    )


def judge(
    run: SuiteRun,
    *,
    model: GpuModel | None,
    checks: Iterable[CheckOutcome] = (),
    baseline: SuiteRun | None = None,
    complete: bool = True,
    contention: Contention | None = None,
    in_node: bool = False,
) -> Verdict:
    """The verdict on one suite run. `checks` are the environment's (judge_environment, judge_health);
    `complete` is False when only some benchmarks were selected (no "not measured" warnings);
    `in_node`: one GPU's run of smoke-test --all, whose P2P the node judges (NODE_JUDGED_METRICS)."""
    all_checks = [*checks, *judge_contention(contention)]
    if baseline is not None and baseline.device.name != run.device.name:
        all_checks.append(
            found(
                BASELINE_OTHER_GPU,
                Status.WARN,
                "baseline",
                f"the baseline ran on {baseline.device.name}, this run on {run.device.name}: not compared",
                remedy="compare with a baseline recorded on the same GPU model",
            )
        )
        baseline = None
    for error in run.errors:
        if error.message.startswith(NO_CUBLAS) or NO_CUBLAS in error.message:
            all_checks.append(
                found(
                    BENCHMARK_NO_CUBLAS,
                    Status.WARN,
                    f"benchmark {error.benchmark}",
                    "cuBLAS was not found when the suite was built: GEMM throughput unproven (install the CUDA "
                    "toolkit's libcublas, or `pip install nvidia-cublas`)",
                    remedy="install the CUDA toolkit's libcublas (or `pip install nvidia-cublas`) and run again",
                )
            )
        else:
            all_checks.append(
                found(
                    BENCHMARK_FAILED,
                    Status.FAIL,
                    f"benchmark {error.benchmark}",
                    f"did not complete: {error.message}",
                    remedy="read the benchmark's error; check the GPU's Xid events and the driver",
                )
            )
    metrics = tuple(
        judge_measurement(m, model, baseline.get(m.name) if baseline else None, run.device.count)
        for m in run.measurements
    )
    measured = {m.metric for m in metrics}
    failed_benchmarks = {e.benchmark for e in run.errors}
    expected = QUICK_METRICS if run.quick else FULL_METRICS
    for name in (name for name in expected if not (in_node and name in NODE_JUDGED_METRICS)):
        if complete and name not in measured and not failed_benchmarks:
            all_checks.append(found(METRIC_MISSING, Status.WARN, f"metric {name}", "expected but not measured"))

    reasons = [
        f"{c.status.value} {c.check}" + (f" (GPU {c.gpu})" if c.gpu is not None else "") + f": {c.detail}"
        for c in all_checks
        if c.status in (Status.WARN, Status.FAIL)
    ]
    for m in metrics:
        if m.status in (Status.WARN, Status.FAIL):
            value = "not measured" if m.judged_value is None else _fmt(m.judged_value, m.unit)
            reasons.append(f"{m.status.value} {m.metric}: {value}; {m.reason}")
    unstable = tuple(
        f"{m.metric}: {m.spread.describe_instability()}"
        for m in metrics
        if m.spread is not None and m.spread.unstable and _is_judged(m.metric)
    )
    status = worst([*(c.status for c in all_checks), *(m.status for m in metrics)])
    representative = contention is None or not contention.busy
    return Verdict(status, model, metrics, tuple(all_checks), tuple(reasons), unstable, representative)


def _is_judged(metric: str) -> bool:
    rule = rule_for(metric)
    return rule is not None and rule.pass_at is not None
