"""PASS / WARN / FAIL: each measurement against the model's datasheet figure (and a baseline
run when given), and the NVML environment checks, with the thresholds and their reasons.

Thresholds (fraction of the datasheet figure; PASS at or above `pass_at`, FAIL below
`fail_below`, WARN between; a rule without `fail_below` never fails):

| metric | compared with | PASS | FAIL below | why |
| copy, triad | memory bandwidth | 80% | 70% | STREAM-like kernels reach 84-93% on HBM, ~94% on GDDR |
| dot | memory bandwidth | 75% | 60% | a reduction streams like a copy, plus its barriers |
| softmax_online | memory bandwidth | 70% | 55% | one read + one write, plus exponentials |
| roofline (FMA plateau) | FP32 peak | 80% | 60% | pure FMA runs at the clock's FP32 rate; less = clocks held back |
| sgemm (ours) | FP32 peak | 55% | 40% | a good tiled SGEMM reaches 60-75% |
| cublas_bf16, cublas_fp16 | dense peak | 70% | 60% | cuBLAS reaches 75-87% of dense peak |
| cublas_tf32 | dense TF32 peak | 65% | 50% | cuBLAS reaches ~80% |
| cublas_fp32 | FP32 peak | 65% | 50% | cuBLAS SGEMM reaches ~77% (H100) |
| h2d/d2h pinned | PCIe per-direction ceiling | 75% | 60% | good links give 80-87%; a cloud's floor is 48 of 63 GB/s |
| bidir pinned | twice that | 55% | - | full duplex depends on the host's memory system |
| launch_queued | absolute | <= 10 us | > 50 us | a launch costs 2-5 us; passthrough adds no exits to it |
| launch_roundtrip | absolute | <= 25 us | > 100 us | 5-11 us with the wait; more: trapped doorbells, busy vCPU |
| p2p copies | NVLink (or PCIe), one direction | 70% | 30% | a direct path runs near link speed; via host far below |

Each timed result is judged on its capability figure, the 75th percentile of its repetitions
towards the fast end (gpuhost.bench.spread), not on its median; the spread (slowest, median,
fastest, stability) is reported beside it, and an unstable one gets its own line.

Against a baseline (an earlier run, e.g. bare metal): PASS at >= 95% of the baseline's figure,
FAIL below 90%, because well-configured KVM passthrough reaches 98-100% of bare metal; for the
microsecond launch latencies, which jitter by ~10% run to run, PASS within 1.33x and FAIL past 2x.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpuhost.bench.contention import Contention
from gpuhost.bench.environment import (
    VIRTUALIZATION_MODES,
    Environment,
    FabricReading,
    FabricState,
    GpuEnvironment,
    RunSamples,
)
from gpuhost.bench.models import GpuModel
from gpuhost.bench.results import Measurement, SuiteRun
from gpuhost.bench.spread import CAPABILITY_PERCENTILE, Spread, figures_of, spread_of
from gpuhost.problems import Problem, Severity, Stage, register


class Status(enum.Enum):
    PASS = "PASS"  # noqa: S105 (a verdict, not a password)
    INFO = "INFO"  # reported, not judged
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def rank(self) -> int:
        return {"PASS": 0, "INFO": 0, "WARN": 1, "FAIL": 2}[self.value]


def worst(statuses: Iterable[Status]) -> Status:
    result = Status.PASS
    for status in statuses:
        if status.rank > result.rank:
            result = status
    return result


@dataclass(frozen=True)
class Rule:
    metric: str
    label: str
    reference: str | None  # datasheet kind (GpuModel.peak) or None for absolute limits
    pass_at: float | None  # fraction of the reference, or an absolute limit; None: not judged
    fail_below: float | None  # for lower-is-better rules: the limit above which it fails
    why: str
    lower_is_better: bool = False
    # Against a baseline run: PASS at or above this fraction of its figure, FAIL below the second.
    baseline_pass: float = 0.95
    baseline_fail: float = 0.90


RULES: tuple[Rule, ...] = (
    Rule(
        "copy",
        "copy, bytes read + written",
        "memory_bandwidth",
        0.80,
        0.70,
        "STREAM-like copy reaches 84-93% of datasheet bandwidth on HBM parts; below 70% the memory "
        "clock or the GPU is held back",
    ),
    Rule("triad", "triad a*b+c (fused)", "memory_bandwidth", 0.80, 0.70, "same as copy: three streams in, one out"),
    Rule(
        "fused_vs_unfused",
        "fused vs unfused A*B+C speed-up",
        None,
        1.30,
        None,
        "fusion moves 4 instead of 6 arrays (1.5x less); near 1.0x the kernels are not memory-bound as they should be",
    ),
    Rule(
        "dot",
        "dot product (shared-memory reduction)",
        "memory_bandwidth",
        0.75,
        0.60,
        "a reduction streams its inputs like a copy, plus one block reduction",
    ),
    Rule(
        "roofline",
        "FMA roofline plateau (FP32, no tensor cores)",
        "fp32",
        0.80,
        0.60,
        "a pure FMA stream runs at the SM clock's FP32 rate; a shortfall means clocks held back",
    ),
    Rule(
        "sgemm", "our tiled SGEMM", "fp32", 0.55, 0.40, "a cp.async-pipelined 128x128 SGEMM reaches 60-75% of FP32 peak"
    ),
    Rule(
        "cublas_bf16",
        "cuBLASLt BF16 GEMM",
        "bf16",
        0.70,
        0.60,
        "cuBLAS reaches 75-87% of dense BF16 peak on random data",
    ),
    Rule("cublas_fp16", "cuBLASLt FP16 GEMM", "fp16", 0.70, 0.60, "as BF16"),
    Rule("cublas_tf32", "cuBLASLt TF32 GEMM", "tf32", 0.65, 0.50, "cuBLAS reaches ~80% of dense TF32 peak"),
    Rule(
        "cublas_fp32",
        "cuBLASLt FP32 GEMM (no TF32)",
        "fp32",
        0.65,
        0.50,
        "cuBLAS SGEMM reaches ~77% of FP32 peak on an H100",
    ),
    Rule(
        "softmax_online",
        "online softmax (1 read + 1 write)",
        "memory_bandwidth",
        0.70,
        0.55,
        "one read and one write per element plus the exponentials",
    ),
    Rule(
        "softmax_three_pass",
        "three-pass softmax (counted as 1 read + 1 write)",
        "memory_bandwidth",
        0.60,
        None,
        "its re-reads mostly hit the caches; reported beside the online version",
    ),
    Rule(
        "softmax_online_speedup",
        "online vs three-pass softmax speed-up",
        None,
        None,
        None,
        "one memory read instead of three; the caches catch most re-reads of a 16 KB row",
    ),
    Rule(
        "h2d_pinned",
        "host to device, pinned",
        "pcie",
        0.75,
        0.60,
        "pinned copies reach 80-87% of the link's per-direction ceiling",
    ),
    Rule("d2h_pinned", "device to host, pinned", "pcie", 0.75, 0.60, "as host to device"),
    Rule(
        "bidir_pinned",
        "both directions at once, pinned",
        "pcie_both",
        0.55,
        None,
        "full duplex is bounded by the host's memory system and root complex as much as by the link",
    ),
    Rule(
        "h2d_pageable",
        "host to device, pageable",
        None,
        None,
        None,
        "staged through the driver's buffers; varies with the host (6-16 GB/s on the reference guest)",
    ),
    Rule("d2h_pageable", "device to host, pageable", None, None, None, "as host to device, pageable"),
    Rule(
        "launch_queued",
        "kernel launch, back to back",
        None,
        10.0,
        50.0,
        "a launch costs 2-5 us; passthrough adds no VM exits to the launch path",
        lower_is_better=True,
        # A few microseconds jitter by a microsecond run to run: only a large change is a finding.
        baseline_pass=0.75,
        baseline_fail=0.50,
    ),
    Rule(
        "launch_roundtrip",
        "kernel launch + synchronize",
        None,
        25.0,
        100.0,
        "5-11 us with the wait; more means trapped doorbells/interrupts or a starved vCPU",
        lower_is_better=True,
        # A few microseconds jitter by a microsecond run to run: only a large change is a finding.
        baseline_pass=0.75,
        baseline_fail=0.50,
    ),
)
P2P_RULE = Rule(
    "p2p",
    "peer-to-peer copy",
    "nvlink",
    0.70,
    0.30,
    "a direct peer path runs near link speed; staged through host memory it runs far below",
)
BASELINE_WHY = "well-configured passthrough reaches 98-100% of bare metal; 5% allows run-to-run noise"

QUICK_METRICS = (
    "copy",
    "triad",
    "fused_vs_unfused",
    "cublas_bf16",
    "h2d_pinned",
    "d2h_pinned",
    "bidir_pinned",
    "launch_queued",
    "launch_roundtrip",
    "p2p_access",
)
FULL_METRICS = (*(rule.metric for rule in RULES), "p2p_access")
NO_CUBLAS = "built without cuBLAS"


def rule_for(metric: str) -> Rule | None:
    for rule in RULES:
        if rule.metric == metric:
            return rule
    if re.fullmatch(r"p2p_\d+_to_\d+", metric):
        return P2P_RULE
    return None


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


# The smoke-test's problem codes: one per check (its severity varies with the case where None).
MODEL_UNKNOWN = register("smoke.model.unknown", Stage.SMOKE_TEST, Severity.WARNING, "GPU not in the model table")
PCIE_LINK = register(
    "smoke.pcie-link", Stage.SMOKE_TEST, None, "PCIe link down-trained (error), capped or unreadable (warning)"
)
VIRTUALIZATION = register(
    "smoke.virtualization", Stage.SMOKE_TEST, None, "not a passthrough guest: bare metal (info) or vGPU/other (warning)"
)
ECC = register("smoke.ecc", Stage.SMOKE_TEST, None, "ECC unreadable (info) or disabled (warning on datacenter GPUs)")
MEMORY_HEALTH = register(
    "smoke.memory-health",
    Stage.SMOKE_TEST,
    None,
    "row remapping failed (error), remaps/retirements pending or uncorrectable (warning), unreadable (info)",
)
CLOCKS = register(
    "smoke.clocks", Stage.SMOKE_TEST, None, "hardware slowdown (error), thermal slowdown (warning), not sampled (info)"
)
BAR1 = register("smoke.bar1", Stage.SMOKE_TEST, None, "BAR1 smaller than GPU memory (warning) or unreadable (info)")
PERSISTENCE = register("smoke.persistence", Stage.SMOKE_TEST, Severity.INFO, "persistence mode off or unreadable")
FABRIC = register(
    "smoke.fabric",
    Stage.SMOKE_TEST,
    None,
    "a GPU on an NVSwitch fabric has not joined it: Fabric Manager, CUDA error 802 (error); an unknown state (warning)",
)
GPUS = register("smoke.gpus", Stage.SMOKE_TEST, Severity.INFO, "the GPUs the run saw")
DRIVER = register("smoke.driver", Stage.SMOKE_TEST, Severity.INFO, "the driver and CUDA versions")
CONTENTION = register(
    "smoke.contention",
    Stage.SMOKE_TEST,
    None,
    "another process used the GPU (warning; the run is not representative) or the processes are unreadable (info)",
)
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

_SEVERITY_OF = {Status.FAIL: Severity.ERROR, Status.WARN: Severity.WARNING, Status.INFO: Severity.INFO}
_STATUS_OF = {severity: status for status, severity in _SEVERITY_OF.items()}


@dataclass(frozen=True)
class CheckOutcome:
    """One row of the environment table: a check that passed, or the Problem it found.

    Problem has no PASS (a pass is not a problem), but the table and the JSON `checks` list show
    passing checks too, so a row carries either nothing (passed) or its Problem.
    """

    check: str  # e.g. 'pcie link', 'xid 79'
    detail: str  # the row's text, as the table and the JSON show it
    gpu: int | None = None
    problem: Problem | None = None  # None: the check passed

    @property
    def status(self) -> Status:
        return Status.PASS if self.problem is None else _STATUS_OF[self.problem.severity]


def passed(check: str, detail: str, gpu: int | None = None) -> CheckOutcome:
    return CheckOutcome(check, detail, gpu)


def found(code: str, status: Status, check: str, detail: str, gpu: int | None = None, remedy: str = "") -> CheckOutcome:
    """A check's INFO/WARN/FAIL row, its Problem naming the GPU (or 'environment') and the value."""
    if status is Status.PASS:
        raise ValueError(f"check {check!r}: a pass is not a problem (use passed())")
    subject = f"GPU {gpu}" if gpu is not None else "environment"
    message = f"{check} (GPU {gpu}): {detail}" if gpu is not None else f"{check}: {detail}"
    return CheckOutcome(check, detail, gpu, Problem(code, _SEVERITY_OF[status], subject, message, remedy))


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


def _threshold_status(fraction: float, rule: Rule) -> Status:
    assert rule.pass_at is not None
    if fraction >= rule.pass_at:
        return Status.PASS
    if rule.fail_below is not None and fraction < rule.fail_below:
        return Status.FAIL
    return Status.WARN


def _absolute_status(value: float, rule: Rule) -> Status:
    assert rule.pass_at is not None
    if rule.lower_is_better:
        if value <= rule.pass_at:
            return Status.PASS
        return Status.FAIL if rule.fail_below is not None and value > rule.fail_below else Status.WARN
    return _threshold_status(value, rule)


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
                    status = _threshold_status(value / reference, rule)
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
            status = _absolute_status(value, rule)
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
                    f"{baseline_percent:.0f}% of the baseline (PASS needs >= {rule.baseline_pass:.0%}): {BASELINE_WHY}"
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


# ---------------------------------------------------------------- environment
HARDWARE_SLOWDOWN = 0x8 | 0x40 | 0x80  # hw slowdown, hw thermal, hw power brake
SOFTWARE_THERMAL = 0x20


def _link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


# Each per-GPU check's code and what to check when it is not a pass.
_GPU_CHECKS: dict[str, tuple[str, str]] = {
    "model": (MODEL_UNKNOWN, "add its datasheet figures to gpuhost/data/gpu_models.json (or pass --gpu-table)"),
    "pcie link": (PCIE_LINK, "reseat the GPU or riser; check the slot's BIOS link speed and the VM's root port"),
    "virtualization": (VIRTUALIZATION, "none on bare metal; in a guest, pass the GPU through with vfio-pci"),
    "ecc": (ECC, "enable ECC (nvidia-smi -e 1) and reset the GPU"),
    "memory health": (MEMORY_HEALTH, "reset the GPU from the host; if remapping failed, have it serviced"),
    "clocks": (CLOCKS, "check the GPU's cooling and power delivery (not sampled: check NVML in the guest)"),
    "bar1": (BAR1, "enlarge the VM's 64-bit MMIO window (or enable resizable BAR)"),
    "persistence": (PERSISTENCE, "run nvidia-persistenced in the guest"),
    "fabric": (
        FABRIC,
        "run Fabric Manager of exactly the driver's version in the guest (`systemctl enable --now "
        "nvidia-fabricmanager`; `gpuhost guest up` installs and starts it for a VM given the NVSwitches); its "
        "journal names a version mismatch",
    ),
}
# What CUDA does on a GPU whose fabric has not been trained: cuInit fails with
# CUDA_ERROR_SYSTEM_NOT_READY (802), "system not yet initialized".
FABRIC_NOT_READY = "CUDA fails on it with error 802 (system not yet initialized) until Fabric Manager trains the fabric"


def judge_fabric(fabric: FabricReading | None) -> tuple[Status, str] | None:
    """A GPU's NVSwitch fabric state (nvmlDeviceGetGpuFabricInfo): None, no row, for a GPU without
    a fabric (NOT_SUPPORTED: a PCIe GPU, or an SXM one given alone) or where NVML cannot say."""
    if fabric is None or fabric.state is FabricState.NOT_SUPPORTED:
        return None
    if fabric.state is FabricState.COMPLETED:
        if fabric.status == 0:
            return Status.PASS, f"joined its NVSwitch fabric (clique {fabric.clique_id})"
        return (
            Status.FAIL,
            f"its NVSwitch fabric registration completed with NVML error {fabric.status}: {FABRIC_NOT_READY}",
        )
    if fabric.state is FabricState.NOT_STARTED:
        return Status.FAIL, f"attached to an NVSwitch fabric that no Fabric Manager has trained: {FABRIC_NOT_READY}"
    if fabric.state is FabricState.IN_PROGRESS:
        return Status.FAIL, f"attached to an NVSwitch fabric still being trained: {FABRIC_NOT_READY}"
    return Status.WARN, "NVML reports a fabric state this gpuhost does not know: check `nvidia-smi -q` (Fabric)"


def fabric_problems(environment: Environment) -> tuple[Problem, ...]:
    """The GPUs whose fabric is not ready, as the verdict's rows would name them: said with a
    suite that could not run at all (CUDA error 802 stops it before any result)."""
    code, remedy = _GPU_CHECKS["fabric"]
    problems = []
    for gpu in environment.gpus:
        judged = judge_fabric(gpu.fabric)
        if judged is not None and judged[0] is not Status.PASS:
            outcome = found(code, judged[0], "fabric", judged[1], gpu.index, remedy)
            assert outcome.problem is not None
            problems.append(outcome.problem)
    return tuple(problems)


def judge_gpu(gpu: GpuEnvironment, samples: RunSamples | None, model: GpuModel | None) -> list[CheckOutcome]:
    outcomes: list[CheckOutcome] = []

    def add(check: str, status: Status, detail: str) -> None:
        if status is Status.PASS:
            outcomes.append(passed(check, detail, gpu.index))
        else:
            code, remedy = _GPU_CHECKS[check]
            outcomes.append(found(code, status, check, detail, gpu.index, remedy))

    pci_id = f"10de:{gpu.pci_device_id:04x}"
    if model is None:
        add(
            "model",
            Status.WARN,
            f"{gpu.name} ({pci_id}) is not in the GPU model table: measured and reported without percentages",
        )
    else:
        add("model", Status.PASS, f"{gpu.name} ({pci_id}) = {model.name} in the model table")

    # PCIe link: judged on the widest/fastest state seen while the suite ran, because GPUs
    # drop to Gen1 when idle.
    link = gpu.link
    gen = samples.max_link_gen if samples is not None and samples.max_link_gen is not None else link.current_gen
    width = samples.max_link_width if samples is not None and samples.max_link_width is not None else link.current_width
    under = "under load" if samples is not None and samples.count > 0 else "at rest"
    if gen is None or width is None or link.max_gen is None or link.max_width is None:
        add("pcie link", Status.WARN, "NVML could not read the PCIe link")
    elif gen < link.max_gen or width < link.max_width:
        add(
            "pcie link",
            Status.FAIL,
            f"trained at {_link_text(gen, width)} {under}, below the {_link_text(link.max_gen, link.max_width)} "
            "that GPU and slot support: down-trained link (reseat the GPU or riser, check the slot's BIOS "
            "link-speed setting and the host's `lspci -vv` LnkSta)",
        )
    else:
        detail = f"{_link_text(gen, width)} {under} (max {_link_text(link.max_gen, link.max_width)})"
        if link.gpu_max_gen is not None and link.max_gen < link.gpu_max_gen:
            add(
                "pcie link",
                Status.WARN,
                f"{detail}, but the GPU supports Gen{link.gpu_max_gen}: the slot or the VM's emulated root port "
                "caps the link",
            )
        elif model is not None and (link.max_gen < model.pcie_gen or link.max_width < model.pcie_width):
            add("pcie link", Status.WARN, f"{detail}, below the model's {_link_text(model.pcie_gen, model.pcie_width)}")
        else:
            add("pcie link", Status.PASS, detail)

    mode = gpu.virtualization_mode
    mode_name = VIRTUALIZATION_MODES.get(mode, f"mode {mode}") if mode is not None else "unknown"
    if mode == 1:
        add("virtualization", Status.PASS, "passthrough (NVML virtualization mode 1)")
    elif mode == 0:
        add("virtualization", Status.INFO, "none: not a passthrough guest (bare metal, fine for a baseline run)")
    else:
        add("virtualization", Status.WARN, f"{mode_name}: expected passthrough")

    if gpu.ecc_current is None:
        add("ecc", Status.INFO, "ECC not supported or not readable on this GPU")
    elif gpu.ecc_current:
        pending = "" if gpu.ecc_pending in (None, True) else " (disabled at next reset)"
        add("ecc", Status.PASS, "enabled" + pending)
    else:
        datacenter = model is None or model.datacenter
        add(
            "ecc",
            Status.WARN if datacenter else Status.INFO,
            "disabled: memory errors go undetected (datacenter GPUs ship with ECC on)",
        )

    if gpu.remapped_rows_failure:
        add("memory health", Status.FAIL, "row remapping failed: the GPU needs service (RMA)")
    elif gpu.remapped_rows_pending:
        add("memory health", Status.WARN, "row remapping pending: reset the GPU (from the host) to apply it")
    elif gpu.remapped_rows_uncorrectable:
        add("memory health", Status.WARN, f"{gpu.remapped_rows_uncorrectable} rows remapped for uncorrectable errors")
    elif gpu.retired_pages_pending:
        add("memory health", Status.WARN, "page retirement pending: reset the GPU to apply it")
    elif gpu.retired_pages_double_bit:
        add("memory health", Status.WARN, f"{gpu.retired_pages_double_bit} pages retired for double-bit errors")
    elif gpu.remapped_rows_correctable is None and gpu.retired_pages_pending is None:
        add("memory health", Status.INFO, "neither remapped rows nor retired pages readable")
    else:
        rows = gpu.remapped_rows_correctable or 0
        add("memory health", Status.PASS, f"no pending remaps or retirements ({rows} rows remapped, correctable)")

    if samples is None or samples.count == 0:
        add("clocks", Status.INFO, "not sampled during the run")
    else:
        clock = (
            f"SM clock {samples.min_sm_clock_mhz}-{samples.max_sm_clock_mhz} MHz "
            f"(max {gpu.max_sm_clock_mhz}), {samples.count} samples"
        )
        names = ", ".join(samples.throttle_names) or "none"
        if samples.throttle_reasons & HARDWARE_SLOWDOWN:
            add(
                "clocks",
                Status.FAIL,
                f"{clock}; hardware slowdown during the run ({names}): cooling or power delivery is failing, "
                "the figures are not the GPU's",
            )
        elif samples.throttle_reasons & SOFTWARE_THERMAL:
            add("clocks", Status.WARN, f"{clock}; thermal slowdown during the run ({names})")
        else:
            add("clocks", Status.PASS, f"{clock}; clock limits seen: {names} (power cap under GEMM is normal)")

    if gpu.bar1_bytes is None:
        add("bar1", Status.INFO, "BAR1 size not readable")
    elif gpu.memory_bytes is not None and gpu.bar1_bytes < gpu.memory_bytes:
        add(
            "bar1",
            Status.WARN,
            f"BAR1 {gpu.bar1_bytes / 2**30:.3g} GiB is smaller than the {gpu.memory_bytes / 2**30:.0f} GiB of GPU "
            "memory: the VM's 64-bit MMIO window (or resizable BAR) is small; GPUDirect and large mappings suffer",
        )
    else:
        add("bar1", Status.PASS, f"{gpu.bar1_bytes / 2**30:.0f} GiB")

    fabric = judge_fabric(gpu.fabric)
    if fabric is not None:
        add("fabric", *fabric)

    if gpu.persistence_mode is None:
        add("persistence", Status.INFO, "persistence mode not readable")
    elif gpu.persistence_mode:
        add("persistence", Status.PASS, "enabled")
    else:
        add(
            "persistence",
            Status.INFO,
            "disabled: the driver re-initialises the GPU for each first CUDA process (slower start); "
            "run nvidia-persistenced in the guest",
        )
    return outcomes


def judge_environment(
    environment: Environment,
    samples: tuple[RunSamples, ...],
    models: dict[int, GpuModel | None],
) -> list[CheckOutcome]:
    cuda = environment.cuda_driver_version
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "unknown"
    names = ", ".join(f"{g.index}: {g.name} (10de:{g.pci_device_id:04x}) at {g.pci_bus_id}" for g in environment.gpus)
    outcomes = [
        found(GPUS, Status.INFO, "gpus", f"{len(environment.gpus)} visible: {names}"),
        found(DRIVER, Status.INFO, "driver", f"driver {environment.driver_version}, CUDA {cuda_text}"),
    ]
    by_index = {s.index: s for s in samples}
    for gpu in environment.gpus:
        outcomes.extend(judge_gpu(gpu, by_index.get(gpu.index), models.get(gpu.index)))
    return outcomes


def judge_contention(contention: Contention | None) -> list[CheckOutcome]:
    """Other processes on the GPUs around the run (none: a recorded run from before issue 14)."""
    if contention is None:
        return []
    if contention.busy:
        by_gpu: dict[int, list[str]] = {}
        for process in contention.processes:
            by_gpu.setdefault(process.gpu, []).append(process.describe())
        return [
            found(
                CONTENTION,
                Status.WARN,
                "contention",
                f"another process used the GPU around the run: {'; '.join(described)}. The figures measure a "
                "shared GPU, not its capability: stop it and run again (or pass --allow-busy to judge them anyway)",
                gpu,
                "stop the other process and run again (or pass --allow-busy)",
            )
            for gpu, described in sorted(by_gpu.items())
        ]
    if not contention.readable:
        return [
            found(
                CONTENTION,
                Status.INFO,
                "contention",
                "NVML could not list the processes on the GPU: another process there would go unnoticed",
            )
        ]
    utilization = ", ".join(
        f"GPU {index} {'?' if pct is None else pct}%" for index, pct in enumerate(contention.utilization_before_pct)
    )
    return [
        passed(
            "contention",
            f"no other process on the GPU before, during or after the run (utilization before it: {utilization})",
        )
    ]


def judge(
    run: SuiteRun,
    *,
    model: GpuModel | None,
    checks: Iterable[CheckOutcome] = (),
    baseline: SuiteRun | None = None,
    complete: bool = True,
    contention: Contention | None = None,
) -> Verdict:
    """The verdict on one suite run. `checks` are the environment's (judge_environment, judge_health);
    `complete` is False when only some benchmarks were selected (no "not measured" warnings)."""
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
    for name in expected:
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
