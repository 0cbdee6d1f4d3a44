"""`gpuhost smoke-test`: inside a guest, prove the passed-through GPU performs as its model should.

Exit status: 0 PASS (or WARN), 1 FAIL, 2 cannot run (no GPU or driver, no nvcc, bad input) or not
representative (another process used the GPU; --allow-busy judges such a run: 0 or 1).
Runs with the standard library, nvidia-ml-py and the CUDA toolkit; matplotlib only for --plot.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost.cli.text import printable
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, GpuhostError
from gpuhost.metrics import check_textfile_path, smoke_test_failure_metrics, smoke_test_metrics, write_textfile
from gpuhost.output import check_outputs, write_output

if TYPE_CHECKING:
    from gpuhost.bench.environment import Environment, GpuEnvironment
    from gpuhost.bench.suite import SmokeOptions

BENCHMARKS = ("memory", "roofline", "reduction", "sgemm", "cublas", "softmax", "transfer", "launch", "p2p")


def _benchmark_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    return names


def _delay_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 10000:
        raise argparse.ArgumentTypeError(f"--delay-streams takes milliseconds in (0, 10000], not {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the essentials only (copy, triad, BF16 GEMM, pinned copies, launch, P2P): <= 15 s",
    )
    parser.add_argument("--json", metavar="FILE", help="write the full results as JSON to FILE")
    parser.add_argument(
        "--prometheus",
        metavar="FILE",
        help="write the results as Prometheus metrics to FILE (*.prom, atomically, for node_exporter's textfile "
        "collector; needs gpuhost[metrics]); a run that cannot start writes gpuhost_smoke_up 0",
    )
    parser.add_argument("--plot", metavar="FILE", help="draw the roofline with the measured points (PNG)")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="compare with an earlier --json output (e.g. from bare metal); with --all, an earlier --all --json of "
        "the same GPUs: each GPU with its own run in it, and the node's P2P pairs, host copies and collectives",
    )
    parser.add_argument(
        "--gpu-table",
        type=Path,
        metavar="FILE",
        help="use this GPU model table instead of the packaged one (same JSON format)",
    )
    parser.add_argument(
        "--device",
        metavar="GPU",
        help="the GPU to measure: NVML's index (nvidia-smi's), a UUID (or its unique prefix) or a PCI address; "
        "it must be visible under CUDA_VISIBLE_DEVICES (default: CUDA's device 0, the first visible GPU)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="every GPU CUDA_VISIBLE_DEVICES leaves visible (each one's local benchmarks at once, its host copies "
        "one GPU after the other; the GPUs it hides are named, not judged), "
        "then the node: the full P2P matrix (every ordered pair: no per-GPU p2p), host copies to and from "
        "every GPU at once, NCCL collectives, NVLinks; one verdict per GPU and one for the node",
    )
    parser.add_argument(
        "--only",
        type=_benchmark_list,
        default=(),
        metavar="NAME[,NAME...]",
        help=f"run only these benchmarks: {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where the compiled suite is kept (default ~/.cache/gpuhost/kernels)",
    )
    parser.add_argument("--rebuild", action="store_true", help="compile the kernels even if a cached build matches")
    parser.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh each run)")
    parser.add_argument(
        "--delay-streams",
        type=_delay_ms,
        metavar="MS",
        help="stream-ordering self-test: hold each poison, fill and counter reset MS ms on its stream first, "
        "so any check that does not wait for them reports a wrong result (timings stay valid)",
    )
    parser.add_argument(
        "--allow-busy",
        action="store_true",
        help="judge a run that shared the GPU with another process (exit 0/1 instead of 2, 'not representative')",
    )
    parser.add_argument("--verbose", action="store_true", help="also print each threshold's reason")
    parser.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="judge a recorded --json FILE again (no GPU needed), e.g. with another --gpu-table",
    )


def _options(args: argparse.Namespace) -> SmokeOptions:
    from gpuhost.bench.suite import SmokeOptions

    return SmokeOptions(
        quick=args.quick,
        device=args.device,
        gpu_table=args.gpu_table,
        baseline=args.baseline,
        cache_dir=args.cache_dir,
        rebuild=args.rebuild,
        benchmarks=args.only,
        seed=args.seed,
        delay_streams_ms=args.delay_streams,
    )


def _is_node_replay(path: Path) -> bool:
    from gpuhost.bench.node_json import is_node_document
    from gpuhost.bench.strictjson import read_json_file

    return is_node_document(read_json_file(path, "the recorded run"))


def _run_all(args: argparse.Namespace) -> int:
    """--all (or --replay of an --all document): every GPU's report, then the node's."""
    from gpuhost.bench import jsonout, report
    from gpuhost.bench.node import replay_all, run_all
    from gpuhost.bench.node_json import build_node_document
    from gpuhost.bench.node_report import render_node
    from gpuhost.bench.rules import Status
    from gpuhost.bench.strictjson import read_json_file
    from gpuhost.metrics import smoke_node_metrics

    options = _options(args)
    if args.replay is not None:
        outcome = replay_all(read_json_file(args.replay, "the recorded run"), options)
    else:
        if args.plot is not None:
            from gpuhost.errors import InputError

            raise InputError("--all takes no --plot: plot one GPU's roofline with --device N")
        outcome = run_all(options)
    # GPU and model names come from the GPUs or a recording: escaped, as in one GPU's report.
    for gpu in outcome.gpus:
        text = report.render(
            gpu.verdict,
            gpu.run,
            timings=gpu.timings,
            model_table=gpu.model_table,
            with_baseline=gpu.with_baseline,
            verbose=args.verbose,
        )
        print(printable(text))
    print(printable(render_node(outcome, verbose=args.verbose)), end="")
    if args.json is not None:
        document = build_node_document(outcome, [gpu.document() for gpu in outcome.gpus])
        write_output(args.json, jsonout.dumps(document), "--json")
        print(f"JSON written to {printable(args.json)}")
    if args.prometheus is not None:
        write_textfile(args.prometheus, smoke_node_metrics(outcome, time.time()))
        print(f"metrics written to {printable(args.prometheus)}")
    sys.stdout.flush()
    if not outcome.representative and not args.allow_busy:
        return EXIT_UNUSABLE
    return EXIT_FINDINGS if outcome.status is Status.FAIL else EXIT_OK


def _failed_gpu(found: list[Environment], device: str | None) -> GpuEnvironment | None:
    """The GPU a run that could not finish was for, as NVML showed it (None: unknown)."""
    from gpuhost.bench.identity import visibility_of

    if not found:
        return None
    try:
        return found[-1].gpus[visibility_of(found[-1], os.environ).select(device).index]
    except GpuhostError:
        return None


def run(args: argparse.Namespace) -> int:
    # Imported here so that `gpuhost --help` stays fast and import errors surface as errors.
    from gpuhost.bench import jsonout, report
    from gpuhost.bench.rules import Status
    from gpuhost.bench.runner import replay, smoke_test

    if args.prometheus is not None:
        check_textfile_path(args.prometheus)
    check_outputs(
        [("--json", args.json), ("--prometheus", args.prometheus), ("--plot", args.plot)],
        [("--replay", args.replay), ("--baseline", args.baseline), ("--gpu-table", args.gpu_table)],
    )
    if args.all and args.device is not None:
        from gpuhost.errors import InputError

        raise InputError(
            f"--all judges every visible GPU and --device {args.device} one: give one of them "
            "(to judge some GPUs together, set CUDA_VISIBLE_DEVICES for --all)"
        )
    if args.all or (args.replay is not None and _is_node_replay(args.replay)):
        return _run_all(args)
    options = _options(args)
    found: list[Environment] = []
    try:
        outcome = replay(args.replay, options) if args.replay is not None else smoke_test(options, found.append)
    except GpuhostError as error:
        # A fleet collecting reports gets a reason instead of a missing file.
        if args.json is not None:
            failure = jsonout.build_failure_document(
                reason=str(error), exit_code=error.exit_code, environment=found[-1] if found else None
            )
            write_output(args.json, jsonout.dumps(failure), "--json")
        if args.prometheus is not None:
            write_textfile(args.prometheus, smoke_test_failure_metrics(_failed_gpu(found, args.device), time.time()))
        raise
    text = report.render(
        outcome.verdict,
        outcome.run,
        timings=outcome.timings,
        model_table=outcome.model_table,
        with_baseline=outcome.with_baseline,
        verbose=args.verbose,
    )
    # GPU and model names come from NVML, a recording or a --gpu-table: data, escaped like a host's.
    print(printable(text), end="")
    if args.json is not None:
        write_output(args.json, jsonout.dumps(outcome.document()), "--json")
        print(f"JSON written to {printable(args.json)}")
    if args.prometheus is not None:
        write_textfile(args.prometheus, smoke_test_metrics(outcome.verdict, outcome.run, time.time()))
        print(f"metrics written to {printable(args.prometheus)}")
    if args.plot is not None:
        from gpuhost.bench.plot import draw_roofline

        draw_roofline(outcome.run, outcome.verdict.model, Path(args.plot))
        print(f"roofline written to {printable(args.plot)}")
    sys.stdout.flush()
    if not outcome.verdict.representative and not args.allow_busy:
        return EXIT_UNUSABLE
    return EXIT_FINDINGS if outcome.verdict.status is Status.FAIL else EXIT_OK
