"""The node's measurements judged against the model table: P2P, host <-> all GPUs, NVLinks, NCCL's collectives."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from typing import TypeVar

from gpuhost.bench.health import (
    XID_EVENT,
)
from gpuhost.bench.models import GpuModel
from gpuhost.bench.node_baseline import NODE_BELOW_BASELINE, baseline_findings, compare_with_baseline
from gpuhost.bench.node_model import BaselineComparison, NodeBaseline, NodeFigure, NodeFinding, NodeRecord, NodeVerdict
from gpuhost.bench.results import Measurement, parse_suite_document
from gpuhost.bench.rules import Status, graded, node_problem, node_rule, worst
from gpuhost.problems import Severity, Stage, register

P2P_NO_ACCESS = register(
    "smoke.node.p2p.no-access",
    Stage.SMOKE_TEST,
    Severity.ERROR,
    "a GPU pair without peer access: copies go through the host",
)

P2P_SLOW = register(
    "smoke.node.p2p.slow", Stage.SMOKE_TEST, None, "a P2P figure below its link (warning) or far below it (error)"
)

P2P_BELOW_MEDIAN = register(
    "smoke.node.p2p.below-median", Stage.SMOKE_TEST, Severity.WARNING, "a GPU pair well below the matrix's median"
)

HOST_SLOW_GPU = register(
    "smoke.node.host.slow-gpu",
    Stage.SMOKE_TEST,
    Severity.WARNING,
    "a GPU's share of the all-at-once host copies well below the others'",
)

NVLINK_LINKS = register(
    "smoke.node.nvlink.links",
    Stage.SMOKE_TEST,
    None,
    "fewer active NVLinks than the model has (error) or unreadable (info)",
)

NCCL_MISSING = register(
    "smoke.node.nccl.missing", Stage.SMOKE_TEST, Severity.WARNING, "no NCCL found: the collectives are unmeasured"
)

NCCL_FAILED = register(
    "smoke.node.nccl.failed", Stage.SMOKE_TEST, Severity.ERROR, "NCCL failed to initialise, hung or gave wrong results"
)

NCCL_SLOW = register(
    "smoke.node.nccl.slow",
    Stage.SMOKE_TEST,
    None,
    "a collective's bus bandwidth below the link (warning) or far below (error)",
)

NODE_BENCHMARK_FAILED = register(
    "smoke.node.benchmark.failed", Stage.SMOKE_TEST, Severity.ERROR, "a node measurement did not complete"
)

XID_UNWATCHED = register(
    "smoke.node.xid.unwatched",
    Stage.SMOKE_TEST,
    Severity.INFO,
    "NVML could not watch for Xid events during --all: only the kernel log can show them",
)

# The phase of an --all run in which the node's own measurements run (health.GpuXid.phase).
NODE_PHASE = "the node measurements"

NODE_CONTENTION = register(
    "smoke.node.contention",
    Stage.SMOKE_TEST,
    Severity.WARNING,
    "another process used a GPU during the node measurements",
)


# The node's lines, each with its reason and evidence, are rules.NODE_RULES; their names here for
# the judging below.
def _lines(name: str) -> tuple[float, float]:
    rule = node_rule(name)
    assert rule.pass_at is not None
    return rule.pass_at, rule.fail_below if rule.fail_below is not None else 0.0


P2P_PASS, P2P_FAIL = _lines("p2p_pair")
BIDIR_PASS, BIDIR_FAIL = _lines("p2p_bidir")
ALL_TO_ALL_PASS, ALL_TO_ALL_FAIL = _lines("p2p_all_to_all")
BELOW_MEDIAN, _ = _lines("p2p_pair_median")
HOST_SHARE_BELOW_MEDIAN, _ = _lines("host_share_median")
NCCL_PASS, NCCL_FAIL = _lines("nccl")
NCCL_TWO_RANK_GATHER_PASS, _ = _lines("nccl_two_rank_gather")


def nccl_pass_fraction(collective: str, ranks: int) -> float:
    """The fraction of the link a collective's bus bandwidth must reach to PASS on `ranks` GPUs."""
    if ranks == 2 and collective in ("nccl_all_gather", "nccl_reduce_scatter"):
        return NCCL_TWO_RANK_GATHER_PASS
    return NCCL_PASS


HOST_SHARE_REMEDY = (
    "a shared or narrower uplink, or pinned memory on the far NUMA node: check the GPU's PCIe link and NUMA node"
)

COLLECTIVES = ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter")


# ---------------------------------------------------------------------------------- judging
def _link(model: GpuModel | None, on_nvlink: bool) -> tuple[str | None, float | None]:
    if model is None:
        return None, None
    if on_nvlink and model.nvlink_gbps is not None:
        return "nvlink", model.nvlink_gbps
    return "pcie", model.pcie_ceiling_gbps


def judge_node(
    record: NodeRecord, models: Sequence[GpuModel | None], baseline: NodeBaseline | None = None
) -> NodeVerdict:
    """The node's verdict: each figure against the model table and, with `baseline`, against the
    same figure of that earlier node run."""
    figures: list[NodeFigure] = []
    findings: list[NodeFinding] = []
    model = models[0] if models else None
    busy = sorted({p.gpu for p in record.contention})
    nvlink_of = {r.gpu: r.active for r in record.nvlinks}

    def on_nvlink(gpus: Iterable[int]) -> bool:
        return all((nvlink_of.get(g) or 0) > 0 for g in gpus)

    def add(
        metric: str,
        label: str,
        m: Measurement | None,
        gpus: tuple[int, ...],
        kind: str | None,
        reference: float | None,
        pass_at: float,
        fail_below: float,
        code: str,
        why: str,
    ) -> NodeFigure:
        value = None if m is None else m.value
        fraction = None if value is None or reference is None else value / reference
        status = graded(fraction, pass_at, fail_below)
        reason = why
        if m is not None and not m.verified:
            status, reason = Status.FAIL, f"wrong result: {m.check}"
        if value is None:
            status, reason = Status.FAIL, "not measured"
        figure = NodeFigure(
            metric,
            label,
            value,
            "GB/s",
            reference,
            kind,
            None if fraction is None else 100 * fraction,
            status,
            reason,
            gpus,
            dict(m.extra) if m is not None else {},
        )
        figures.append(figure)
        if status in (Status.WARN, Status.FAIL):
            shown = "not measured" if value is None else f"{value:.1f} GB/s"
            of = "" if fraction is None else f", {100 * fraction:.0f}% of {reference:.0f} GB/s ({kind})"
            findings.append(
                NodeFinding(
                    label,
                    f"{shown}{of}: {reason}",
                    status,
                    node_problem(
                        code,
                        status,
                        label,
                        f"{label}: {shown}{of}",
                        "check the link, the fabric and the guest's PCI topology",
                    ),
                    gpus,
                )
            )
        return figure

    # NVLink links per GPU, from NVML.
    expected_links = model.nvlink_links if model is not None else None
    for reading in record.nvlinks:
        label = f"NVLink links, GPU {reading.gpu}"
        if reading.active is None:
            findings.append(
                NodeFinding(
                    label,
                    "NVML could not read the links' states",
                    Status.INFO,
                    node_problem(NVLINK_LINKS, Status.INFO, label, f"{label}: unreadable"),
                    (reading.gpu,),
                )
            )
        elif expected_links is None:
            findings.append(
                NodeFinding(
                    label, f"{reading.active} active; the model table gives no count", Status.INFO, None, (reading.gpu,)
                )
            )
        elif reading.active < expected_links:
            detail = f"{reading.active} of the model's {expected_links} links active"
            findings.append(
                NodeFinding(
                    label,
                    detail,
                    Status.FAIL,
                    node_problem(
                        NVLINK_LINKS,
                        Status.FAIL,
                        label,
                        f"{label}: {detail}",
                        "a link down or not trained: check the host's NVLink and Fabric Manager, and the VM's GPU set",
                    ),
                    (reading.gpu,),
                )
            )
        else:
            findings.append(
                NodeFinding(label, f"{reading.active} of {expected_links} active", Status.PASS, None, (reading.gpu,))
            )

    # The P2P matrix and the host copies.
    if record.suite_error is not None:
        findings.append(
            NodeFinding(
                "node measurements",
                record.suite_error,
                Status.FAIL,
                node_problem(
                    NODE_BENCHMARK_FAILED,
                    Status.FAIL,
                    "node measurements",
                    f"node measurements: {record.suite_error}",
                    "read the error; check the GPUs' Xid events and the driver",
                ),
            )
        )
    if record.suite is not None:
        run = parse_suite_document(record.suite)
        for error in run.errors:
            findings.append(
                NodeFinding(
                    f"benchmark {error.benchmark}",
                    error.message,
                    Status.FAIL,
                    node_problem(
                        NODE_BENCHMARK_FAILED,
                        Status.FAIL,
                        error.benchmark,
                        f"{error.benchmark} did not complete: {error.message}",
                    ),
                )
            )
        by_name = {m.name: m for m in run.measurements}
        pairs = [m for m in run.measurements if m.name.startswith("p2p_pair_")]
        for m in pairs:
            a, b = int(m.params["src"]), int(m.params["dst"])
            label = f"P2P GPU {a} -> GPU {b}"
            if not m.params.get("peer_access", False):
                expected = model is None or model.p2p_expected
                status = Status.FAIL if expected else Status.INFO
                findings.append(
                    NodeFinding(
                        label,
                        "no peer access: the copy went through host memory",
                        status,
                        node_problem(
                            P2P_NO_ACCESS,
                            status,
                            label,
                            f"{label}: no peer access (cudaDeviceCanAccessPeer 0 or blocked)",
                            "the hypervisor or ACS blocks P2P: pass the GPUs with their switch, or enable ATS/ACS "
                            "redirection as the host guide says",
                        )
                        if status is Status.FAIL
                        else None,
                        (a, b),
                    )
                )
            kind, reference = _link(model, on_nvlink((a, b)))
            add(
                m.name,
                label,
                m,
                (a, b),
                kind,
                reference if m.params.get("peer_access") else None,
                P2P_PASS,
                P2P_FAIL,
                P2P_SLOW,
                "a direct peer path runs near link speed; through host memory it runs far below",
            )
        values = [m.value for m in pairs if m.value is not None]
        if len(values) >= 3:
            median = statistics.median(values)
            for m in pairs:
                if m.value is not None and m.value < BELOW_MEDIAN * median:
                    a, b = int(m.params["src"]), int(m.params["dst"])
                    label = f"P2P GPU {a} -> GPU {b}"
                    detail = (
                        f"{m.value:.1f} GB/s, {100 * m.value / median:.0f}% of the matrix's median {median:.1f} GB/s"
                    )
                    findings.append(
                        NodeFinding(
                            label,
                            detail,
                            Status.WARN,
                            node_problem(
                                P2P_BELOW_MEDIAN,
                                Status.WARN,
                                label,
                                f"{label}: {detail}",
                                "a degraded link or a pair routed another way: check nvidia-smi topo -m and nvlink -s",
                            ),
                            (a, b),
                        )
                    )
        for m in run.measurements:
            if m.name.startswith("p2p_bidir_"):
                a, b = int(m.params["src"]), int(m.params["dst"])
                kind, reference = _link(model, on_nvlink((a, b)))
                add(
                    m.name,
                    f"P2P GPU {a} <-> GPU {b}, both at once",
                    m,
                    (a, b),
                    kind,
                    None if reference is None or not m.params.get("peer_access") else 2 * reference,
                    BIDIR_PASS,
                    BIDIR_FAIL,
                    P2P_SLOW,
                    "full duplex: twice the link at most",
                )
        if "p2p_all_to_all" in by_name:
            m = by_name["p2p_all_to_all"]
            n = record.gpu_count
            kind, reference = _link(model, on_nvlink(range(n)))
            add(
                m.name,
                "P2P all to all",
                m,
                tuple(range(n)),
                kind,
                None if reference is None else n * reference,
                ALL_TO_ALL_PASS,
                ALL_TO_ALL_FAIL,
                P2P_SLOW,
                "every GPU sending at once: the GPUs' links together",
            )
        for name, label in (("h2d_all", "host -> every GPU at once"), ("d2h_all", "every GPU -> host at once")):
            copies = by_name.get(name)
            if copies is None:
                continue
            ceiling = model.pcie_ceiling_gbps if model is not None else None
            n = record.gpu_count
            reference = None if ceiling is None else n * ceiling
            status = Status.FAIL if not copies.verified else Status.INFO
            figures.append(
                NodeFigure(
                    name,
                    label,
                    copies.value,
                    "GB/s",
                    reference,
                    "pcie",
                    None if reference is None or copies.value is None else 100 * copies.value / reference,
                    status,
                    "the host's memory and root complexes bound the sum: reported, each GPU's share is judged"
                    if copies.verified
                    else f"wrong result: {copies.check}",
                    tuple(range(n)),
                    dict(copies.extra),
                )
            )
            shares = [(int(p["gpu"]), float(p["GBps"])) for p in copies.extra.get("per_gpu", []) if p.get("GBps")]
            if len(shares) >= 2:
                median = statistics.median(v for _, v in shares)
                for gpu, value in shares:
                    if value < HOST_SHARE_BELOW_MEDIAN * median:
                        what = f"{label}, GPU {gpu}"
                        detail = f"{value:.1f} GB/s, {100 * value / median:.0f}% of the GPUs' median {median:.1f} GB/s"
                        findings.append(
                            NodeFinding(
                                what,
                                detail,
                                Status.WARN,
                                node_problem(
                                    HOST_SLOW_GPU,
                                    Status.WARN,
                                    what,
                                    f"{what}: {detail}",
                                    HOST_SHARE_REMEDY,
                                ),
                                (gpu,),
                            )
                        )

    # NCCL.
    if record.nccl_library is None and record.nccl_error is None and record.gpu_count >= 2:
        findings.append(
            NodeFinding(
                "NCCL",
                "no libnccl.so found: the collectives are unmeasured",
                Status.WARN,
                node_problem(
                    NCCL_MISSING,
                    Status.WARN,
                    "NCCL",
                    "NCCL: no libnccl.so found; all_reduce/all_gather/reduce_scatter unmeasured",
                    "install libnccl2 or the nvidia-nccl-cu13 wheel, or name the library with GPUHOST_NCCL",
                ),
            )
        )
    if record.nccl_error is not None:
        findings.append(
            NodeFinding(
                "NCCL",
                record.nccl_error,
                Status.FAIL,
                node_problem(
                    NCCL_FAILED,
                    Status.FAIL,
                    "NCCL",
                    f"NCCL: {record.nccl_error}",
                    "run with NCCL_DEBUG=INFO; check peer access and the guest's topology",
                ),
            )
        )
    if record.nccl is not None:
        run = parse_suite_document(record.nccl)
        for error in run.errors:
            findings.append(
                NodeFinding(
                    "NCCL",
                    error.message,
                    Status.FAIL,
                    node_problem(
                        NCCL_FAILED,
                        Status.FAIL,
                        "NCCL",
                        f"NCCL: {error.message}",
                        "run with NCCL_DEBUG=INFO; check peer access and the guest's topology",
                    ),
                )
            )
        by_name = {m.name: m for m in run.measurements}
        kind, reference = _link(model, on_nvlink(range(record.gpu_count)))
        for name in COLLECTIVES:
            if name in by_name or not run.errors:
                add(
                    name,
                    f"NCCL {name.removeprefix('nccl_')} bus bandwidth",
                    by_name.get(name),
                    tuple(range(record.gpu_count)),
                    kind,
                    reference,
                    nccl_pass_fraction(name, record.gpu_count),
                    NCCL_FAIL,
                    NCCL_SLOW,
                    "nccl-tests' bus bandwidth at the largest size against one direction of the link",
                )

    if busy:
        for gpu in busy:
            described = "; ".join(p.describe() for p in record.contention if p.gpu == gpu)
            findings.append(
                NodeFinding(
                    f"contention, GPU {gpu}",
                    described,
                    Status.WARN,
                    node_problem(
                        NODE_CONTENTION,
                        Status.WARN,
                        f"GPU {gpu}",
                        f"another process used GPU {gpu} during the node measurements: {described}; the figures that "
                        f"involve GPU {gpu} measure a shared GPU",
                        "stop the other process and run again",
                    ),
                    (gpu,),
                )
            )
    # Xids NVML reported during the node measurements: a finding on the GPU each hit (its own verdict
    # gets every Xid on it too, rejudged). The figures stay as measured: the finding decides.
    for xid in record.xids:
        if xid.phase != NODE_PHASE:
            continue
        what = f"Xid {xid.code}, GPU {xid.gpu}" if xid.gpu >= 0 else f"Xid {xid.code}, a GPU NVML cannot name"
        findings.append(
            NodeFinding(
                what,
                f"{xid.describe()}. Check: {xid.meaning.check}",
                xid.meaning.status,
                node_problem(XID_EVENT, xid.meaning.status, what, xid.describe(), xid.meaning.check),
                (xid.gpu,) if xid.gpu >= 0 else (),
            )
        )
    if record.xids_watched is False:
        findings.append(
            NodeFinding(
                "Xid watch",
                f"{record.xid_unwatched}: Xids during --all show only in the kernel log",
                Status.INFO,
                node_problem(XID_UNWATCHED, Status.INFO, "Xid watch", f"Xid watch: {record.xid_unwatched}"),
            )
        )
    comparisons: list[BaselineComparison] = []
    if baseline is not None:
        comparisons = compare_with_baseline(figures, judge_node(baseline.record, models).figures)
        findings.extend(baseline_findings(comparisons, baseline.origin))
    # A figure that involves a busy GPU is reported, not judged.
    comparisons = _not_judged_where_busy(comparisons, busy)
    figures = _not_judged_where_busy(figures, busy)
    findings = [
        f
        for f in findings
        if not (
            f.problem is not None
            and f.problem.code in (P2P_SLOW, NCCL_SLOW, P2P_BELOW_MEDIAN, HOST_SLOW_GPU, NODE_BELOW_BASELINE)
            and set(f.gpus) & set(busy)
        )
    ]
    statuses = [f.status for f in figures] + [f.status for f in findings] + [c.status for c in comparisons]
    reasons = tuple(
        f"{f.status.value} {f.check}: {f.detail}" for f in findings if f.status in (Status.WARN, Status.FAIL)
    )
    return NodeVerdict(worst(statuses), not busy, tuple(figures), tuple(findings), reasons, tuple(comparisons))


# ---------------------------------------------------------------------------------- running
_Judged = TypeVar("_Judged", NodeFigure, BaselineComparison)


def _not_judged_where_busy(items: list[_Judged], busy: Iterable[int]) -> list[_Judged]:
    """Each item that involves a busy GPU, as INFO naming the GPUs; the others as they are."""
    busy_set = set(busy)
    return [
        dataclasses.replace(
            item,
            status=Status.INFO,
            reason=f"not judged: GPU(s) {', '.join(map(str, sorted(set(item.gpus) & busy_set)))} busy",
        )
        if set(item.gpus) & busy_set
        else item
        for item in items
    ]
