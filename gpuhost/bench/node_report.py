"""`smoke-test --all`'s text: the node's matrix, measurements, checks and one verdict line per GPU,
each GPU named by NVML's index and its PCI address."""

from __future__ import annotations

from gpuhost.bench.node_model import NodeOutcome
from gpuhost.bench.report import table


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _size_cell(size_bytes: int | None, prefix: str = "") -> str:
    if size_bytes is None:
        return "" if prefix else "-"
    return prefix + (f"{size_bytes / 2**30:g} GiB" if size_bytes >= 2**30 else f"{size_bytes / 2**20:g} MiB")


def render_node(outcome: NodeOutcome, *, verbose: bool = False) -> str:
    """The node's part of the --all report: the matrix, the host copies, the collectives, the
    findings, one verdict per GPU and the node's."""

    verdict, record = outcome.verdict, outcome.record
    n = record.gpu_count
    gpus = record.indices
    lines = [f"Node: {n} GPU(s): " + ", ".join(outcome.describe_gpu(g) for g in gpus)]
    if outcome.left_out is not None:
        lines.append(f"Not judged: {outcome.left_out}")
    figures = {f.metric: f for f in verdict.figures}
    if n >= 2 and any(name.startswith("p2p_pair_") for name in figures):
        lines.append("P2P matrix, one direction, GB/s (row: source, column: destination)")
        rows = [
            [
                f"GPU {a}",
                *("-" if a == b else _cell(getattr(figures.get(f"p2p_pair_{a}_to_{b}"), "value", None)) for b in gpus),
            ]
            for a in gpus
        ]
        lines.extend(table(["", *(f"GPU {b}" for b in gpus)], rows, set(range(1, n + 1))))
    rows = [
        [
            f.status.value,
            f.label,
            _cell(f.value),
            "-" if f.percent_of_reference is None else f"{f.percent_of_reference:.0f}%",
            "-" if f.reference is None else f"{f.reference:.0f} GB/s ({f.reference_kind})",
        ]
        for f in verdict.figures
        if not f.metric.startswith("p2p_pair_")
    ]
    if rows:
        lines.append("Node measurements")
        lines.extend(table(["status", "measurement", "GB/s", "% link", "link"], rows, {2, 3}))
    for f in verdict.figures:
        points = f.extra.get("points") if f.metric.startswith("nccl_") else None
        if points:
            sizes = ", ".join(f"{p['bytes'] / 2**20:.0f} MiB {p['busbw_GBps']:.1f}" for p in points)
            lines.append(f"  {f.label} by size (GB/s): {sizes}")
        shares = f.extra.get("per_gpu")
        if shares:
            lines.append(
                f"  {f.label}, each GPU's share (GB/s): " + ", ".join(f"GPU {p['gpu']} {p['GBps']:.1f}" for p in shares)
            )
    if outcome.baseline is not None:
        lines.append(f"Against the baseline {outcome.baseline}")
        lines.extend(
            table(
                ["status", "measurement", "size", "GB/s", "baseline", "% baseline"],
                [
                    [
                        c.status.value,
                        c.label,
                        _size_cell(c.size_bytes),
                        _cell(c.value),
                        _cell(c.baseline),
                        "-" if c.percent_of_baseline is None else f"{c.percent_of_baseline:.0f}%",
                    ]
                    for c in verdict.baseline
                ],
                {2, 3, 4, 5},
            )
        )
    if verbose:
        lines.append("Why each threshold")
        lines.extend(f"  {f.metric}: {f.reason}" for f in verdict.figures)
        lines.extend(
            f"  {c.metric}{_size_cell(c.size_bytes, ' ')} against the baseline: {c.reason}" for c in verdict.baseline
        )
    checks = [[f.status.value, f.check, f.detail] for f in verdict.findings]
    if checks:
        lines.append("Node checks")
        lines.extend(table(["status", "check", "detail"], checks, set()))
    if record.nccl_library is not None:
        lines.append(f"NCCL: {record.nccl_library}")
    if verdict.reasons:
        lines.append("Node findings:")
        lines.extend(f"  - {reason}" for reason in verdict.reasons)
    lines.append("")
    per_gpu: list[tuple[int, str]] = [
        (s.gpu, f"VERDICT {outcome.describe_gpu(s.gpu)}: FAIL (cannot run: {s.reason})") for s in outcome.stopped
    ]
    for gpu in outcome.gpus:
        index = gpu.run.device.index
        per_gpu.append(
            (
                index,
                f"VERDICT {outcome.describe_gpu(index)}: {gpu.verdict.outcome}"
                + (
                    ""
                    if gpu.verdict.representative
                    else f" (another process used GPU {index}; {gpu.verdict.status.value} as measured)"
                ),
            )
        )
    lines.extend(line for _, line in sorted(per_gpu))
    node = verdict.outcome if n >= 2 else "no node measurements (one GPU)"
    lines.append(f"VERDICT node: {node}")
    lines.append(f"VERDICT: {outcome.outcome} ({n} GPU(s), {outcome.seconds:.1f} s)")
    return "\n".join(lines) + "\n"
