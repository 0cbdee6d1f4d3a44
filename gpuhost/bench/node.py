"""`smoke-test --all`: every GPU of the guest in one command, and the node they make together.

Each GPU gets the one-GPU smoke-test (runner.smoke_test), all at once, in this process's threads: the
benchmarks local to a GPU run on every GPU together, then each GPU's host copies alone
(runner.NodeSchedule: the host's bandwidth is shared). P2P is the node's alone: its matrix measures
every ordered pair, where each GPU's own p2p benchmark measured the same neighbouring pairs. The suite
binaries are this process's children, so no run counts another as contention (four `--device` runs
started together each saw the others, issue 30). A process of someone else's makes only the GPU it
sits on NOT REPRESENTATIVE. Then the node's own measurements (kernels/node.cu): the full P2P matrix,
host <-> every GPU at once, NCCL's collectives (the guest's NCCL, loaded by the suite; never
re-implemented), and NVML's active NVLinks per GPU. Each is judged against the model table here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuhost.bench.build import build_suite, detect_toolchain, find_kernel_sources, toolkit_root
from gpuhost.bench.contention import GpuProcess
from gpuhost.bench.environment import (
    Environment,
    GpuEnvironment,
    NvlinkReading,
    load_pynvml,
    open_nvml,
    processes_on,
    read_environment,
    read_nvlinks,
)
from gpuhost.bench.health import GpuXid, XidEvent, XidWatch, same_pci_device
from gpuhost.bench.identity import (
    GpuIdentity,
    pci_address,
    renumbered,
    visibility_of,
)
from gpuhost.bench.jsonout import CANNOT_RUN, NODE_SCHEMA, SCHEMA, build_document, read_recorded
from gpuhost.bench.models import load_model_table
from gpuhost.bench.node_judge import NODE_PHASE, judge_node, logged_xids, rejudged
from gpuhost.bench.node_model import BaselineComparison, GpuStopped, NodeBaseline, NodeFigure, NodeOutcome, NodeRecord
from gpuhost.bench.outcome import Outcome
from gpuhost.bench.results import SuiteRun
from gpuhost.bench.rules import Status
from gpuhost.bench.runner import NodeSchedule, smoke_test
from gpuhost.bench.strictjson import read_json_file
from gpuhost.bench.suite import SmokeOptions, StopCheck, run_node_suite
from gpuhost.bench.verdict import judge
from gpuhost.errors import GpuhostError, InputError

# A hung NCCL (a collective that never completes, a peer that never joins) is stopped after this:
# the whole nccl benchmark takes 2-5 s on a healthy 4-GPU node, with the communicator's set-up.
NCCL_TIMEOUT_S = 180

NODE_TIMEOUT_S = 300


NODE_BENCHMARKS = ("p2p_matrix", "host_all")


# ---------------------------------------------------------------------------------- finding NCCL
def _python_nccl_dirs() -> Iterable[Path]:
    # The nvidia-nccl-cu12/cu13 wheels (PyTorch's) install nvidia/nccl/lib or nvidia/cu13/lib.
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return
    for base in spec.submodule_search_locations:
        for flavour in ("nccl", "cu13", "cu12"):
            yield Path(base) / flavour / "lib"


def find_nccl(nvcc: Path | None, environ: dict[str, str] | None = None) -> Path | None:
    """The guest's libnccl.so, looked for as the suite looks for cuBLAS: $GPUHOST_NCCL, the
    toolkit, the system's library directories, then the pip wheels. None when there is none."""
    env = os.environ if environ is None else environ
    if env.get("GPUHOST_NCCL"):
        named = Path(env["GPUHOST_NCCL"])
        return named if named.is_file() else None
    directories: list[Path] = []
    if nvcc is not None:
        root = toolkit_root(nvcc)
        directories += [root / "lib64", root / "targets" / "x86_64-linux" / "lib"]
    directories += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/local/lib"), *_python_nccl_dirs()]
    for directory in directories:
        found = sorted(directory.glob("libnccl.so*"), key=lambda p: len(p.name)) if directory.is_dir() else []
        if found:
            return found[0]
    return None


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


# ---------------------------------------------------------------------------------- JSON
def _figure(f: NodeFigure) -> dict[str, Any]:
    return {**dataclasses.asdict(f), "status": f.status.value, "gpus": list(f.gpus)}


def _comparison(c: BaselineComparison) -> dict[str, Any]:
    return {**dataclasses.asdict(c), "status": c.status.value, "gpus": list(c.gpus)}


def build_node_document(outcome: NodeOutcome, per_gpu: list[dict[str, Any]]) -> dict[str, Any]:
    verdict = outcome.verdict
    record = outcome.record
    return {
        "schema": NODE_SCHEMA,
        "outcome": outcome.outcome,
        "status": outcome.status.value,
        "seconds": outcome.seconds,
        "verdicts": sorted(
            [
                *(
                    {
                        "gpu": o.run.device.index,
                        **_named_by(outcome, o.run.device.index),
                        "status": o.verdict.status.value,
                        "outcome": o.verdict.outcome,
                    }
                    for o in outcome.gpus
                ),
                *(
                    {
                        "gpu": s.gpu,
                        **_named_by(outcome, s.gpu),
                        "status": "FAIL",
                        "outcome": CANNOT_RUN,
                        "reason": s.reason,
                    }
                    for s in outcome.stopped
                ),
            ],
            key=lambda entry: int(entry["gpu"]),
        ),
        "stopped": [dataclasses.asdict(s) for s in outcome.stopped],
        # The GPUs CUDA_VISIBLE_DEVICES left out of the run, and why; null: none.
        "left_out": outcome.left_out,
        "node": {
            "status": verdict.status.value,
            "outcome": verdict.outcome,
            "reasons": list(verdict.reasons),
            "figures": [_figure(f) for f in verdict.figures],
            "findings": [
                {
                    "check": f.check,
                    "detail": f.detail,
                    "status": f.status.value,
                    "gpus": list(f.gpus),
                    "code": None if f.problem is None else f.problem.code,
                }
                for f in verdict.findings
            ],
            "record": {**dataclasses.asdict(record), "pci_device_ids": list(record.pci_device_ids)},
            # null: judged without --baseline; each GPU's comparison is in its own document's metrics.
            "baseline": None
            if outcome.baseline is None
            else {"file": outcome.baseline, "comparisons": [_comparison(c) for c in verdict.baseline]},
        },
        "gpus": per_gpu,
    }


def identities(outcome: NodeOutcome) -> dict[int, GpuIdentity]:
    """Each judged GPU's identity by NVML index: the record's, else (a run recorded before
    identities were kept) the PCI address each GPU's own run reported."""
    known = {g.index: g for g in outcome.record.gpus}
    for o in outcome.gpus:
        index = o.run.device.index
        if index not in known:
            uuid = next((g.uuid for g in o.environment.gpus if g.index == index), "")
            known[index] = GpuIdentity(index, uuid, pci_address(o.run.device.pci_bus_id))
    for o in outcome.gpus:  # a stopped GPU has no run: NVML's listing names it
        for g in o.environment.gpus:
            known.setdefault(g.index, GpuIdentity(g.index, g.uuid, pci_address(g.pci_bus_id)))
    return known


def _named_by(outcome: NodeOutcome, gpu: int) -> dict[str, Any]:
    identity = identities(outcome).get(gpu)
    return {} if identity is None else {"pci_bus_id": identity.pci_bus_id, "uuid": identity.uuid}


def describe_gpu(outcome: NodeOutcome, gpu: int) -> str:
    """'GPU 2 (0000:00:08.0)': NVML's index and the PCI address, as every line of the node report names a GPU."""
    identity = identities(outcome).get(gpu)
    return f"GPU {gpu}" if identity is None else identity.describe()


def gpu_document(outcome: Outcome) -> dict[str, Any]:
    return build_document(
        verdict=outcome.verdict,
        suite_document=outcome.suite_document,
        environment=outcome.environment,
        samples=outcome.samples,
        model_table=outcome.model_table,
        timings=outcome.timings,
        build=outcome.build,
        contention=outcome.contention,
        health=outcome.health,
        gpu=outcome.gpu,
    )


def is_node_document(document: Any) -> bool:
    return isinstance(document, dict) and document.get("schema") == NODE_SCHEMA


def _record(raw: Any) -> NodeRecord:
    if not isinstance(raw, dict):
        raise InputError("recorded node run: node.record must be an object")
    try:
        return NodeRecord(
            gpu_count=int(raw["gpu_count"]),
            pci_device_ids=tuple(int(i) for i in raw["pci_device_ids"]),
            suite=raw.get("suite"),
            suite_error=raw.get("suite_error"),
            nccl=raw.get("nccl"),
            nccl_library=raw.get("nccl_library"),
            nccl_error=raw.get("nccl_error"),
            nccl_topology=raw.get("nccl_topology"),
            nvlinks=tuple(NvlinkReading(int(r["gpu"]), r["active"], int(r["queried"])) for r in raw.get("nvlinks", [])),
            contention=tuple(GpuProcess(**{**p, "seen": tuple(p["seen"])}) for p in raw.get("contention", [])),
            seconds=float(raw.get("seconds", 0.0)),
            xids=tuple(GpuXid(int(x["gpu"]), int(x["code"]), str(x["phase"])) for x in raw.get("xids") or []),
            xids_watched=None if raw.get("xids_watched") is None else bool(raw["xids_watched"]),
            xid_unwatched=None if raw.get("xid_unwatched") is None else str(raw["xid_unwatched"]),
            gpus=tuple(
                GpuIdentity(int(g["index"]), str(g["uuid"]), str(g["pci_bus_id"]), g.get("cuda_ordinal"))
                for g in raw.get("gpus") or []
            ),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"recorded node run: node.record is not what --all writes ({error})") from error


def _ids(ids: tuple[int, ...]) -> str:
    counts: dict[int, int] = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    return ", ".join(f"{n} x 10de:{i:04x}" for i, n in counts.items()) or "no GPU"


def _baseline_identities(
    record: NodeRecord, gpus: dict[int, SuiteRun], listed: Iterable[GpuEnvironment]
) -> list[GpuIdentity]:
    """The GPUs a recorded node run judged: its record's; or (recorded before identities were kept)
    each GPU run's own device, and each GPU NVML listed (a GPU whose run stopped has none)."""
    if record.gpus:
        return list(record.gpus)
    known: dict[int, GpuIdentity] = {}
    uuids = {g.index: g.uuid for g in listed}
    for index, run in sorted(gpus.items()):
        known[index] = GpuIdentity(index, uuids.get(index, ""), pci_address(run.device.pci_bus_id))
    for g in listed:
        known.setdefault(g.index, GpuIdentity(g.index, g.uuid, pci_address(g.pci_bus_id)))
    return [known[i] for i in sorted(known)]


def load_node_baseline(path: Path, judged: tuple[GpuIdentity, ...], pci_device_ids: tuple[int, ...]) -> NodeBaseline:
    """An earlier `smoke-test --all --json` run to compare this node with: one of the same GPUs, matched
    by UUID (which travels from bare metal into a guest), else by PCI address, never by position; its
    figures renumbered into this node's numbering. Anything else is an InputError naming the file
    and the fix: a one-GPU run, another count or model, other GPUs, a run that could not start."""
    document = read_json_file(path, "the baseline")
    if not is_node_document(document):
        if isinstance(document, dict) and (document.get("schema") == SCHEMA or "results" in document):
            raise InputError(
                f"the baseline {path} is one GPU's run (smoke-test --device N --json, or the suite's own output): "
                "--all compares a node with a node; record the baseline with `gpuhost smoke-test --all --json FILE` "
                "(e.g. on bare metal), or compare one GPU with `--device N --baseline FILE`"
            )
        raise InputError(
            f"the baseline {path} is not a `smoke-test --all --json` document (schema {NODE_SCHEMA}): "
            "record one with `gpuhost smoke-test --all --json FILE`"
        )
    try:
        node = document.get("node")
        record = _record(node.get("record") if isinstance(node, dict) else None)
        gpus: dict[int, SuiteRun] = {}
        listed: list[GpuEnvironment] = []
        for raw in document.get("gpus") or []:
            recorded = read_recorded(raw)
            gpus[recorded.run.device.index] = recorded.run
            listed.extend(recorded.environment.gpus)
    except InputError as error:
        raise InputError(f"the baseline {path}: {error}") from error
    if record.pci_device_ids != pci_device_ids:
        raise InputError(
            f"the baseline {path} was recorded on {record.gpu_count} GPU(s) ({_ids(record.pci_device_ids)}), this "
            f"node has {len(pci_device_ids)} ({_ids(pci_device_ids)}): a node is compared only with a run of the same "
            "GPUs; record the baseline with `smoke-test --all --json` on a node of this count and model (or "
            "compare one GPU with `--device N --baseline FILE`)"
        )
    theirs = _baseline_identities(record, gpus, listed)
    number: dict[int, int] = {}
    for mine in judged:
        match = [g for g in theirs if g.same_gpu(mine)]
        if len(match) != 1:
            raise InputError(
                f"the baseline {path} holds no run of {mine.describe()} {mine.uuid}".rstrip()
                + f" (it measured {', '.join(f'{g.describe()} {g.uuid}'.rstrip() for g in theirs) or 'no GPU'}): "
                "GPUs are matched by UUID, else by PCI address, never by position; record the baseline on these "
                "GPUs with `gpuhost smoke-test --all --json FILE` under the same CUDA_VISIBLE_DEVICES"
            )
        number[match[0].index] = mine.index
    renamed = replace(
        record,
        suite=None if record.suite is None else renumbered(record.suite, number),
        nccl=None if record.nccl is None else renumbered(record.nccl, number),
        nvlinks=tuple(replace(r, gpu=number.get(r.gpu, r.gpu)) for r in record.nvlinks),
        contention=tuple(replace(p, gpu=number.get(p.gpu, p.gpu)) for p in record.contention),
        gpus=tuple(replace(g, index=number.get(g.index, g.index)) for g in theirs),
    )
    return NodeBaseline(str(path), {number[i]: run for i, run in gpus.items() if i in number}, renamed)


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
    record = _record(node.get("record") if isinstance(node, dict) else None)
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
        for g in _baseline_identities(
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


# ---------------------------------------------------------------------------------- text
def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _size_cell(size_bytes: int | None, prefix: str = "") -> str:
    if size_bytes is None:
        return "" if prefix else "-"
    return prefix + (f"{size_bytes / 2**30:g} GiB" if size_bytes >= 2**30 else f"{size_bytes / 2**20:g} MiB")


def render_node(outcome: NodeOutcome, *, verbose: bool = False) -> str:
    """The node's part of the --all report: the matrix, the host copies, the collectives, the
    findings, one verdict per GPU and the node's."""
    from gpuhost.bench.report import _table

    verdict, record = outcome.verdict, outcome.record
    n = record.gpu_count
    gpus = record.indices
    lines = [f"Node: {n} GPU(s): " + ", ".join(describe_gpu(outcome, g) for g in gpus)]
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
        lines.extend(_table(["", *(f"GPU {b}" for b in gpus)], rows, set(range(1, n + 1))))
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
        lines.extend(_table(["status", "measurement", "GB/s", "% link", "link"], rows, {2, 3}))
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
            _table(
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
        lines.extend(_table(["status", "check", "detail"], checks, set()))
    if record.nccl_library is not None:
        lines.append(f"NCCL: {record.nccl_library}")
    if verdict.reasons:
        lines.append("Node findings:")
        lines.extend(f"  - {reason}" for reason in verdict.reasons)
    lines.append("")
    per_gpu: list[tuple[int, str]] = [
        (s.gpu, f"VERDICT {describe_gpu(outcome, s.gpu)}: FAIL (cannot run: {s.reason})") for s in outcome.stopped
    ]
    for gpu in outcome.gpus:
        index = gpu.run.device.index
        per_gpu.append(
            (
                index,
                f"VERDICT {describe_gpu(outcome, index)}: {gpu.verdict.outcome}"
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
