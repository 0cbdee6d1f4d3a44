"""Node measurements: the gpuhost suite's figures against PyTorch's, same machine, same run (issue 30).

Not a unit test: it needs two or more CUDA GPUs, nvcc and PyTorch. Usage, from the repository root:

    python3 benchmarks/node_vs_torch.py [--out FILE] [--reps N]

- NCCL all_reduce bus bandwidth at 1 GiB and 4 GiB (float32; issue 30's target: >= 0.98x torch at
  both): the suite's nccl benchmark (kernels/node.cu, one process driving every GPU through
  ncclCommInitAll, `--nccl-bytes` for these two sizes) loads the very libnccl that PyTorch loaded,
  against torch.distributed's all_reduce, one process per GPU (nccl-tests' busbw = algbw x 2(n-1)/n).
- Each ordered P2P pair, 1 GiB one direction: the suite's p2p_matrix against `dst.copy_(src)`.
- Host copies to and from every GPU at once, 256 MiB pinned each: the suite's host_all against
  PyTorch's non_blocking copies issued on a stream of each GPU before any is waited for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script from the repository root: gpuhost is imported from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALL_REDUCE_SIZES = (1 << 30, 4 << 30)
PAIR_BYTES = 1 << 30
HOST_BYTES = 256 << 20


def loaded_nccl() -> str:
    """The libnccl PyTorch has loaded, from this process's memory map."""
    import torch

    torch.cuda.nccl.version()
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libnccl" in line:
            return line.split()[-1]
    raise SystemExit("PyTorch loaded no libnccl")


def suite_document(nccl: str, quick: bool, cache_dir: Path | None) -> dict[str, Any]:
    from gpuhost.bench.build import build_suite
    from gpuhost.bench.environment import load_pynvml, open_nvml, read_environment

    nvml = load_pynvml()
    count = open_nvml(nvml)
    try:
        capability = read_environment(nvml, count).gpus[0].compute_capability
    finally:
        nvml.nvmlShutdown()
    binary = build_suite(capability, cache_dir=cache_dir).binary
    env = {**os.environ, "GPUHOST_NCCL": nccl, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    sizes = ",".join(str(size) for size in ALL_REDUCE_SIZES)
    argv = [str(binary), "--bench", "p2p_matrix,host_all,nccl", "--nccl-bytes", sizes, *(["--quick"] if quick else [])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=600)
    if done.returncode not in (0, 3):
        raise SystemExit(f"suite failed ({done.returncode}): {done.stderr[-800:]}")
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def _all_reduce_rank(rank: int, world: int, init: str, reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    busbw = {}
    for size in ALL_REDUCE_SIZES:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=f"cuda:{rank}")
        for _ in range(5):
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
        samples = []
        for _ in range(reps):
            dist.barrier()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(5):  # as the suite: five back-to-back collectives per sample
                dist.all_reduce(tensor)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - started) / 5)
        algbw = size / statistics.median(samples) / 1e9
        busbw[str(size)] = algbw * 2 * (world - 1) / world
        del tensor
        torch.cuda.empty_cache()
    if rank == 0:
        Path(out).write_text(json.dumps({"busbw": busbw, "nccl": torch.cuda.nccl.version()}))
    dist.destroy_process_group()


def torch_all_reduce_busbw(world: int, reps: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch) / "busbw.json")
        init = f"file://{scratch}/rendezvous"
        mp.spawn(_all_reduce_rank, args=(world, init, reps, out), nprocs=world, join=True)
        result: dict[str, Any] = json.loads(Path(out).read_text())
        return result


def torch_pair_gbps(torch: Any, src: int, dst: int, reps: int) -> float:
    source = torch.randint(0, 255, (PAIR_BYTES,), dtype=torch.uint8, device=f"cuda:{src}")
    target = torch.empty(PAIR_BYTES, dtype=torch.uint8, device=f"cuda:{dst}")
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
    if not torch.equal(target[:4096].cpu(), source[:4096].cpu()):
        raise SystemExit(f"PyTorch's copy {src}->{dst} is wrong")
    return PAIR_BYTES / statistics.median(samples) / 1e9


def torch_host_all_gbps(torch: Any, world: int, to_device: bool, reps: int) -> float:
    hosts = [torch.empty(HOST_BYTES, dtype=torch.uint8).pin_memory() for _ in range(world)]
    devices = [torch.empty(HOST_BYTES, dtype=torch.uint8, device=f"cuda:{g}") for g in range(world)]
    streams = [torch.cuda.Stream(device=g) for g in range(world)]

    def once() -> None:
        for g in range(world):
            with torch.cuda.stream(streams[g]):
                if to_device:
                    devices[g].copy_(hosts[g], non_blocking=True)
                else:
                    hosts[g].copy_(devices[g], non_blocking=True)
        for stream in streams:
            stream.synchronize()

    once()
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        once()
        samples.append(time.perf_counter() - started)
    return world * HOST_BYTES / statistics.median(samples) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the comparison as JSON here")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--cache-dir", type=Path, help="where the compiled suite is kept (as smoke-test's)")
    args = parser.parse_args()
    import torch

    world = torch.cuda.device_count()
    if world < 2:
        print("needs two GPUs", file=sys.stderr)
        return 2
    nccl = loaded_nccl()
    suite = {r["name"]: r for r in suite_document(nccl, quick=False, cache_dir=args.cache_dir)["results"]}
    theirs = torch_all_reduce_busbw(world, args.reps)
    points = {int(p["bytes"]): p for p in suite["nccl_all_reduce"]["extra"]["points"]}
    rows: list[dict[str, Any]] = []
    for size in ALL_REDUCE_SIZES:
        if not points[size]["verified"]:
            raise SystemExit(f"the suite's all_reduce at {size} bytes gave a wrong result")
        ours = points[size]["busbw_GBps"]
        torch_busbw = theirs["busbw"][str(size)]
        rows.append(
            {
                "what": f"all_reduce busbw {size >> 30} GiB",
                "suite": ours,
                "torch": torch_busbw,
                "ratio": ours / torch_busbw,
            }
        )
    for src in range(world):
        for dst in range(world):
            if src != dst:
                ours = suite[f"p2p_pair_{src}_to_{dst}"]["value"]
                theirs_pair = torch_pair_gbps(torch, src, dst, args.reps)
                rows.append(
                    {"what": f"p2p {src}->{dst}", "suite": ours, "torch": theirs_pair, "ratio": ours / theirs_pair}
                )
    for name, to_device in (("h2d_all", True), ("d2h_all", False)):
        ours = suite[name]["value"]
        theirs_host = torch_host_all_gbps(torch, world, to_device, args.reps)
        rows.append({"what": f"{name} aggregate", "suite": ours, "torch": theirs_host, "ratio": ours / theirs_host})
    print(f"NCCL {nccl} (torch reports {theirs['nccl']}), {world} GPUs")
    print(f"{'measure':24} {'suite GB/s':>11} {'torch GB/s':>11} {'suite/torch':>12}")
    for row in rows:
        print(f"{row['what']:24} {row['suite']:>11.1f} {row['torch']:>11.1f} {row['ratio']:>12.3f}")
    if args.out:
        args.out.write_text(json.dumps({"gpus": world, "nccl": nccl, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
