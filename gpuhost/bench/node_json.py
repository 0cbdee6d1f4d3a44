"""`smoke-test --all --json`: the node's document (gpuhost.smoke-node/1) written and read back, and an
earlier one read as a node baseline, its GPUs matched by UUID or PCI address."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuhost.bench.contention import GpuProcess
from gpuhost.bench.environment import GpuEnvironment, NvlinkReading
from gpuhost.bench.health import GpuXid
from gpuhost.bench.identity import GpuIdentity, pci_address, renumbered
from gpuhost.bench.jsonout import CANNOT_RUN, NODE_SCHEMA, SCHEMA, read_recorded
from gpuhost.bench.node_model import BaselineComparison, NodeBaseline, NodeFigure, NodeOutcome, NodeRecord
from gpuhost.bench.results import SuiteRun
from gpuhost.bench.strictjson import read_json_file
from gpuhost.errors import InputError


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


def _named_by(outcome: NodeOutcome, gpu: int) -> dict[str, Any]:
    identity = outcome.identities.get(gpu)
    return {} if identity is None else {"pci_bus_id": identity.pci_bus_id, "uuid": identity.uuid}


def is_node_document(document: Any) -> bool:
    return isinstance(document, dict) and document.get("schema") == NODE_SCHEMA


def read_record(raw: Any) -> NodeRecord:
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


def recorded_identities(
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
        record = read_record(node.get("record") if isinstance(node, dict) else None)
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
    theirs = recorded_identities(record, gpus, listed)
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
