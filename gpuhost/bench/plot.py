"""`--plot FILE`: the measured points on the GPU's roofline (matplotlib, imported lazily)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhost.bench.models import GpuModel
from gpuhost.bench.results import SuiteRun
from gpuhost.errors import InputError, MissingDependencyError


@dataclass(frozen=True)
class Point:
    label: str
    flop_per_byte: float
    tflops: float


def _gemm_intensity(params: Any, element_bytes: int) -> float:
    m, n, k = (float(params[key]) for key in ("m", "n", "k"))
    return 2.0 * m * n * k / (element_bytes * (m * k + n * k + m * n))


def roofline_points(run: SuiteRun) -> list[Point]:
    """Operational intensity (FLOPs per byte of device memory moved) and rate of each
    measurement that has FLOPs; copies have none and sit outside a log plot."""
    points: list[Point] = []
    sweep = run.get("roofline")
    if sweep is not None:
        for p in sweep.extra.get("points", []):
            points.append(Point(f"FMA sweep {p['fma_per_element']}", float(p["flop_per_byte"]), float(p["TFLOPs"])))
    triad = run.get("triad")
    if triad is not None and triad.value is not None:
        # 2 FLOPs (one FMA) per 16 bytes; the rate is bandwidth x intensity.
        points.append(Point("triad", 2 / 16, triad.value * 2 / 16 / 1000))
    dot = run.get("dot")
    if dot is not None and dot.value is not None:
        points.append(Point("dot", 2 / 8, dot.value * 2 / 8 / 1000))
    for name, element_bytes in (
        ("sgemm", 4),
        ("cublas_fp32", 4),
        ("cublas_tf32", 4),
        ("cublas_fp16", 2),
        ("cublas_bf16", 2),
    ):
        gemm = run.get(name)
        if gemm is not None and gemm.value is not None and {"m", "n", "k"} <= set(gemm.params):
            points.append(Point(name, _gemm_intensity(gemm.params, element_bytes), gemm.value))
    return points


def draw_roofline(run: SuiteRun, model: GpuModel | None, path: Path) -> None:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as error:
        raise MissingDependencyError("matplotlib", "plot", "--plot (the roofline chart)") from error
    matplotlib.use("Agg")  # no display in a guest
    pyplot = importlib.import_module("matplotlib.pyplot")
    points = roofline_points(run)
    if not points:
        raise InputError("--plot: this run measured nothing with FLOPs (run without --quick for the sweep)")
    figure, axes = pyplot.subplots(figsize=(8, 5.5))
    low, high = 0.05, 5000.0
    bandwidth = model.memory_bandwidth_gbps if model else None
    if bandwidth is not None:
        for kind, style in (("fp32", "-"), ("tf32", "--"), ("bf16", "-.")):
            peak = model.peak(kind) if model else None
            if peak is None:
                continue
            ridge = peak * 1000 / bandwidth
            axes.plot(
                [low, ridge, high],
                [bandwidth * low / 1000, peak, peak],
                style,
                color="grey",
                label=f"roof: {bandwidth:g} GB/s, {kind.upper()} {peak:g} TFLOP/s (ridge {ridge:.0f})",
            )
    sweep = [p for p in points if p.label.startswith("FMA sweep")]
    others = [p for p in points if not p.label.startswith("FMA sweep")]
    if sweep:
        axes.plot([p.flop_per_byte for p in sweep], [p.tflops for p in sweep], "o-", label="FMA sweep (measured)")
    for p in others:
        axes.plot([p.flop_per_byte], [p.tflops], "s")
        axes.annotate(p.label, (p.flop_per_byte, p.tflops), textcoords="offset points", xytext=(5, -10), fontsize=8)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("operational intensity (FLOP per byte of device memory)")
    axes.set_ylabel("TFLOP/s")
    title = model.name if model else run.device.name + " (not in the model table: no roof)"
    axes.set_title(f"Roofline: {title}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise InputError(f"--plot: cannot write {path}: {error.strerror}") from error
    finally:
        pyplot.close(figure)
