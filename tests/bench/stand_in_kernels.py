"""A stand-in for gpuhost-kernels with --then, for smoke-test --all's schedule without a GPU.

Prints, as the suite does, one JSON document a line: the results of the named benchmarks from a
real run (tests/fixtures/h200x4-node/wall/old-1.json, this GPU's), then waits for "go" on stdin
before the --then set. As the real suite, it measures CUDA's device --device among the GPUs
$CUDA_VISIBLE_DEVICES names (stand_in_uuid's UUIDs: the GPU's index is the UUID's last digits),
and reports that ordinal as its device index. Each set's start and end go to $STAND_IN_LOG
("DEVICE SET start|end TIME").
The local sets meet: each waits until $STAND_IN_GPUS local sets started (they run at once, or
this times out and exits 4). $STAND_IN_FAIL says how one GPU fails: "2:local" exits 2 (no GPU) on
device 2 before any document, "0:then" exits 139 (a crash) on device 0 after "go";
$STAND_IN_THEN_SECONDS: how long the --then set takes (0.05 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gpuhost.bench.identity import GpuIdentity, pci_address
from gpuhost.bench.suite import SuiteTarget

WALL = Path(__file__).resolve().parents[1] / "fixtures" / "h200x4-node" / "wall"


def half(document: dict[str, object], benchmarks: list[str], elapsed: float) -> dict[str, object]:
    return {
        **document,
        "benchmarks": [b for b in document["benchmarks"] if b["name"] in benchmarks],  # type: ignore[attr-defined]
        "results": [r for r in document["results"] if r["benchmark"] in benchmarks],  # type: ignore[attr-defined]
        "errors": [],
        "elapsed_s": elapsed,
    }


def log(line: str) -> None:
    with Path(os.environ["STAND_IN_LOG"]).open("a") as out:
        out.write(line + "\n")


def stand_in_uuid(gpu: int) -> str:
    """A UUID in NVML's form that names recorded GPU `gpu` for this stand-in."""
    return f"GPU-00000000-0000-0000-0000-{gpu:012d}"


def main(argv: list[str]) -> int:
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    ordinal = int(args["--device"])
    device = int(os.environ["CUDA_VISIBLE_DEVICES"].split(",")[ordinal].rsplit("-", 1)[1])
    first, then = args["--bench"].split(","), args.get("--then", "").split(",") if "--then" in args else []
    failing = dict(item.split(":") for item in os.environ.get("STAND_IN_FAIL", "").split() if item)
    if failing.get(str(device)) == "local":
        print("gpuhost-kernels: no usable CUDA device: stand-in", file=sys.stderr)
        return 2
    run = json.loads((WALL / "old-1.json").read_text())
    recorded = next(g["suite"] for g in run["gpus"] if g["suite"]["device"]["index"] == device)
    document = {**recorded, "device": {**recorded["device"], "index": ordinal}}
    started = time.monotonic()
    log(f"{device} first start {time.time():.6f}")
    if then:  # a local set: wait for the other GPUs' local sets to start too
        expected = int(os.environ["STAND_IN_GPUS"]) - sum(1 for v in failing.values() if v == "local")
        deadline = time.monotonic() + 10
        while (
            sum(" first start " in line for line in Path(os.environ["STAND_IN_LOG"]).read_text().splitlines())
            < expected
        ):
            if time.monotonic() > deadline:
                return 4
            time.sleep(0.01)
    time.sleep(0.05)
    log(f"{device} first end {time.time():.6f}")
    print(json.dumps(half(document, first, time.monotonic() - started)), flush=True)
    if not then or sys.stdin.readline().strip() != "go":
        return 0
    if failing.get(str(device)) == "then":
        print("stand-in: segmentation fault", file=sys.stderr)
        return 139
    log(f"{device} then start {time.time():.6f}")
    time.sleep(float(os.environ.get("STAND_IN_THEN_SECONDS", "0.05")))
    log(f"{device} then end {time.time():.6f}")
    print(json.dumps(half(document, then, 0.05)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))


def stand_in_target(gpu: int, pci_bus_id: str) -> SuiteTarget:
    """The SuiteTarget of one recorded GPU for a stand-in suite: the GPU alone, named by stand_in_uuid."""
    identity = GpuIdentity(gpu, stand_in_uuid(gpu), pci_address(pci_bus_id), 0)
    return SuiteTarget(identity, (identity,))
