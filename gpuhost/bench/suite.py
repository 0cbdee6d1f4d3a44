"""The kernel suite as a process: its command line, its environment (pinned to its GPUs by UUID), its
bounds (a timeout, a stop asked while it runs), its two-set protocol (--then), and its document read
strictly and put in NVML's numbering. Every run of gpuhost-kernels, one GPU's or the node's, goes
through here."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuhost.bench.environment import Environment, GpuUnavailable
from gpuhost.bench.environment_judge import fabric_problems
from gpuhost.bench.identity import GpuIdentity, GpuMismatch, in_machine_numbering, suite_environment
from gpuhost.bench.strictjson import StrictJsonError, strict_loads
from gpuhost.errors import EXIT_FINDINGS, GpuhostError

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


def read_document(stdout: str, stderr: str) -> dict[str, Any]:
    """The suite's JSON document, read strictly (strictjson: no NaN, no runaway numbers)."""
    try:
        document = strict_loads(stdout)
    except StrictJsonError as error:
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
    return target.read(read_document(stdout, stderr))


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
                return self._target.read(read_document(line, "".join(self._stderr)))

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


def run_node_suite(
    binary: Path,
    arguments: list[str],
    gpus: tuple[GpuIdentity, ...],
    environ: dict[str, str],
    timeout: float,
    stop: Callable[[], str | None] | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """A node run of the suite on `gpus` (its CUDA devices, in NVML's order): its document in NVML's
    numbering, or why there is none (never an exception: the other measurements and the GPUs'
    verdicts are kept). `stop` is asked while it runs: a reason from it (a fatal Xid) stops the run
    there, as the timeout does a hang."""
    try:
        env = {**suite_environment(gpus, os.environ), **environ}
    except GpuMismatch as error:
        return None, str(error)
    try:
        returncode, stdout, stderr = run_bounded([str(binary), *arguments], env, timeout, stop)
    except OSError as error:
        return None, f"could not start: {error}"
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout:g} s and was stopped (a hang)"
    except SuiteStopped as stopped:
        return None, f"stopped: {stopped}"
    try:
        document = read_document(stdout, stderr)
    except SuiteCrashed:
        return None, f"exited with status {returncode} and no results: {stderr.strip()[-500:]}"
    try:
        return in_machine_numbering(document, gpus), None
    except GpuMismatch as error:
        return None, str(error)
