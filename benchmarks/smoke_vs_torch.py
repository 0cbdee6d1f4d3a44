"""Run the gpuhost kernel suite and the same operations through PyTorch on the same GPU, in
the same run, and print our figures against PyTorch's with the issue's targets.

Not a unit test: it needs a CUDA GPU, nvcc and PyTorch. Usage, from the repository root:

    python3 benchmarks/smoke_vs_torch.py [--out DIR] [--reps N]

Targets (issue 5): copy and triad >= 1.00x PyTorch's copy bandwidth; cuBLAS BF16 GEMM through
the suite >= 0.98x torch.matmul; our SGEMM >= 0.8x cuBLAS FP32; our online softmax >= 1.0x
torch.softmax on rows that fit one block; pinned copies >= 0.98x PyTorch's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuhost.bench.build import build_suite


def time_cuda(torch: Any, op: Callable[[], object], warmup: int, reps: int) -> float:
    """Median milliseconds of `op` between CUDA events, after warm-up (the suite's method)."""
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        op()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def _bandwidth_figures(torch: Any, suite: dict[str, dict[str, Any]], reps: int) -> dict[str, float]:
    dev = torch.device("cuda")
    copy_bytes = int(suite["copy"]["params"]["bytes_per_buffer"])
    n = copy_bytes // 4
    src = torch.rand(n, device=dev) * 2 - 1
    dst = torch.empty_like(src)
    b = torch.rand(n, device=dev)
    c = torch.rand(n, device=dev)
    copy_ms = time_cuda(torch, lambda: dst.copy_(src), 3, reps)
    triad_ms = time_cuda(torch, lambda: torch.addcmul(c, src, b, out=dst), 3, reps)
    return {"copy": 2 * copy_bytes / (copy_ms * 1e6), "triad": 4 * copy_bytes / (triad_ms * 1e6)}


def _matmul_tflops(torch: Any, size: int, dtype: Any, tf32: bool, reps: int) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(size, size, device="cuda").to(dtype)
    b = torch.randn(size, size, device="cuda").to(dtype)
    ms = time_cuda(torch, lambda: torch.matmul(a, b), 3, reps)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * size**3 / (ms * 1e9)


def _softmax_gbps(torch: Any, rows: int, cols: int, reps: int) -> float:
    x = torch.rand(rows, cols, device="cuda") * 16 - 8
    ms = time_cuda(torch, lambda: torch.softmax(x, dim=-1), 3, reps)
    return 2 * rows * cols * 4 / (ms * 1e6)


def _pinned_figures(torch: Any, link_bytes: int) -> dict[str, float]:
    host = torch.empty(link_bytes // 4, dtype=torch.float32, pin_memory=True)
    host.fill_(1.0)
    gpu = torch.empty(link_bytes // 4, dtype=torch.float32, device="cuda")
    h2d_ms = time_cuda(torch, lambda: gpu.copy_(host, non_blocking=True), 2, 10)
    d2h_ms = time_cuda(torch, lambda: host.copy_(gpu, non_blocking=True), 2, 10)
    return {"h2d_pinned": link_bytes / (h2d_ms * 1e6), "d2h_pinned": link_bytes / (d2h_ms * 1e6)}


def torch_figures(torch: Any, suite: dict[str, dict[str, Any]], reps: int) -> dict[str, float]:
    """The same operations at the same sizes through PyTorch (TF32 off unless named)."""
    torch.backends.cudnn.allow_tf32 = False
    out = _bandwidth_figures(torch, suite, reps)
    size = int(suite["cublas_bf16"]["params"]["m"])
    out["matmul_bf16"] = _matmul_tflops(torch, size, torch.bfloat16, False, reps)
    out["matmul_fp16"] = _matmul_tflops(torch, size, torch.float16, False, reps)
    out["matmul_fp32"] = _matmul_tflops(torch, size, torch.float32, False, 8)
    out["matmul_tf32"] = _matmul_tflops(torch, size, torch.float32, True, reps)
    params = suite["softmax_online"]["params"]
    out["softmax"] = _softmax_gbps(torch, int(params["rows"]), int(params["cols"]), reps)
    out.update(_pinned_figures(torch, int(suite["h2d_pinned"]["params"]["bytes"])))
    torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the suite's JSON and this comparison")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 2
    capability = torch.cuda.get_device_capability(0)

    # Fresh cache: the wall time below includes compiling the suite.
    with tempfile.TemporaryDirectory() as cache:
        started = time.monotonic()
        built = build_suite(capability, cache_dir=Path(cache))
        run = subprocess.run([str(built.binary)], capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
    if run.returncode not in (0, 3):
        print(run.stderr, file=sys.stderr)
        return 1
    document = json.loads(run.stdout)
    suite = {r["name"]: r for r in document["results"]}
    theirs = torch_figures(torch, suite, args.reps)

    rows: list[tuple[str, float, float, float, bool]] = []

    def target(label: str, ours: float, reference: float, needed: float) -> None:
        ratio = ours / reference
        rows.append((label, ours, reference, ratio, ratio >= needed))

    target("copy vs torch copy (GB/s)", suite["copy"]["value"], theirs["copy"], 1.00)
    target("triad vs torch copy (GB/s)", suite["triad"]["value"], theirs["copy"], 1.00)
    target("cuBLAS BF16 vs torch.matmul (TFLOP/s)", suite["cublas_bf16"]["value"], theirs["matmul_bf16"], 0.98)
    target("our SGEMM vs cuBLAS FP32 (TFLOP/s)", suite["sgemm"]["value"], suite["cublas_fp32"]["value"], 0.80)
    target("online softmax vs torch.softmax (GB/s)", suite["softmax_online"]["value"], theirs["softmax"], 1.00)
    target("pinned H2D vs torch (GB/s)", suite["h2d_pinned"]["value"], theirs["h2d_pinned"], 0.98)
    target("pinned D2H vs torch (GB/s)", suite["d2h_pinned"]["value"], theirs["d2h_pinned"], 0.98)
    info = {
        "triad vs torch addcmul (GB/s)": (suite["triad"]["value"], theirs["triad"]),
        "cuBLAS FP16 vs torch.matmul": (suite["cublas_fp16"]["value"], theirs["matmul_fp16"]),
        "cuBLAS TF32 vs torch.matmul": (suite["cublas_tf32"]["value"], theirs["matmul_tf32"]),
        "cuBLAS FP32 vs torch.matmul": (suite["cublas_fp32"]["value"], theirs["matmul_fp32"]),
        "our SGEMM vs torch FP32 matmul": (suite["sgemm"]["value"], theirs["matmul_fp32"]),
    }
    comparison = {
        "gpu": document["device"]["name"],
        "suite_wall_s_including_compile": wall,
        "compile_s": built.seconds,
        "suite_elapsed_s": document["elapsed_s"],
        "suite_errors": document["errors"],
        "targets": [
            {"measure": label, "ours": o, "reference": r, "ratio": q, "met": met} for label, o, r, q, met in rows
        ],
        "info": {k: {"ours": o, "torch": t, "ratio": o / t} for k, (o, t) in info.items()},
        "torch": theirs,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "suite.json").write_text(run.stdout)
        (args.out / "suite.stderr.txt").write_text(run.stderr)
        (args.out / "vs_torch.json").write_text(json.dumps(comparison, indent=1))

    print(
        f"GPU: {document['device']['name']}   suite wall time incl. compile: {wall:.1f} s "
        f"(compile {built.seconds:.1f} s, benchmarks {document['elapsed_s']:.1f} s)"
    )
    if document["errors"]:
        print(f"suite errors: {document['errors']}")
    print(f"{'target':44} {'ours':>10} {'reference':>10} {'ratio':>7}  met")
    for label, ours, reference, ratio, met in rows:
        print(f"{label:44} {ours:10.1f} {reference:10.1f} {ratio:7.3f}  {'yes' if met else 'NO'}")
    for label, (ours, reference) in info.items():
        print(f"{label:44} {ours:10.1f} {reference:10.1f} {ours / reference:7.3f}  (info)")
    unverified = [r["name"] for r in document["results"] if not r["verified"]]
    if unverified:
        print(f"NOT VERIFIED: {unverified}")
    return 0 if all(met for *_, met in rows) and not unverified and not document["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
