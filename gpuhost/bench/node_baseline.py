"""`smoke-test --all --baseline`: each node figure (each collective at each size) against the same
figure of an earlier node run, with lines drawn from what healthy nodes did run to run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuhost.bench.node_model import BaselineComparison, NodeFigure, NodeFinding
from gpuhost.bench.rules import BASELINE_WHY, Status, graded, node_problem
from gpuhost.problems import Stage, register

NODE_BELOW_BASELINE = register(
    "smoke.node.baseline.below",
    Stage.SMOKE_TEST,
    None,
    "a node figure below the baseline node run's (warning) or far below it (error)",
)


# Against a baseline node run (--all --baseline, e.g. the same node on bare metal), fraction of the
# baseline's figure: PASS at or above the first, FAIL below the second. Each line sits below what one
# healthy node did run to run, across the 13 runs of each capture (tests/fixtures/h100x4,
# tests/fixtures/h200x2-node), and above the loss it is there to catch:
# - P2P pairs, both at once, all to all: the one-GPU suite's baseline line (rules.BASELINE_WHY); the
#   worst ratio between two healthy runs was 0.965 (all to all, quick against full).
BASELINE_P2P_PASS, BASELINE_P2P_FAIL = 0.95, 0.90
# - collectives from 128 MiB up: 0.941 at worst between two healthy runs (every ordered pair of the
#   11 full runs of the four-H200 guest, tests/fixtures/h200x4-node), 0.958 on the four H100s;
#   guests without their topology reach 56-74% of bare metal (nccl-tests#380: 180 vs 320 GB/s;
#   #256: 260 vs 350), which the FAIL line catches.
BASELINE_NCCL_PASS, BASELINE_NCCL_FAIL = 0.90, 0.75
# - collectives below 128 MiB, where latency dominates: the four H200s moved 0.794 at worst at 8 MiB
#   (reduce_scatter) and 0.899 at 32 MiB, so the 0.90 line WARNed 31 of their 660 comparisons;
#   a path through the host loses more than half at these sizes as at the large ones.
BASELINE_NCCL_SMALL_BYTES = 128 << 20
BASELINE_NCCL_SMALL_PASS, BASELINE_NCCL_SMALL_FAIL = 0.75, 0.50
# - host to every GPU at once, and back: the host's memory is shared with everything else on it and
#   moved 148-196 GB/s over 13 healthy runs of the four-H100 guest (0.758 at worst); a GPU behind the
#   far NUMA node or a halved uplink drops a share by half, which the FAIL line catches.
BASELINE_HOST_PASS, BASELINE_HOST_FAIL = 0.75, 0.50


def _baseline_lines(metric: str, size_bytes: int | None) -> tuple[float, float, str]:
    if metric.startswith("nccl_") and size_bytes is not None and size_bytes < BASELINE_NCCL_SMALL_BYTES:
        return (
            BASELINE_NCCL_SMALL_PASS,
            BASELINE_NCCL_SMALL_FAIL,
            "below 128 MiB latency dominates and a collective moves up to 21% run to run; a path through "
            "the host costs more than half",
        )
    if metric.startswith("nccl_"):
        return (
            BASELINE_NCCL_PASS,
            BASELINE_NCCL_FAIL,
            "a collective varies <= 7% run to run; guests without their topology reach 56-74% of bare metal",
        )
    if metric in ("h2d_all", "d2h_all"):
        return (
            BASELINE_HOST_PASS,
            BASELINE_HOST_FAIL,
            "the host's shared memory moves the aggregate by up to 24% run to run; a far NUMA node or a "
            "halved uplink costs half",
        )
    return BASELINE_P2P_PASS, BASELINE_P2P_FAIL, BASELINE_WHY


def _figure_points(figure: NodeFigure) -> dict[int | None, float | None]:
    """A figure's values by size: a collective's bus bandwidth at each size it was measured at, or
    the figure's one value under None."""
    points = figure.extra.get("points") if figure.metric.startswith("nccl_") else None
    if not points:
        return {None: figure.value}
    return {int(p["bytes"]): p.get("busbw_GBps") for p in points if isinstance(p, dict) and "bytes" in p}


def compare_with_baseline(
    figures: Sequence[NodeFigure], baseline_figures: Sequence[NodeFigure]
) -> list[BaselineComparison]:
    """Each node figure (each collective at each size) against the same one of the baseline run.
    A figure or size the baseline did not measure (a --quick baseline has other sizes) is listed as
    not compared; one the baseline measured as nothing is a WARN, never skipped in silence."""
    theirs = {f.metric: _figure_points(f) for f in baseline_figures}
    comparisons = []
    for figure in figures:
        for size, value in _figure_points(figure).items():
            pass_at, fail_below, why = _baseline_lines(figure.metric, size)
            baseline_points = theirs.get(figure.metric)
            baseline = None if baseline_points is None else baseline_points.get(size)
            percent = None
            if baseline_points is None or size not in baseline_points:
                status, reason = Status.INFO, "the baseline did not measure it: not compared"
            elif value is None:
                status, reason = Status.INFO, "not measured in this run (judged above): not compared"
            elif baseline is None or baseline <= 0:
                status, reason = Status.WARN, "the baseline's figure is null: not compared (is it a finished run?)"
            else:
                fraction = value / baseline
                percent = 100 * fraction
                status = graded(fraction, pass_at, fail_below)
                reason = f"{percent:.0f}% of the baseline (PASS needs >= {pass_at:.0%}): {why}"
            comparisons.append(
                BaselineComparison(
                    figure.metric, figure.label, size, value, baseline, percent, status, reason, figure.gpus
                )
            )
    return comparisons


def _size(size_bytes: int | None) -> str:
    if size_bytes is None:
        return ""
    return f" at {size_bytes / 2**30:g} GiB" if size_bytes >= 2**30 else f" at {size_bytes / 2**20:g} MiB"


def baseline_findings(comparisons: Iterable[BaselineComparison], origin: str) -> list[NodeFinding]:
    findings = []
    for c in comparisons:
        if c.status not in (Status.WARN, Status.FAIL):
            continue
        what = f"{c.label}{_size(c.size_bytes)} against the baseline"
        shown = "-" if c.value is None else f"{c.value:.1f} GB/s"
        against = "" if c.baseline is None else f" against {c.baseline:.1f} GB/s"
        detail = f"{shown}{against}: {c.reason}"
        findings.append(
            NodeFinding(
                what,
                detail,
                c.status,
                node_problem(
                    NODE_BELOW_BASELINE,
                    c.status,
                    what,
                    f"{what} ({origin}): {detail}",
                    "compare the guest's topology with the baseline host's: NCCL_TOPO_FILE, the PCI tree, "
                    "the GPUs' NUMA nodes, peer access",
                ),
                c.gpus,
            )
        )
    return findings
