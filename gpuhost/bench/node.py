"""`smoke-test --all`: every GPU of the guest in one command, and the node they make together.

Each GPU gets the one-GPU smoke-test (runner.smoke_test), all at once, in this process's threads: the
benchmarks local to a GPU run on every GPU together, then each GPU's host copies alone
(runner.NodeSchedule: the host's bandwidth is shared). P2P is the node's alone: its matrix measures
every ordered pair, where each GPU's own p2p benchmark measured the same neighbouring pairs. The suite
binaries are this process's children, so no run counts another as contention (four `--device` runs
started together each saw the others). A process of someone else's makes only the GPU it
sits on NOT REPRESENTATIVE. Then the node's own measurements (kernels/node.cu): the full P2P matrix,
host <-> every GPU at once, NCCL's collectives (the guest's NCCL, loaded by the suite; never
re-implemented), and NVML's active NVLinks per GPU. Each is judged against the model table here.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuhost.bench.build import build_suite, detect_toolchain, find_kernel_sources, find_nccl
from gpuhost.bench.environment import (
    Environment,
    load_pynvml,
    open_nvml,
    processes_on,
    read_environment,
    read_nvlinks,
)
from gpuhost.bench.health import GpuXid, XidEvent, XidWatch, same_pci_device
from gpuhost.bench.identity import (
    GpuIdentity,
    visibility_of,
)
from gpuhost.bench.jsonout import read_recorded
from gpuhost.bench.models import load_model_table
from gpuhost.bench.node_json import load_node_baseline, read_record, recorded_identities
from gpuhost.bench.node_judge import NODE_PHASE, judge_node
from gpuhost.bench.node_model import GpuStopped, NodeOutcome, NodeRecord
from gpuhost.bench.node_rejudge import logged_xids, rejudged
from gpuhost.bench.outcome import Outcome
from gpuhost.bench.rules import Status
from gpuhost.bench.runner import NodeSchedule, smoke_test
from gpuhost.bench.suite import SmokeOptions, StopCheck, run_node_suite
from gpuhost.bench.verdict import judge
from gpuhost.errors import GpuhostError, InputError

# A hung NCCL (a collective that never completes, a peer that never joins) is stopped after this:
# the whole nccl benchmark takes 2-5 s on a healthy 4-GPU node, with the communicator's set-up.
NCCL_TIMEOUT_S = 180

NODE_TIMEOUT_S = 300


NODE_BENCHMARKS = ("p2p_matrix", "host_all")


def fatal_xid(watch: XidWatch, phase: str | Callable[[int], str], gpus: Iterable[int] | None = None) -> StopCheck:
    """A `stop` for a running suite: the first Xid of FAIL severity NVML reports, from now on, on one
    of `gpus` (None: any GPU, as the node measurements use them all), described. It drains the watch
    (an Xid attributed to `phase`, or to the phase of the GPU it hit), and also sees the Xids that
    another GPU's check drained while the GPUs' runs overlap. Every Xid drained is kept in the watch,
    for the verdicts."""
    concerned = None if gpus is None else set(gpus)
    checked = len(watch.seen)

    def check() -> str | None:
        nonlocal checked
        watch.drain(phase)
        new = watch.since(checked)
        checked += len(new)
        for xid in new:
            if xid.meaning.status is Status.FAIL and (concerned is None or xid.gpu in concerned):
                return xid.describe()
        return None

    return check


def gpu_phase(gpu: int) -> str:
    """The phase of an --all run in which a GPU's own benchmarks run (health.GpuXid.phase)."""
    return f"GPU {gpu}'s run" if gpu >= 0 else "the GPUs' own runs"


def _with_xids(reason: str, gpu: int, xids: Iterable[GpuXid], logged: Iterable[XidEvent], pci_bus_id: str) -> str:
    """A stopped GPU's reason with the Xids NVML reported on it and those the kernel log showed for
    its address during any GPU's run: a GPU that fell off the bus says so on its own line."""
    named = [x.describe() for x in xids if x.gpu == gpu]
    named += [
        f"the kernel log showed Xid {e.code} ({e.meaning.name}) at PCI {e.address}"
        for e in dict.fromkeys(logged)
        if same_pci_device(e.address, pci_bus_id)
    ]
    return reason if not named else f"{reason}; {'; '.join(named)}"


def measure_gpus(
    options: SmokeOptions, gpus: Iterable[int], watch: XidWatch
) -> tuple[list[tuple[int, Outcome]], list[tuple[int, str]]]:
    """Every GPU's own smoke-test (`gpus`, by NVML index), all at once on a NodeSchedule: the local
    benchmarks of every GPU together, then each GPU's host copies alone (P2P is the node's matrix).
    The finished runs and the stopped GPUs with why, each by GPU index."""
    gpus = tuple(gpus)
    schedule = NodeSchedule(gpus)

    def one(gpu: int) -> Outcome | str:
        try:
            # Each GPU is compared with its own run in the node baseline (rejudged), not the file.
            stop = fatal_xid(watch, gpu_phase, (gpu,))
            return smoke_test(replace(options, device=str(gpu), baseline=None), stop=stop, schedule=schedule)
        except InputError:
            raise  # a bad table or option is the same for every GPU
        except GpuhostError as error:  # this GPU's run stopped: the others are still measured
            return str(error)
        finally:
            schedule.local_done(gpu)  # a run stopped early holds no other GPU's link turn back

    with ThreadPoolExecutor(max_workers=max(len(gpus), 1)) as pool:
        done = [(gpu, future.result()) for gpu, future in [(gpu, pool.submit(one, gpu)) for gpu in gpus]]
    watch.drain(gpu_phase)
    finished = [(gpu, result) for gpu, result in done if not isinstance(result, str)]
    failed = [(gpu, result) for gpu, result in done if isinstance(result, str)]
    return finished, failed


def run_all(options: SmokeOptions) -> NodeOutcome:
    started = time.monotonic()
    table = load_model_table(options.gpu_table)
    nvml = load_pynvml()
    count = open_nvml(nvml)
    # NVML stays open for the whole run (the runs below open and close it too: NVML counts), so
    # that one Xid watch sees every GPU through every phase.
    watch: XidWatch | None = None
    try:
        environment: Environment = read_environment(nvml, count)
        # The GPUs judged are those CUDA_VISIBLE_DEVICES leaves (a scheduler's share of the node),
        # in NVML's order; the others are named as left out.
        visibility = visibility_of(environment, os.environ)
        judged = tuple(sorted(visibility.visible, key=lambda g: g.index))
        # Inputs first: a baseline of other GPUs should not wait for every GPU's run.
        baseline = (
            None
            if options.baseline is None
            else load_node_baseline(
                options.baseline, judged, tuple(environment.gpus[g.index].pci_device_id for g in judged)
            )
        )
        watch = XidWatch(nvml, count)
        finished, failed = measure_gpus(options, (g.index for g in judged), watch)
        try:
            record = measure_node(options, environment, judged, watch)
        except InputError:
            raise
        except GpuhostError as error:  # no build, no NVML: the GPUs' verdicts are kept, the node FAILs
            record = _unmeasured(environment, judged, str(error))
        watch.drain(NODE_PHASE)
        record = replace(
            record, xids=tuple(watch.seen), xids_watched=watch.unwatched is None, xid_unwatched=watch.unwatched
        )
    finally:
        if watch is not None:
            watch.close()
        nvml.nvmlShutdown()
    logged = logged_xids(outcome for _, outcome in finished)
    bus_ids = {g.index: g.pci_bus_id for g in environment.gpus}
    stopped = [
        GpuStopped(gpu, _with_xids(reason, gpu, record.xids, logged, bus_ids.get(gpu, ""))) for gpu, reason in failed
    ]
    outcomes = [
        rejudged(
            outcome,
            table,
            gpu,
            complete=not options.benchmarks,
            baseline=baseline,
            xids=record.xids,
            logged=logged,
            judged=record.indices,
        )
        for gpu, outcome in finished
    ]
    models = [table.lookup(i) for i in record.pci_device_ids]
    return NodeOutcome(
        tuple(outcomes),
        record,
        judge_node(record, models, baseline),
        time.monotonic() - started,
        tuple(stopped),
        None if baseline is None else baseline.origin,
        visibility.left_out(),
    )


def _unmeasured(environment: Environment, judged: tuple[GpuIdentity, ...], error: str | None) -> NodeRecord:
    """The record of a node whose own measurements did not run (one GPU, or `error`)."""
    ids = tuple(environment.gpus[g.index].pci_device_id for g in judged)
    return NodeRecord(len(ids), ids, None, error, None, None, None, None, (), (), 0.0, gpus=judged)


def measure_node(
    options: SmokeOptions,
    environment: Environment,
    judged: tuple[GpuIdentity, ...],
    watch: XidWatch | None = None,
) -> NodeRecord:
    """The node's own measurements over the `judged` GPUs (NVML's order): the suite's P2P matrix and
    host copies at once, NCCL's collectives, NVLinks; every GPU number in them NVML's."""
    started = time.monotonic()
    count = len(judged)
    ids = tuple(environment.gpus[g.index].pci_device_id for g in judged)
    indices = tuple(g.index for g in judged)
    if count < 2:
        return _unmeasured(environment, judged, None)
    toolchain = detect_toolchain()
    built = build_suite(
        environment.gpus[0].compute_capability,
        cache_dir=options.cache_dir,
        sources=find_kernel_sources(),
        toolchain=toolchain,
    )
    quick = ["--quick"] if options.quick else []
    seed = ["--seed", str(options.seed)] if options.seed is not None else []
    nvml = load_pynvml()
    open_nvml(nvml)
    try:
        before, _ = processes_on(nvml, indices, "before")
        stop = None if watch is None else fatal_xid(watch, NODE_PHASE)
        suite, suite_error = run_node_suite(
            built.binary, ["--bench", ",".join(NODE_BENCHMARKS), *quick, *seed], judged, {}, NODE_TIMEOUT_S, stop
        )
        library = find_nccl(toolchain.nvcc)
        nccl = nccl_error = topology = None
        if library is not None:
            with tempfile.TemporaryDirectory(prefix="gpuhost-nccl-") as work:
                dump = Path(work) / "topology.xml"
                nccl, nccl_error = run_node_suite(
                    built.binary,
                    ["--bench", "nccl", *quick, *seed],
                    judged,
                    {"GPUHOST_NCCL": str(library), "NCCL_TOPO_DUMP_FILE": str(dump)},
                    NCCL_TIMEOUT_S,
                    stop,
                )
                topology = dump.read_text(errors="replace") if dump.is_file() else None
        after, _ = processes_on(nvml, indices, "after")
        nvlinks = read_nvlinks(nvml, indices)
    finally:
        nvml.nvmlShutdown()
    from gpuhost.bench.contention import merge

    return NodeRecord(
        count,
        ids,
        suite,
        suite_error,
        nccl,
        None if library is None else str(library),
        nccl_error,
        topology,
        nvlinks,
        merge((*before, *after)),
        time.monotonic() - started,
        gpus=judged,
    )


def replay_all(document: dict[str, Any], options: SmokeOptions) -> NodeOutcome:
    """Judge a recorded `--all --json` document again, with today's rules and table: no GPU."""
    from gpuhost.bench.outcome import Outcome as GpuOutcome

    table = load_model_table(options.gpu_table)
    raw_gpus = document.get("gpus")
    raw_stopped = document.get("stopped") or []
    try:
        stopped = tuple(GpuStopped(int(s["gpu"]), str(s["reason"])) for s in raw_stopped)
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"recorded node run: 'stopped' is not what --all writes ({error})") from error
    if not isinstance(raw_gpus, list) or not (raw_gpus or stopped):
        raise InputError("recorded node run: 'gpus' names no GPU's run")
    node = document.get("node")
    record = read_record(node.get("record") if isinstance(node, dict) else None)
    recorded_runs = []
    for raw in raw_gpus:
        recorded = read_recorded(raw)
        recorded_runs.append(
            GpuOutcome(
                verdict=judge(recorded.run, model=None),  # replaced just below
                run=recorded.run,
                suite_document=recorded.suite_document,
                environment=recorded.environment,
                samples=recorded.samples,
                model_table=table.origin,
                timings=recorded.timings,
                build=recorded.build,
                with_baseline=False,
                contention=recorded.contention,
                health=recorded.health,
                gpu=recorded.gpu,
            )
        )
    judged = tuple(record.gpus) or tuple(
        g
        for g in recorded_identities(
            record,
            {o.run.device.index: o.run for o in recorded_runs},
            [g for o in recorded_runs for g in o.environment.gpus],
        )
        if g.index in record.indices
    )
    baseline = None if options.baseline is None else load_node_baseline(options.baseline, judged, record.pci_device_ids)
    logged = logged_xids(recorded_runs)
    outcomes = [
        rejudged(
            o,
            table,
            o.run.device.index,
            complete=True,
            baseline=baseline,
            xids=record.xids,
            logged=logged,
            judged=record.indices,
        )
        for o in recorded_runs
    ]
    models = [table.lookup(i) for i in record.pci_device_ids]
    return NodeOutcome(
        tuple(outcomes),
        record,
        judge_node(record, models, baseline),
        float(document.get("seconds", 0.0)),
        stopped,
        None if baseline is None else baseline.origin,
        None if document.get("left_out") is None else str(document["left_out"]),
    )
