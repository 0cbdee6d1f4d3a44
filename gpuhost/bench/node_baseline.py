"""`smoke-test --all --baseline`: each node figure (each collective at each size) against the same
figure of an earlier node run, with lines drawn from what healthy nodes did run to run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuhost.bench.node_model import BaselineComparison, NodeFigure, NodeFinding
from gpuhost.bench.rules import NCCL_SMALL_BYTES, Rule, Status, graded, node_problem, node_rule
from gpuhost.problems import Stage, register

NODE_BELOW_BASELINE = register(
    "smoke.node.baseline.below",
    Stage.SMOKE_TEST,
    None,
    "a node figure below the baseline node run's (warning) or far below it (error)",
)


# Against a baseline node run (--all --baseline, e.g. the same node on bare metal), a fraction of the
# baseline's figure: PASS at or above the first line, FAIL below the second; each line, its reason and
# the evidence are rules.NODE_RULES' (the P2P figures take the one-GPU suite's default line).
def _baseline_rule(metric: str, size_bytes: int | None) -> Rule:
    if metric.startswith("nccl_"):
        return node_rule("nccl_small" if size_bytes is not None and size_bytes < NCCL_SMALL_BYTES else "nccl")
    if metric in ("h2d_all", "d2h_all"):
        return node_rule("host_all")
    return node_rule("p2p_pair")


def _baseline_lines(metric: str, size_bytes: int | None) -> tuple[float, float, str]:
    rule = _baseline_rule(metric, size_bytes)
    return rule.baseline_pass, rule.baseline_fail, rule.baseline_why


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
