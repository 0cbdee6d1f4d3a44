"""One smoke test: NVML checks, build (cached), run the suite while sampling NVML, judge."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuhost.bench.build import BuiltSuite, build_suite, detect_toolchain, find_kernel_sources
from gpuhost.bench.contention import Contention, GpuProcess, Phase, merge, read_processes
from gpuhost.bench.environment import (
    Environment,
    GpuUnavailable,
    NvmlSampler,
    RunSamples,
    load_pynvml,
    open_nvml,
    read_environment,
)
from gpuhost.bench.environment_judge import fabric_problems, judge_environment
from gpuhost.bench.health import Health, judge_health, lines_since, parse_xid_lines, read_kernel_log
from gpuhost.bench.identity import GpuIdentity, in_machine_numbering, suite_environment, visibility_of
from gpuhost.bench.jsonout import BuildInfo, Timings, load_baseline, load_recorded
from gpuhost.bench.models import GpuModel, load_model_table
from gpuhost.bench.results import SuiteRun, parse_suite_document
from gpuhost.bench.rules import NODE_JUDGED_BENCHMARKS, Status, rule_for
from gpuhost.bench.verdict import Verdict, judge
from gpuhost.errors import EXIT_FINDINGS, GpuhostError, InputError

SUITE_TIMEOUT_S = 600

# How often a running suite asks its `stop` (smoke-test --all: a fatal Xid on its GPU, from NVML's event
# set): such a GPU stops its run within about this long instead of leaving it to hang to its timeout.
STOP_POLL_S = 0.5

# Asked while a suite runs: a reason stops it there (None: carry on).
StopCheck = Callable[[], str | None]


class SuiteStopped(Exception):
    """A suite run stopped by its StopCheck, with the reason."""


def run_bounded(
    argv: list[str], env: dict[str, str], timeout: float, stop: StopCheck | None = None
) -> tuple[int, str, str]:
    """Run `argv` to its end: exit status, stdout, stderr. Killed and raised when it outlasts `timeout`
    (subprocess.TimeoutExpired) or when `stop`, asked every STOP_POLL_S, gives a reason (SuiteStopped)."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + timeout
    while True:
        try:
            stdout, stderr = process.communicate(timeout=STOP_POLL_S)
            return process.returncode, stdout, stderr
        except subprocess.TimeoutExpired:
            reason = stop() if stop is not None else None
            if reason is None and time.monotonic() < deadline:
                continue
            process.kill()
            # A child of the suite could hold its pipes open after the kill: the bound holds anyway.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=10 * STOP_POLL_S)
            if reason is not None:
                raise SuiteStopped(reason) from None
            raise


# The suite's per-GPU benchmarks in its own order (kernels/main.cu kBenches), and those --quick runs.
SUITE_BENCHMARKS = ("memory", "roofline", "reduction", "sgemm", "cublas", "softmax", "transfer", "launch", "p2p")
QUICK_BENCHMARKS = ("memory", "cublas", "transfer", "launch", "p2p")
# Those that move data over the host's link or between GPUs: the host's bandwidth is shared and a P2P
# copy lands in another GPU's memory, so under --all each runs with no other GPU measuring. The
# rest stay on their own GPU and run on every GPU at once.
LINK_BENCHMARKS = frozenset({"transfer", "p2p"})


def split_benchmarks(options: SmokeOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The benchmarks a run measures: (those local to its GPU, those over the host link or to peers)."""
    selected = options.benchmarks or (QUICK_BENCHMARKS if options.quick else SUITE_BENCHMARKS)
    return (
        tuple(b for b in selected if b not in LINK_BENCHMARKS),
        tuple(b for b in selected if b in LINK_BENCHMARKS),
    )


class NodeSchedule:
    """smoke-test --all: every GPU's local benchmarks at once, then each GPU's link benchmarks alone.

    A GPU's link turn starts once no GPU is still measuring locally (or has given up), and only one
    GPU holds it at a time; its re-measurements run inside it too, with nothing else measuring."""

    def __init__(self, gpus: Iterable[int]) -> None:
        self._measuring = set(gpus)
        self._changed = threading.Condition()
        self._link = threading.Lock()

    def local_done(self, gpu: int) -> None:
        """`gpu` measures nothing local any more (done, or its run stopped): the link turns may start."""
        with self._changed:
            self._measuring.discard(gpu)
            self._changed.notify_all()

    @contextlib.contextmanager
    def link_turn(self, gpu: int) -> Iterator[None]:
        self.local_done(gpu)
        with self._changed:
            self._changed.wait_for(lambda: not self._measuring)
        with self._link:
            yield


def combined_documents(local: dict[str, Any], link: dict[str, Any]) -> dict[str, Any]:
    """One suite document from a run's two halves, as one run of the suite would have written it:
    benchmarks and results in the suite's order, both halves' errors, their time added."""

    def order(benchmark: object) -> int:
        return SUITE_BENCHMARKS.index(str(benchmark)) if benchmark in SUITE_BENCHMARKS else len(SUITE_BENCHMARKS)

    benchmarks = [*local.get("benchmarks", []), *link.get("benchmarks", [])]
    results = [*local.get("results", []), *link.get("results", [])]
    return {
        **local,
        "benchmarks": sorted(benchmarks, key=lambda b: order(b.get("name") if isinstance(b, dict) else None)),
        "results": sorted(results, key=lambda r: order(r.get("benchmark") if isinstance(r, dict) else None)),
        "errors": [*local.get("errors", []), *link.get("errors", [])],
        "elapsed_s": float(local.get("elapsed_s") or 0.0) + float(link.get("elapsed_s") or 0.0),
    }


class SuiteCrashed(GpuhostError):
    """The suite binary died: on a GPU that should work, that is itself a finding (exit 1)."""

    exit_code = EXIT_FINDINGS


@dataclass(frozen=True)
class SmokeOptions:
    quick: bool = False
    # --device: NVML's index, a UUID or a PCI address (identity.Visibility.select); None: CUDA's device 0.
    device: str | None = None
    gpu_table: Path | None = None
    baseline: Path | None = None
    cache_dir: Path | None = None
    rebuild: bool = False
    benchmarks: tuple[str, ...] = ()
    seed: int | None = None
    # The stream-ordering self-test: every poison, fill and counter reset first holds its stream
    # this many milliseconds (gpuhost-kernels --delay-streams), so a check that does not wait
    # for them reports a wrong result.
    delay_streams_ms: float | None = None


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    run: SuiteRun
    suite_document: dict[str, Any]
    environment: Environment
    samples: tuple[RunSamples, ...]
    model_table: str
    timings: Timings
    build: BuildInfo
    with_baseline: bool
    contention: Contention | None = None  # None: a recorded run from before issue 14
    health: Health | None = None  # likewise
    gpu: GpuIdentity | None = None  # the GPU measured; None in a replay of a run recorded without it


@dataclass(frozen=True)
class SuiteTarget:
    """The GPU a suite process measures and the GPUs it may use (its CUDA devices, in NVML's order:
    the GPU and, where it measures P2P, its visible peers)."""

    gpu: GpuIdentity
    devices: tuple[GpuIdentity, ...]

    @property
    def ordinal(self) -> int:
        """The GPU's CUDA device number inside the suite process."""
        return next(i for i, g in enumerate(self.devices) if g.index == self.gpu.index)

    def environment(self) -> dict[str, str]:
        return suite_environment(self.devices, os.environ)

    def read(self, document: dict[str, Any]) -> dict[str, Any]:
        """The process's document in NVML's numbering, once its device is checked to be this GPU."""
        return in_machine_numbering(document, self.devices)


def suite_command(binary: Path, options: SmokeOptions, target: SuiteTarget, then: tuple[str, ...] = ()) -> list[str]:
    """The suite's command line; `then`: the set it runs once told to (gpuhost-kernels --then)."""
    command = [str(binary), "--device", str(target.ordinal)]
    if options.quick:
        command.append("--quick")
    if options.benchmarks:
        command += ["--bench", ",".join(options.benchmarks)]
    if then:
        command += ["--then", ",".join(then)]
    if options.seed is not None:
        command += ["--seed", str(options.seed)]
    if options.delay_streams_ms is not None:
        command += ["--delay-streams", f"{options.delay_streams_ms:g}"]
    return command


def _check_exit(returncode: int, stderr: str) -> None:
    """The suite's exit status: 0 (all ran) and 3 (some benchmark raised: listed in its document) pass."""
    if returncode == 2:
        raise GpuUnavailable(f"the kernel suite could not use the GPU: {stderr.strip()[-600:]}")
    if returncode not in (0, 3):
        raise SuiteCrashed(f"the kernel suite exited with status {returncode}: {stderr.strip()[-800:]}")


def _document(stdout: str, stderr: str) -> dict[str, Any]:
    try:
        document = json.loads(stdout)
    except json.JSONDecodeError as error:
        raise SuiteCrashed(f"the kernel suite printed no JSON ({error}): {stderr.strip()[-400:]}") from error
    if not isinstance(document, dict):
        raise SuiteCrashed("the kernel suite printed JSON that is not an object")
    return document


def run_suite(
    binary: Path, options: SmokeOptions, target: SuiteTarget, stop: StopCheck | None = None
) -> dict[str, Any]:
    try:
        returncode, stdout, stderr = run_bounded(
            suite_command(binary, options, target), target.environment(), SUITE_TIMEOUT_S, stop
        )
    except subprocess.TimeoutExpired as error:
        raise SuiteCrashed(f"the kernel suite ran past {SUITE_TIMEOUT_S} s and was stopped") from error
    except SuiteStopped as stopped:
        raise SuiteCrashed(f"the kernel suite was stopped: {stopped}") from stopped
    _check_exit(returncode, stderr)
    return target.read(_document(stdout, stderr))


class SuiteInTwo:
    """One suite process for one GPU's two sets (gpuhost-kernels --then): `first()` waits for the
    first set's document; `second()` tells the suite to go on and waits for the second's. Between
    them the process waits, idle, on its own context: the second set starts without a process's
    start. The bounds and failures are run_suite's: each set within SUITE_TIMEOUT_S, `stop` asked
    every STOP_POLL_S, no process left behind."""

    def __init__(
        self, binary: Path, options: SmokeOptions, target: SuiteTarget, then: tuple[str, ...], stop: StopCheck | None
    ) -> None:
        self._stop = stop
        self._target = target
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._process = subprocess.Popen(
            suite_command(binary, options, target, then),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=target.environment(),
        )
        # Both pipes read by threads, so that neither fills while the suite waits or runs.
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the suite closed its stdout: it ended

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        self._stderr.extend(self._process.stderr)

    def _stderr_text(self) -> str:
        for reader in self._readers:
            reader.join(timeout=10 * STOP_POLL_S)
        return "".join(self._stderr)

    def _next_document(self) -> dict[str, Any]:
        deadline = time.monotonic() + SUITE_TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=STOP_POLL_S)
            except queue.Empty:
                reason = self._stop() if self._stop is not None else None
                if reason is not None:
                    self.close()
                    raise SuiteCrashed(f"the kernel suite was stopped: {reason}") from None
                if time.monotonic() >= deadline:
                    self.close()
                    raise SuiteCrashed(f"the kernel suite ran past {SUITE_TIMEOUT_S} s and was stopped") from None
                continue
            if line is None:  # it ended before this document: its status says why
                returncode = self._process.wait(timeout=10 * STOP_POLL_S)
                stderr = self._stderr_text()
                _check_exit(returncode, stderr)
                raise SuiteCrashed(f"the kernel suite ended before its document: {stderr.strip()[-400:]}")
            if line.strip():
                return self._target.read(_document(line, "".join(self._stderr)))

    def first(self) -> dict[str, Any]:
        return self._next_document()

    def second(self) -> dict[str, Any]:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write("go\n")
            self._process.stdin.close()
        except BrokenPipeError:  # it ended already: reading says how
            pass
        document = self._next_document()
        try:
            returncode = self._process.wait(timeout=SUITE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.close()
            raise SuiteCrashed("the kernel suite did not exit after its last document") from None
        _check_exit(returncode, self._stderr_text())
        return document

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10 * STOP_POLL_S)
        for pipe in (self._process.stdin, self._process.stdout, self._process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def __enter__(self) -> SuiteInTwo:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def run_suite_explained(
    binary: Path, options: SmokeOptions, target: SuiteTarget, environment: Environment, stop: StopCheck | None = None
) -> dict[str, Any]:
    """run_suite; when it cannot use the GPU and NVML said a GPU's NVSwitch fabric is not ready, the
    error names that (its problem code and Fabric Manager): CUDA error 802 alone does not say why."""
    with explained(environment):
        return run_suite(binary, options, target, stop)


@contextlib.contextmanager
def explained(environment: Environment) -> Iterator[None]:
    """A suite's failure inside, with the NVSwitch fabric's problems NVML reported named on it."""
    try:
        yield
    except (GpuUnavailable, SuiteCrashed) as error:
        problems = fabric_problems(environment)
        if not problems:
            raise
        findings = "\n".join(f"[{problem.code}] {problem}" for problem in problems)
        raise type(error)(f"{error}\n{findings}", exit_code=error.exit_code) from error


def below_pass(verdict: Verdict, document: dict[str, Any]) -> dict[str, str]:
    """The verified, timed results judged below PASS, by name, with the benchmark that measures each
    (a result of a suite older than issue 14 names no benchmark and is not re-measured)."""
    benchmark_of = {
        str(result.get("name")): str(result.get("benchmark"))
        for result in document.get("results", [])
        if isinstance(result, dict) and result.get("benchmark")
    }
    return {
        metric.metric: benchmark_of[metric.metric]
        for metric in verdict.metrics
        if metric.status in (Status.WARN, Status.FAIL)
        and metric.verified
        and metric.spread is not None
        and metric.metric in benchmark_of
    }


def _merged(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """One result from two measurements of it: their repetitions pooled, the figure rescaled to the
    pooled median (the suite's figure is work over the median time, so the work cancels out)."""
    samples = [*first["samples_ms"], *again["samples_ms"]]
    median_ms = statistics.median(samples)
    rule = rule_for(str(first["name"]))
    lower_is_better = rule is not None and rule.lower_is_better
    scale = median_ms / first["median_ms"] if lower_is_better else first["median_ms"] / median_ms
    return {
        **first,
        "value": first["value"] * scale,
        "median_ms": median_ms,
        "min_ms": min(samples),
        "max_ms": max(samples),
        "reps": len(samples),
        "samples_ms": samples,
        "verified": bool(first["verified"]) and bool(again["verified"]),
        "error": max(first.get("error") or 0.0, again.get("error") or 0.0),
        "extra": {
            **first.get("extra", {}),
            "remeasured": {"first_value": first["value"], "again_value": again["value"], "first_reps": first["reps"]},
        },
    }


def merge_remeasured(document: dict[str, Any], again: dict[str, Any], metrics: set[str]) -> dict[str, Any]:
    """`document` with each result named in `metrics` pooled with its re-measurement from `again`;
    a result that the second run lost or could not time keeps its first measurement."""
    second = {
        result["name"]: result
        for result in again.get("results", [])
        if isinstance(result, dict) and result.get("samples_ms") and result.get("value") is not None
    }
    results = []
    for result in document.get("results", []):
        name = result.get("name") if isinstance(result, dict) else None
        if name in metrics and name in second and result.get("samples_ms") and result.get("median_ms"):
            results.append(_merged(result, second[name]))
        else:
            results.append(result)
    errors = [*document.get("errors", []), *again.get("errors", [])]
    return {**document, "results": results, "errors": errors}


def processes_on(nvml: Any, gpus: Iterable[int], phase: Phase) -> tuple[tuple[GpuProcess, ...], bool]:
    """The processes NVML lists on `gpus` (NVML indices), and whether it could list them all."""
    found: list[GpuProcess] = []
    try:
        for index in gpus:
            found.extend(read_processes(nvml, nvml.nvmlDeviceGetHandleByIndex(index), index, phase))
    except nvml.NVMLError:
        return tuple(found), False
    return tuple(found), True


def _replays(nvml: Any, count: int) -> tuple[int | None, ...]:
    counters: list[int | None] = []
    for index in range(count):
        try:
            counters.append(int(nvml.nvmlDeviceGetPcieReplayCounter(nvml.nvmlDeviceGetHandleByIndex(index))))
        except nvml.NVMLError:
            counters.append(None)
    return tuple(counters)


def _utilization(nvml: Any, count: int) -> tuple[int | None, ...]:
    readings: list[int | None] = []
    for index in range(count):
        try:
            readings.append(int(nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(index)).gpu))
        except nvml.NVMLError:
            readings.append(None)
    return tuple(readings)


def _remeasured(
    binary: Path,
    options: SmokeOptions,
    target: SuiteTarget,
    environment: Environment,
    stop: StopCheck | None,
    model: GpuModel | None,
) -> dict[str, Any]:
    """The suite's document for `options`, each result below PASS measured once more and pooled."""
    document = run_suite_explained(binary, options, target, environment, stop)
    return _remeasure_low(binary, options, target, environment, stop, model, document)


def _remeasure_low(
    binary: Path,
    options: SmokeOptions,
    target: SuiteTarget,
    environment: Environment,
    stop: StopCheck | None,
    model: GpuModel | None,
    document: dict[str, Any],
) -> dict[str, Any]:
    # Re-measure once before calling a result below PASS: a slow spell of the link or
    # the host (seen on the H100 guest) should not decide the verdict on its own.
    first = judge(parse_suite_document(document), model=model, complete=False)
    low = below_pass(first, document)
    if not low:
        return document
    again = run_suite_explained(
        binary, replace(options, benchmarks=tuple(sorted(set(low.values())))), target, environment, stop
    )
    return merge_remeasured(document, again, set(low))


def _scheduled(
    binary: Path,
    options: SmokeOptions,
    target: SuiteTarget,
    environment: Environment,
    stop: StopCheck | None,
    model: GpuModel | None,
    schedule: NodeSchedule,
) -> dict[str, Any]:
    """As _remeasured, in two halves of one suite process (SuiteInTwo): the local benchmarks now,
    beside the other GPUs' (whose suite processes are ours, never contention), then in this GPU's
    link turn the link benchmarks, and the re-measurements. P2P is the node's (NODE_JUDGED_BENCHMARKS)."""
    local, link = split_benchmarks(options)
    link = tuple(b for b in link if b not in NODE_JUDGED_BENCHMARKS)
    gpu = target.gpu.index
    if not local or not link:  # one set only: one plain run, local now or in the link turn
        document: dict[str, Any] | None = None
        try:
            if local:
                document = run_suite_explained(binary, replace(options, benchmarks=local), target, environment, stop)
        finally:
            schedule.local_done(gpu)
        with schedule.link_turn(gpu):
            if link:
                document = run_suite_explained(binary, replace(options, benchmarks=link), target, environment, stop)
            if document is None:  # --only names at least one benchmark
                raise InputError("no benchmark to run")
            return _remeasure_low(binary, options, target, environment, stop, model, document)
    with (
        explained(environment),
        SuiteInTwo(binary, replace(options, benchmarks=local), target, link, stop) as suite,
    ):
        try:
            document = suite.first()
        finally:
            schedule.local_done(gpu)
        with schedule.link_turn(gpu):
            document = combined_documents(document, suite.second())
            return _remeasure_low(binary, options, target, environment, stop, model, document)


def smoke_test(
    options: SmokeOptions,
    on_environment: Callable[[Environment], None] | None = None,
    stop: StopCheck | None = None,
    schedule: NodeSchedule | None = None,
) -> Outcome:
    """One smoke test. `on_environment` hears what NVML showed as soon as it is read, so that a
    run stopped later (no nvcc, a crashed suite) can still report it; `stop` (smoke-test --all: a
    fatal Xid on this GPU) is asked while the suite runs and stops it with its reason; `schedule`
    (smoke-test --all) runs the local benchmarks beside the other GPUs' and the link ones alone."""
    started = time.monotonic()
    # Inputs first: a bad table or baseline should not wait for a build.
    table = load_model_table(options.gpu_table)
    baseline = load_baseline(options.baseline) if options.baseline else None
    nvml = load_pynvml()
    count = open_nvml(nvml)
    try:
        environment = read_environment(nvml, count)
        if on_environment is not None:
            on_environment(environment)
        visibility = visibility_of(environment, os.environ)
        chosen = visibility.select(options.device)
        gpu = environment.gpus[chosen.index]
        # Under --all (a schedule) P2P is the node's: the process sees its GPU alone. Alone too where
        # no P2P is measured; else its visible peers too, all in NVML's order (the pairs' numbering).
        with_peers = schedule is None and "p2p" in (options.benchmarks or SUITE_BENCHMARKS)
        devices = tuple(g for g in sorted(visibility.visible, key=lambda g: g.index) if with_peers or g == chosen)
        target = SuiteTarget(chosen, devices)
        sources = find_kernel_sources()
        toolchain = detect_toolchain()
        built: BuiltSuite = build_suite(
            gpu.compute_capability,
            cache_dir=options.cache_dir,
            sources=sources,
            toolchain=toolchain,
            force=options.rebuild,
        )
        # Contention: who else holds the GPUs before, during (the sampler) and after the run.
        used = {g.index for g in devices}
        before, readable_before = processes_on(nvml, sorted(used), "before")
        utilization = _utilization(nvml, count)
        log_before = read_kernel_log()
        replays_before = _replays(nvml, count)
        suite_started = time.monotonic()
        with NvmlSampler(nvml, tuple(range(count))) as sampler:
            # The sampler reads once as it starts, so even a very short run has a sample.
            model = table.lookup(gpu.pci_device_id)
            if schedule is None:
                document = _remeasured(built.binary, options, target, environment, stop, model)
            else:
                document = _scheduled(built.binary, options, target, environment, stop, model, schedule)
        samples = sampler.results()
        suite_s = time.monotonic() - suite_started
        during, readable_during = sampler.processes()
        after, readable_after = processes_on(nvml, sorted(used), "after")
        log_after = read_kernel_log() if log_before is not None else None
        health = Health(
            parse_xid_lines(lines_since(log_before, log_after)) if log_before is not None and log_after else (),
            log_before is not None and log_after is not None,
            replays_before,
            _replays(nvml, count),
        )
        # Only the GPUs this run uses: a process on a GPU the scheduler gave someone else is not contention.
        contention = Contention(
            tuple(p for p in merge((*before, *during, *after)) if p.gpu in used),
            utilization,
            readable_before and readable_during and readable_after,
        )
    finally:
        nvml.nvmlShutdown()
    run = parse_suite_document(document)
    models: dict[int, GpuModel | None] = {g.index: table.lookup(g.pci_device_id) for g in environment.gpus}
    checks = [*judge_environment(environment, samples, models, only=used), *judge_health(health)]
    verdict = judge(
        run,
        model=models[chosen.index],
        checks=checks,
        baseline=baseline,
        complete=not options.benchmarks,
        contention=contention,
        in_node=schedule is not None,
    )
    timings = Timings(built.seconds, built.cached, suite_s, time.monotonic() - started)
    build = BuildInfo(str(built.binary), built.arch, built.cache_key, toolchain.version, built.with_cublas)
    return Outcome(
        verdict,
        run,
        document,
        environment,
        samples,
        table.origin,
        timings,
        build,
        baseline is not None,
        contention,
        health,
        chosen,
    )


def replay(recorded_path: Path, options: SmokeOptions) -> Outcome:
    """Judge a recorded --json document again, with today's rules, table and baseline: no GPU needed."""
    table = load_model_table(options.gpu_table)
    baseline = load_baseline(options.baseline) if options.baseline else None
    recorded = load_recorded(recorded_path)
    models: dict[int, GpuModel | None] = {g.index: table.lookup(g.pci_device_id) for g in recorded.environment.gpus}
    measured = recorded.run.device.index
    if measured not in models:
        # Judged without its GPU, the run had no model and no datasheet figure to fall short of: PASS.
        raise InputError(
            f"the recorded run {recorded_path}: its measured device {measured} is not among the GPUs its "
            f"environment lists ({', '.join(str(index) for index in sorted(models)) or 'none'}); the file is not "
            "one run's --json: pass the file gpuhost wrote"
        )
    checks = [*judge_environment(recorded.environment, recorded.samples, models), *judge_health(recorded.health)]
    verdict = judge(
        recorded.run,
        model=models.get(recorded.run.device.index),
        checks=checks,
        baseline=baseline,
        contention=recorded.contention,
    )
    return Outcome(
        verdict,
        recorded.run,
        recorded.suite_document,
        recorded.environment,
        recorded.samples,
        table.origin,
        recorded.timings,
        recorded.build,
        baseline is not None,
        recorded.contention,
        recorded.health,
        recorded.gpu,
    )
