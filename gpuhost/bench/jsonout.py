"""The JSON document `smoke-test --json FILE` writes, and reading one back as a baseline.

Schema "gpuhost-smoke-test/1" (an object):

    schema            "gpuhost-smoke-test/1"
    gpuhost_version   str
    created           ISO-8601 UTC time of the run
    outcome           "PASS"|"WARN"|"FAIL"|"NOT REPRESENTATIVE" (another process used the GPU)
    gpu               the GPU measured: {"index" (NVML's), "uuid", "pci_bus_id", "cuda_ordinal" (its CUDA
                      device number under the run's CUDA_VISIBLE_DEVICES)}; absent in runs recorded before
    contention        null (a run recorded before contention was read) or {"processes": [{"gpu", "pid", "name",
                      "used_memory_bytes", "kind": "compute"|"graphics", "seen": ["before"|"during"|"after"]}],
                      "utilization_before_pct": [int|null per GPU], "readable": bool}
    health            null (a run recorded before health was read) or {"xid_events": [{"address", "code", "detail"}]
                      (NVRM Xid lines logged during the run), "kernel_log_readable", "pcie_replays_before",
                      "pcie_replays_after": [int|null per GPU]}
    verdict           {"status": "PASS"|"WARN"|"FAIL", "outcome" (as above), "reasons": [str, ...],
                      "unstable": [str, ...]}
    model             null (unknown model) or {"name", "pci_device_ids": ["2330"], "memory_bandwidth_GBps",
                      "bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops", "pcie_gen", "pcie_width",
                      "nvlink_GBps", "sources": [str]}
    model_table       str: the table file the model came from
    environment       {"driver_version", "cuda_driver_version", "gpus": [{every GpuEnvironment field;
                      "link": {current_gen, current_width, max_gen, max_width, gpu_max_gen};
                      "fabric": null (NVML cannot say; absent in runs recorded before it was read) or
                      {"state": "not-supported"|"not-started"|"in-progress"|"completed"|"unknown",
                      "status" (NVML's return code of the registration, 0 success), "clique_id",
                      "health_mask" (null from the older NVML call)}}]}
    samples           [{every RunSamples field, "throttle_names": [str]}]: NVML readings during the run
    checks            [{"check", "status", "detail", "gpu", "code", "severity", "remedy"}]: the environment
                      checks; code/severity/remedy are the row's gpuhost.problems.Problem (null on a PASS)
    metrics           [{"metric", "label", "value", "unit", "reference", "reference_kind",
                        "percent_of_reference", "baseline", "percent_of_baseline", "verified",
                        "status", "reason", "judged_value" (the capability figure judged: 75th
                        percentile of the repetitions towards the fast end; "value" is their median),
                        "spread": null (untimed) or {"samples", "slowest", "median", "fastest",
                        "capability", "stability_pct", "groups": [{"count", "low", "high"}],
                        "unstable"}}]
    timings           {"build_s", "build_cached", "suite_s", "total_s"}
    build             {"binary", "arch", "cache_key", "nvcc", "with_cublas"}
    suite             the kernel suite's own document, verbatim (results.py describes it)

When the smoke-test cannot run (or its suite crashes), `--json` still writes a document, a small one:

    schema, gpuhost_version, created
    outcome           "cannot run"
    exit_code         2 (no GPU, driver, nvcc, bad input) or 1 (the suite crashed on the GPU)
    reason            the error message, as printed
    environment       what NVML showed before it stopped (as above), or null

`--replay` and `--baseline` refuse such a document: it holds no results.

Numbers that could not be measured are null. `--baseline` accepts this document or the
suite's own document.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

from gpuhost import __version__
from gpuhost.bench.contention import Contention, GpuProcess
from gpuhost.bench.environment import (
    Environment,
    FabricReading,
    FabricState,
    GpuEnvironment,
    PcieLinkReading,
    RunSamples,
)
from gpuhost.bench.health import Health, XidEvent
from gpuhost.bench.identity import GpuIdentity
from gpuhost.bench.models import GpuModel
from gpuhost.bench.results import SuiteRun, parse_suite_document
from gpuhost.bench.rules import CheckOutcome
from gpuhost.bench.spread import Spread
from gpuhost.bench.strictjson import read_json_file
from gpuhost.bench.verdict import Verdict
from gpuhost.errors import GpuhostError, InputError

SCHEMA = "gpuhost-smoke-test/1"
# `smoke-test --all --json` (gpuhost.bench.node writes it): named here so that a one-GPU
# --baseline given a node's run can say which it is.
NODE_SCHEMA = "gpuhost.smoke-node/1"


@dataclasses.dataclass(frozen=True)
class Timings:
    build_s: float
    build_cached: bool
    suite_s: float
    total_s: float


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    binary: str
    arch: str
    cache_key: str
    nvcc: str
    with_cublas: bool


def _model(model: GpuModel | None) -> dict[str, Any] | None:
    if model is None:
        return None
    return {
        "name": model.name,
        "pci_device_ids": [f"{i:04x}" for i in model.pci_device_ids],
        "memory_bandwidth_GBps": model.memory_bandwidth_gbps,
        "bf16_tflops": model.bf16_tflops,
        "fp16_tflops": model.fp16_tflops,
        "tf32_tflops": model.tf32_tflops,
        "fp32_tflops": model.fp32_tflops,
        "pcie_gen": model.pcie_gen,
        "pcie_width": model.pcie_width,
        "nvlink_GBps": model.nvlink_gbps,
        "sources": list(model.sources),
    }


def _check(outcome: CheckOutcome) -> dict[str, Any]:
    problem = outcome.problem
    return {
        "check": outcome.check,
        "status": outcome.status.value,
        "detail": outcome.detail,
        "gpu": outcome.gpu,
        "code": problem.code if problem else None,
        "severity": problem.severity.value if problem else None,
        "remedy": problem.remedy if problem else None,
    }


def _environment(environment: Environment | None) -> dict[str, Any] | None:
    return None if environment is None else dataclasses.asdict(environment)


def _samples(samples: tuple[RunSamples, ...]) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(s), "throttle_names": list(s.throttle_names)} for s in samples]


def _spread(spread: Spread | None) -> dict[str, Any] | None:
    if spread is None:
        return None
    return {
        "samples": spread.samples,
        "slowest": spread.worst,
        "median": spread.median,
        "fastest": spread.best,
        "capability": spread.capability,
        "stability_pct": spread.stability_pct,
        "groups": [dataclasses.asdict(group) for group in spread.groups],
        "unstable": spread.unstable,
    }


def _header(created: datetime.datetime | None) -> dict[str, Any]:
    """The keys every document starts with: which schema, which gpuhost, when."""
    when = created or datetime.datetime.now(datetime.timezone.utc)
    return {"schema": SCHEMA, "gpuhost_version": __version__, "created": when.isoformat(timespec="seconds")}


def build_document(
    *,
    verdict: Verdict,
    suite_document: dict[str, Any],
    environment: Environment | None,
    samples: tuple[RunSamples, ...],
    model_table: str,
    timings: Timings,
    build: BuildInfo,
    contention: Contention | None = None,
    health: Health | None = None,
    created: datetime.datetime | None = None,
    gpu: GpuIdentity | None = None,
) -> dict[str, Any]:
    return {
        **_header(created),
        "outcome": verdict.outcome,
        **({} if gpu is None else {"gpu": dataclasses.asdict(gpu)}),
        "contention": None if contention is None else dataclasses.asdict(contention),
        "health": None if health is None else dataclasses.asdict(health),
        "verdict": {
            "status": verdict.status.value,
            "outcome": verdict.outcome,
            "reasons": list(verdict.reasons),
            "unstable": list(verdict.unstable),
        },
        "model": _model(verdict.model),
        "model_table": model_table,
        "environment": _environment(environment),
        "samples": _samples(samples),
        "checks": [_check(c) for c in verdict.checks],
        "metrics": [
            {
                "metric": m.metric,
                "label": m.label,
                "value": m.value,
                "unit": m.unit,
                "reference": m.reference,
                "reference_kind": m.reference_kind,
                "percent_of_reference": m.percent_of_reference,
                "baseline": m.baseline,
                "percent_of_baseline": m.percent_of_baseline,
                "verified": m.verified,
                "status": m.status.value,
                "reason": m.reason,
                "judged_value": m.judged_value,
                "spread": _spread(m.spread),
            }
            for m in verdict.metrics
        ],
        "timings": dataclasses.asdict(timings),
        "build": dataclasses.asdict(build),
        "suite": suite_document,
    }


CANNOT_RUN = "cannot run"


def build_failure_document(
    *, reason: str, exit_code: int, environment: Environment | None, created: datetime.datetime | None = None
) -> dict[str, Any]:
    """The document of a run that stopped before a verdict: why, and what was found until then."""
    return {
        **_header(created),
        "outcome": CANNOT_RUN,
        "exit_code": exit_code,
        "reason": reason,
        "environment": _environment(environment),
    }


def _refuse_failure_document(document: Any, path: Path, use: str) -> None:
    if isinstance(document, dict) and document.get("schema") == SCHEMA and document.get("outcome") == CANNOT_RUN:
        raise InputError(
            f"{path} records a smoke-test that could not run ({document.get('reason', 'no reason given')}): "
            f"it holds no results to {use}; pass the --json of a run that finished"
        )


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def load_baseline(path: Path) -> SuiteRun:
    """A baseline is an earlier smoke-test document, or the suite's own output."""
    document = read_json_file(path, "the baseline")
    _refuse_failure_document(document, path, "compare with (--baseline)")
    if isinstance(document, dict) and document.get("schema") == NODE_SCHEMA:
        raise InputError(
            f"the baseline {path} is a whole node's run (smoke-test --all --json): compare a node with it "
            "(`--all --baseline FILE`), or one GPU with one GPU's run (`--device N --json`)"
        )
    if isinstance(document, dict) and document.get("schema") == SCHEMA:
        document = document.get("suite")
    try:
        return parse_suite_document(document)
    except GpuhostError as error:  # name the file in the message
        raise InputError(f"the baseline {path} is neither a smoke-test JSON nor a suite output: {error}") from error


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A smoke-test document read back: enough to judge the run again without a GPU."""

    suite_document: dict[str, Any]
    run: SuiteRun
    environment: Environment
    samples: tuple[RunSamples, ...]
    timings: Timings
    build: BuildInfo
    contention: Contention | None  # None: recorded before contention was read
    health: Health | None  # likewise
    gpu: GpuIdentity | None = None  # None: recorded before identities were kept


def _health(raw: Any) -> Health | None:
    if raw is None:
        return None
    fields = _fields(Health, raw, "health")
    events = tuple(
        XidEvent(**_fields(XidEvent, event, f"health.xid_events[{i}]"))
        for i, event in enumerate(fields["xid_events"] or [])
    )
    return Health(
        events,
        bool(fields["kernel_log_readable"]),
        tuple(fields["pcie_replays_before"] or ()),
        tuple(fields["pcie_replays_after"] or ()),
    )


def _contention(raw: Any) -> Contention | None:
    if raw is None:
        return None
    fields = _fields(Contention, raw, "contention")
    processes = []
    for i, raw_process in enumerate(fields["processes"] or []):
        process = _fields(GpuProcess, raw_process, f"contention.processes[{i}]")
        process["seen"] = tuple(process["seen"])
        processes.append(GpuProcess(**process))
    return Contention(tuple(processes), tuple(fields["utilization_before_pct"] or ()), bool(fields["readable"]))


def _fields(cls: type, raw: Any, where: str) -> dict[str, Any]:
    """The fields of `cls` from `raw`, each scalar checked against its annotation: a recorded run
    that says Gen -1, a compute capability of 9 or a string for a count is refused by name."""
    if not isinstance(raw, dict):
        raise InputError(f"recorded run: {where} must be an object")
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    # A field with a default came later (GpuEnvironment.fabric): older records lack it and keep it.
    defaulted = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    missing = fields.keys() - raw.keys() - defaulted
    if missing:
        raise InputError(f"recorded run: {where} lacks {sorted(missing)}")
    return {name: _checked(raw[name], str(kind), f"{where}.{name}") for name, kind in fields.items() if name in raw}


def _fabric(raw: Any, where: str) -> FabricReading | None:
    if raw is None:
        return None
    fields = _fields(FabricReading, raw, where)
    states = [state.value for state in FabricState]
    if fields["state"] not in states:
        raise InputError(f"recorded run: {where}.state must be one of {', '.join(states)}, not {fields['state']!r}")
    return FabricReading(
        FabricState(fields["state"]),
        fields["status"],
        fields["clique_id"],
        fields["health_mask"],
    )


def _checked(value: Any, kind: str, where: str) -> Any:
    """`value` as the annotation `kind` wants it; annotations of nested records pass through."""
    optional = kind.endswith(" | None")
    base = kind.removesuffix(" | None")
    if value is None and (optional or base == "tuple[int | None, ...]"):
        return () if base.startswith("tuple[") else None
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                f"recorded run: {where} must be a whole number >= 0{' or null' if optional else ''}, not {value!r}"
            )
        return value
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise InputError(
                f"recorded run: {where} must be a number >= 0{' or null' if optional else ''}, not {value!r}"
            )
        return float(value)
    if base in ("bool", "str"):
        if not isinstance(value, bool if base == "bool" else str):
            raise InputError(f"recorded run: {where} must be a {base}{' or null' if optional else ''}, not {value!r}")
        return value
    if base == "tuple[int, int]":
        if not isinstance(value, list) or len(value) != 2:
            raise InputError(f"recorded run: {where} must be a list of two whole numbers, not {value!r}")
        return tuple(_checked(item, "int", f"{where}[{i}]") for i, item in enumerate(value))
    if base == "tuple[int | None, ...]":
        if not isinstance(value, list):
            raise InputError(f"recorded run: {where} must be a list, not {value!r}")
        return tuple(_checked(item, "int | None", f"{where}[{i}]") for i, item in enumerate(value))
    return value


def read_recorded(document: Any) -> Recorded:
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise InputError(f"not a smoke-test JSON document (schema {SCHEMA})")
    raw_environment = document.get("environment")
    environment_fields = _fields(Environment, raw_environment, "environment")
    raw_gpus = environment_fields.pop("gpus")
    if not isinstance(raw_gpus, list) or not raw_gpus:
        # A run measures a GPU: the smoke-test stops (exit 2) before the suite where NVML finds none.
        raise InputError("recorded run: environment.gpus names no GPU, so nothing in it was measured on one")
    gpus = []
    for i, raw_gpu in enumerate(raw_gpus):
        gpu = _fields(GpuEnvironment, raw_gpu, f"environment.gpus[{i}]")
        gpu["link"] = PcieLinkReading(**_fields(PcieLinkReading, gpu["link"], f"environment.gpus[{i}].link"))
        if "fabric" in gpu:
            gpu["fabric"] = _fabric(gpu["fabric"], f"environment.gpus[{i}].fabric")
        gpus.append(GpuEnvironment(**gpu))
    environment = Environment(**environment_fields, gpus=tuple(gpus))
    samples = tuple(
        RunSamples(**_fields(RunSamples, raw, f"samples[{i}]")) for i, raw in enumerate(document.get("samples") or [])
    )
    suite_document = document.get("suite")
    if not isinstance(suite_document, dict):
        raise InputError("recorded run: 'suite' must be the suite's document")
    return Recorded(
        suite_document=suite_document,
        run=parse_suite_document(suite_document),
        environment=environment,
        samples=samples,
        timings=Timings(**_fields(Timings, document.get("timings"), "timings")),
        build=BuildInfo(**_fields(BuildInfo, document.get("build"), "build")),
        contention=_contention(document.get("contention")),
        health=_health(document.get("health")),
        gpu=None if document.get("gpu") is None else GpuIdentity(**_fields(GpuIdentity, document["gpu"], "gpu")),
    )


def load_recorded(path: Path) -> Recorded:
    document = read_json_file(path, "the recorded run")
    _refuse_failure_document(document, path, "judge again (--replay)")
    try:
        return read_recorded(document)
    except GpuhostError as error:  # name the file in the message
        raise InputError(f"{path}: {error}") from error
