"""The human report of a smoke test, as plain text (the guest may not have rich)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuhost.bench.jsonout import Timings
from gpuhost.bench.results import SuiteRun
from gpuhost.bench.verdict import Verdict


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        return "  ".join(parts).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{text} {unit}".rstrip()


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def render(
    verdict: Verdict,
    run: SuiteRun,
    *,
    timings: Timings | None = None,
    model_table: str = "",
    with_baseline: bool = False,
    verbose: bool = False,
) -> str:
    lines: list[str] = []
    device = run.device
    mode = "quick" if run.quick else "full"
    lines.append(
        f"gpuhost smoke-test ({mode}): GPU {device.index} {device.name}, {device.sm_count} SMs, "
        f"compute capability {device.compute_capability}, bus {device.pci_bus_id}"
    )
    if verdict.model is not None:
        lines.append(
            f"model: {verdict.model.name} (datasheet figures from {model_table or 'the model table'}; "
            f"sources: {'; '.join(verdict.model.sources)})"
        )
    else:
        lines.append("model: not in the GPU model table: results are measured and reported without percentages")
    lines.append("")
    lines.append("Environment (NVML)")
    lines.extend(
        table(
            ["status", "check", "detail"],
            [
                [c.status.value, c.check + (f" [GPU {c.gpu}]" if c.gpu is not None else ""), c.detail]
                for c in verdict.checks
            ],
            set(),
        )
    )
    lines.append("")
    lines.append(
        "Results (judged: the 75th percentile of the timed repetitions towards the fast end; each result checked "
        "against a reference first)"
    )
    headers = ["status", "measurement", "judged", "% datasheet", "datasheet"]
    if with_baseline:
        headers += ["% baseline", "baseline"]
    headers += ["slowest", "median", "fastest", "stability"]
    rows = []
    for m in verdict.metrics:
        reference = "-" if m.reference is None else f"{m.reference:.4g} {m.unit}"
        row = [
            m.status.value + ("" if m.verified else "!"),
            m.label,
            _number(m.judged_value, m.unit),
            _percent(m.percent_of_reference),
            reference,
        ]
        if with_baseline:
            row += [_percent(m.percent_of_baseline), "-" if m.baseline is None else f"{m.baseline:.4g} {m.unit}"]
        spread = m.spread
        if spread is None:
            row += ["-", _number(m.value, ""), "-", "-"]
        else:
            row += [
                _number(spread.worst, ""),
                _number(spread.median, ""),
                _number(spread.best, ""),
                f"{spread.stability_pct:.1f}%" + (" ~" if spread.unstable else ""),
            ]
        rows.append(row)
    lines.extend(table(headers, rows, set(range(2, len(headers)))))
    if any(not m.verified for m in verdict.metrics):
        lines.append("  ! = the result did not match its reference")
    lines.append("  stability = 10th-90th percentile width over the median; ~ = unstable (see below)")
    if verbose:
        lines.append("")
        lines.append("Why each threshold")
        lines.extend(f"  {m.metric}: {m.reason}" for m in verdict.metrics)
    lines.append("")
    if timings is not None:
        build = "cached build" if timings.build_cached else f"build {timings.build_s:.1f} s"
        lines.append(f"time: {build}, suite {timings.suite_s:.1f} s, total {timings.total_s:.1f} s")
    if verdict.reasons:
        lines.append("Findings:")
        lines.extend(f"  - {reason}" for reason in verdict.reasons)
    if verdict.unstable:
        lines.append("Unstable (said apart: the verdict judges capability, which these do not lower):")
        lines.extend(f"  - {line}" for line in verdict.unstable)
    if verdict.representative:
        lines.append(f"VERDICT: {verdict.status.value}")
    else:
        lines.append(
            f"VERDICT: {verdict.outcome} (another process used the GPU: the results above, "
            f"{verdict.status.value} as measured, describe a shared GPU)"
        )
    return "\n".join(lines) + "\n"
