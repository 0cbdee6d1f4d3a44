"""The GPU model table: datasheet figures by PCI device ID, loaded from package data.

The table is data (gpuhost/data/gpu_models.json) so that a new model, or a deliberately
wrong expectation for testing the verdict, is a JSON edit: `smoke-test --gpu-table FILE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuhost.bench.strictjson import StrictJsonError, read_json_file, strict_loads
from gpuhost.errors import InputError

PACKAGED_TABLE = "gpu_models.json"

# PCIe payload bandwidth per lane and direction in GB/s, after line encoding
# (8b/10b up to Gen2, 128b/130b from Gen3); Gen5 x16 gives the 63 GB/s ceiling.
PCIE_LANE_GBPS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_ceiling_gbps(generation: int, width: int) -> float | None:
    """Per-direction ceiling of a PCIe link; None for a generation the table does not know."""
    lane = PCIE_LANE_GBPS.get(generation)
    return None if lane is None else lane * width


@dataclass(frozen=True)
class GpuModel:
    name: str
    pci_device_ids: tuple[int, ...]
    memory_gb: float
    memory_bandwidth_gbps: float | None
    bf16_tflops: float | None
    fp16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float | None
    sm_count: int | None
    pcie_gen: int
    pcie_width: int
    nvlink_gbps: float | None  # one direction, between two GPUs
    p2p_expected: bool
    datacenter: bool
    sources: tuple[str, ...]  # full source names, resolved from the table's keys
    nvlink_links: int | None = None  # NVLinks per GPU (18 on H100/H200 SXM); None: none or not known

    @property
    def pcie_ceiling_gbps(self) -> float | None:
        return pcie_ceiling_gbps(self.pcie_gen, self.pcie_width)

    def peak(self, kind: str) -> float | None:
        """Datasheet figure a measurement is compared with (see verdict.REFERENCE_KINDS)."""
        if kind == "memory_bandwidth":
            return self.memory_bandwidth_gbps
        if kind in ("bf16", "fp16", "tf32", "fp32"):
            value: float | None = getattr(self, f"{kind}_tflops")
            return value
        if kind == "pcie":
            return self.pcie_ceiling_gbps
        if kind == "pcie_both":
            ceiling = self.pcie_ceiling_gbps
            return None if ceiling is None else 2 * ceiling
        if kind == "nvlink":
            return self.nvlink_gbps
        raise ValueError(f"unknown reference kind {kind!r}")


@dataclass(frozen=True)
class ModelTable:
    models: tuple[GpuModel, ...]
    origin: str  # the file it came from, for the report

    def lookup(self, pci_device_id: int) -> GpuModel | None:
        for model in self.models:
            if pci_device_id in model.pci_device_ids:
                return model
        return None


def _number(entry: dict[str, Any], key: str, where: str, *, optional: bool) -> float | None:
    value = entry.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{where}: '{key}' must be a positive number{' or null' if optional else ''}, got {value!r}")
    return float(value)


def _parse_model(entry: Any, sources: dict[str, str], where: str) -> GpuModel:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: each model must be an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: 'name' must be a non-empty string")
    where = f"{where} ({name})"
    ids = entry.get("pci_device_ids")
    if not isinstance(ids, list) or not ids:
        raise InputError(f"{where}: 'pci_device_ids' must be a non-empty list of hex strings like \"2330\"")
    try:
        device_ids = tuple(int(str(value), 16) for value in ids)
    except ValueError as error:
        raise InputError(f"{where}: bad PCI device ID in {ids!r}") from error
    source_keys = entry.get("sources", [])
    if not isinstance(source_keys, list) or not source_keys:
        raise InputError(f"{where}: 'sources' must name at least one source: figures need a provenance")
    unknown = [key for key in source_keys if key not in sources]
    if unknown:
        raise InputError(f"{where}: sources {unknown} are not defined in the table's 'sources'")
    pcie_gen = entry.get("pcie_gen")
    pcie_width = entry.get("pcie_width")
    if not isinstance(pcie_gen, int) or pcie_gen not in PCIE_LANE_GBPS:
        raise InputError(f"{where}: 'pcie_gen' must be one of {sorted(PCIE_LANE_GBPS)}")
    if not isinstance(pcie_width, int) or pcie_width not in (1, 2, 4, 8, 16):
        raise InputError(f"{where}: 'pcie_width' must be 1, 2, 4, 8 or 16")
    sm_count = entry.get("sm_count")
    nvlink_links = entry.get("nvlink_links")
    if nvlink_links is not None and (
        isinstance(nvlink_links, bool) or not isinstance(nvlink_links, int) or nvlink_links < 1
    ):
        raise InputError(f"{where}: 'nvlink_links' must be a positive whole number or null, got {nvlink_links!r}")
    memory_gb = _number(entry, "memory_gb", where, optional=False)
    assert memory_gb is not None
    return GpuModel(
        name=name,
        pci_device_ids=device_ids,
        memory_gb=memory_gb,
        memory_bandwidth_gbps=_number(entry, "memory_bandwidth_GBps", where, optional=True),
        bf16_tflops=_number(entry, "bf16_tflops", where, optional=True),
        fp16_tflops=_number(entry, "fp16_tflops", where, optional=True),
        tf32_tflops=_number(entry, "tf32_tflops", where, optional=True),
        fp32_tflops=_number(entry, "fp32_tflops", where, optional=True),
        sm_count=sm_count if isinstance(sm_count, int) else None,
        pcie_gen=pcie_gen,
        pcie_width=pcie_width,
        nvlink_gbps=_number(entry, "nvlink_GBps", where, optional=True),
        p2p_expected=bool(entry.get("p2p_expected", True)),
        datacenter=bool(entry.get("datacenter", True)),
        sources=tuple(sources[key] for key in source_keys),
        nvlink_links=nvlink_links,
    )


def parse_model_table(text: str, origin: str) -> ModelTable:
    try:
        document = strict_loads(text)
    except StrictJsonError as error:
        raise InputError(f"GPU model table {origin} is not valid JSON: {error}") from None
    return parse_model_document(document, origin)


def parse_model_document(document: Any, origin: str) -> ModelTable:
    if not isinstance(document, dict) or document.get("format") != 1:
        raise InputError(f'GPU model table {origin}: expected an object with "format": 1')
    sources = document.get("sources")
    models = document.get("models")
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise InputError(f"GPU model table {origin}: 'sources' must map keys to source names")
    if not isinstance(models, list) or not models:
        raise InputError(f"GPU model table {origin}: 'models' must be a non-empty list")
    parsed = tuple(_parse_model(entry, sources, f"{origin} model {i}") for i, entry in enumerate(models))
    seen: dict[int, str] = {}
    for model in parsed:
        for device_id in model.pci_device_ids:
            if device_id in seen:
                raise InputError(
                    f"GPU model table {origin}: PCI ID {device_id:04x} is listed for both "
                    f"{seen[device_id]} and {model.name}"
                )
            seen[device_id] = model.name
    return ModelTable(parsed, origin)


def load_model_table(path: Path | None = None) -> ModelTable:
    """The packaged table, or the one at `path` (e.g. a test's deliberately wrong table)."""
    if path is None:
        text = resources.files("gpuhost").joinpath("data", PACKAGED_TABLE).read_text(encoding="utf-8")
        return parse_model_table(text, f"gpuhost/data/{PACKAGED_TABLE}")
    return parse_model_document(read_json_file(path, "the GPU model table"), str(path))
