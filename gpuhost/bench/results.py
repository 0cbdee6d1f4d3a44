"""Parse the kernel suite's JSON (stdout of gpuhost-kernels) into frozen dataclasses.

The suite's document (format 1):

    {"suite": "gpuhost-kernels", "format": 1, "quick": bool, "seed": int,
     "device": {"index", "count", "name", "compute_capability", "sm_count", "l2_bytes",
                "memory_bytes", "sm_clock_khz", "memory_clock_khz", "memory_bus_bits", "pci_bus_id"},
     "versions": {"cuda_driver", "cuda_runtime", "cublaslt"},
     "benchmarks": [{"name", "seconds"}],
     "results": [{"name", "benchmark" (older suites: none), "unit", "value", "median_ms", "min_ms", "max_ms", "reps",
                  "samples_ms", "verified", "error", "check", "params": {...}, "extra": {...}}],
     "errors": [{"benchmark", "message"}],
     "elapsed_s": float}

JSON null stands for a value that could not be measured (the suite writes no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuhost.bench.strictjson import StrictJsonError, strict_loads
from gpuhost.errors import GpuhostError

SUITE_NAME = "gpuhost-kernels"
SUITE_FORMAT = 1


class ResultParseError(GpuhostError):
    """The suite's output is not the document this version of gpuhost understands."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    count: int
    name: str
    compute_capability: str
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    sm_clock_khz: int
    pci_bus_id: str


@dataclass(frozen=True)
class Measurement:
    name: str
    unit: str
    value: float | None
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    reps: int
    samples_ms: tuple[float, ...]
    verified: bool
    error: float | None
    check: str
    params: Mapping[str, Any]
    extra: Mapping[str, Any]

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the timed repetitions: how steady the figure is."""
        if self.median_ms is None or self.min_ms is None or self.max_ms is None or self.median_ms <= 0:
            return None
        return (self.max_ms - self.min_ms) / self.median_ms


@dataclass(frozen=True)
class SuiteError:
    benchmark: str
    message: str


@dataclass(frozen=True)
class SuiteRun:
    quick: bool
    seed: int
    device: DeviceInfo
    versions: Mapping[str, int]
    benchmark_seconds: Mapping[str, float]
    measurements: tuple[Measurement, ...]
    errors: tuple[SuiteError, ...]
    elapsed_s: float

    def get(self, name: str) -> Measurement | None:
        for measurement in self.measurements:
            if measurement.name == name:
                return measurement
        return None


def _require(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in mapping:
        raise ResultParseError(f"suite output: {where} lacks '{key}'")
    value = mapping[key]
    # bool is an int in Python; a bool where a number belongs is still a malformed document.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise ResultParseError(f"suite output: {where}.{key} has the wrong type ({type(value).__name__})")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _number(value: Any, where: str) -> float:
    """A measured quantity: finite and not negative (bandwidths, rates, times, counts, errors)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultParseError(f"suite output: {where} must be a number, not {type(value).__name__}")
    number = float(value)  # the strict reader bounds integers: no overflow here
    if not math.isfinite(number) or number < 0:
        raise ResultParseError(f"suite output: {where} is {value!r}: a measured figure is finite and not negative")
    return number


def _optional_number(mapping: Mapping[str, Any], key: str, where: str) -> float | None:
    value = mapping.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultParseError(f"suite output: {where}.{key} must be a number or null, not {type(value).__name__}")
    return _number(value, f"{where}.{key}")


def _frozen(mapping: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(mapping, dict):
        raise ResultParseError(f"suite output: {where} must be an object")
    return MappingProxyType(dict(mapping))


def _measurement(raw: Any, index: int) -> Measurement:
    if not isinstance(raw, dict):
        raise ResultParseError(f"suite output: results[{index}] must be an object")
    where = f"results[{index}]"
    name = _require(raw, "name", str, where)
    where = f"result '{name}'"
    samples = raw.get("samples_ms", [])
    if not isinstance(samples, list):
        raise ResultParseError(f"suite output: {where}.samples_ms must be a list")
    return Measurement(
        name=name,
        unit=_require(raw, "unit", str, where),
        value=_optional_number(raw, "value", where),
        median_ms=_optional_number(raw, "median_ms", where),
        min_ms=_optional_number(raw, "min_ms", where),
        max_ms=_optional_number(raw, "max_ms", where),
        reps=int(_number(_require(raw, "reps", int, where), f"{where}.reps")),
        samples_ms=tuple(_number(s, f"{where}.samples_ms[{i}]") for i, s in enumerate(samples)),
        verified=bool(_require(raw, "verified", bool, where)),
        error=_optional_number(raw, "error", where),
        check=str(raw.get("check", "")),
        params=_frozen(raw.get("params", {}), f"{where}.params"),
        extra=_frozen(raw.get("extra", {}), f"{where}.extra"),
    )


def parse_suite_document(document: Any) -> SuiteRun:
    if not isinstance(document, dict):
        raise ResultParseError("suite output: the document must be a JSON object")
    if document.get("suite") != SUITE_NAME or document.get("format") != SUITE_FORMAT:
        raise ResultParseError(
            f"suite output: expected suite '{SUITE_NAME}' format {SUITE_FORMAT}, got "
            f"{document.get('suite')!r} format {document.get('format')!r}"
        )
    device = _require(document, "device", dict, "document")
    device_info = DeviceInfo(
        index=int(_require(device, "index", int, "device")),
        count=int(_require(device, "count", int, "device")),
        name=_require(device, "name", str, "device"),
        compute_capability=_require(device, "compute_capability", str, "device"),
        sm_count=int(_require(device, "sm_count", int, "device")),
        l2_bytes=int(_require(device, "l2_bytes", int, "device")),
        memory_bytes=int(_require(device, "memory_bytes", int, "device")),
        sm_clock_khz=int(device.get("sm_clock_khz", 0)),
        pci_bus_id=str(device.get("pci_bus_id", "")),
    )
    versions = _require(document, "versions", dict, "document")
    results = _require(document, "results", list, "document")
    errors = _require(document, "errors", list, "document")
    benchmarks = document.get("benchmarks", [])
    parsed_errors = []
    for i, raw in enumerate(errors):
        if not isinstance(raw, dict):
            raise ResultParseError(f"suite output: errors[{i}] must be an object")
        parsed_errors.append(
            SuiteError(_require(raw, "benchmark", str, f"errors[{i}]"), _require(raw, "message", str, f"errors[{i}]"))
        )
    seconds = {
        str(entry["name"]): float(entry["seconds"])
        for entry in benchmarks
        if isinstance(entry, dict) and isinstance(entry.get("seconds"), (int, float))
    }
    return SuiteRun(
        quick=bool(_require(document, "quick", bool, "document")),
        seed=int(_require(document, "seed", int, "document")),
        device=device_info,
        versions=MappingProxyType({str(k): int(v) for k, v in versions.items() if isinstance(v, int)}),
        benchmark_seconds=MappingProxyType(seconds),
        measurements=tuple(_measurement(raw, i) for i, raw in enumerate(results)),
        errors=tuple(parsed_errors),
        elapsed_s=float(_require(document, "elapsed_s", (int, float), "document")),
    )


def parse_suite_output(text: str) -> SuiteRun:
    try:
        document = strict_loads(text)
    except StrictJsonError as error:
        raise ResultParseError(f"suite output is not JSON ({error}); first bytes: {text[:120]!r}") from error
    return parse_suite_document(document)
