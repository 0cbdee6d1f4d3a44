"""Peer-to-peer copy bandwidth: the gpuhost suite's figure against PyTorch's device-to-device copy
between the same GPUs, in the same run (issue 18).

Not a unit test: it needs two CUDA GPUs, nvcc and PyTorch. Usage, from the repository root:

    python3 benchmarks/p2p_vs_torch.py [--out FILE] [--reps N]

The suite's p2p benchmark (kernels/transfer.cu) copies 1 GiB with cudaMemcpyPeerAsync between
neighbouring GPUs, timed between CUDA events on the source's stream. PyTorch's `dst.copy_(src)`
between two devices is a peer copy too once peer access is possible; it is timed here with both
devices synchronized around each copy, so the figure includes no queued work of either.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BYTES = 1 << 30  # the suite's full-run buffer


def torch_peer_copy_gbps(torch: Any, src: int, dst: int, reps: int) -> float:
    source = torch.randint(0, 255, (BYTES,), dtype=torch.uint8, device=f"cuda:{src}")
    target = torch.empty(BYTES, dtype=torch.uint8, device=f"cuda:{dst}")
    for _ in range(2):
        target.copy_(source)
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        started = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        samples.append(time.perf_counter() - started)
    if not torch.equal(target.cpu(), source.cpu()):
        raise SystemExit(f"PyTorch's copy {src}->{dst} is wrong")
    return BYTES / statistics.median(samples) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the comparison as JSON here")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    import torch

    if torch.cuda.device_count() < 2:
        print("needs two GPUs", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "p2p.json"
        argv = [sys.executable, "-m", "gpuhost", "smoke-test", "--only", "p2p", "--json", str(report)]
        subprocess.run(argv, check=False, stdout=subprocess.DEVNULL)
        suite = {m["metric"]: m for m in json.loads(report.read_text())["metrics"]}
    rows = []
    for src, dst in ((0, 1), (1, 0)):
        ours = suite[f"p2p_{src}_to_{dst}"]
        theirs = torch_peer_copy_gbps(torch, src, dst, args.reps)
        rows.append(
            {
                "pair": f"{src}->{dst}",
                "suite_gbps": round(float(ours["value"]), 1),
                "suite_status": ours["status"],
                "reference_gbps": ours["reference"],
                "torch_gbps": round(theirs, 1),
                "suite_over_torch": round(float(ours["value"]) / theirs, 3),
            }
        )
    print(f"{'pair':6} {'suite GB/s':>11} {'torch GB/s':>11} {'suite/torch':>12}  status (reference)")
    for row in rows:
        print(
            f"{row['pair']:6} {row['suite_gbps']:>11} {row['torch_gbps']:>11} {row['suite_over_torch']:>12}  "
            f"{row['suite_status']} ({row['reference_gbps']} GB/s)"
        )
    if args.out:
        args.out.write_text(json.dumps({"gpus": torch.cuda.device_count(), "bytes": BYTES, "pairs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
