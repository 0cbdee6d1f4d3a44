"""Prometheus metrics of audit, apply and smoke-test (`--prometheus FILE`), for node_exporter's
textfile collector: one function per verb turns its typed results into exposition text.

The text is built with prometheus_client (a registry of gauges, rendered by generate_latest)
rather than by hand: it escapes label values (a host name is data from the host: quotes,
backslashes and newlines in it must not break or forge a series), formats floats as Prometheus
reads them and keeps HELP/TYPE lines consistent. Labels come only from fixed sets or identify
a subject: host names, problem codes, severities, GPU addresses and models, metric keys and the
status values of the verdict's and the report's own enums; never a message.

Every verb's file carries `gpuhost_info{verb, version}`; the verb label keeps the series apart
when the files of several verbs lie in one textfile directory (node_exporter drops a series that
two files both define, and logs an error on every scrape).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gpuhost import __version__
from gpuhost.bench.identity import pci_address
from gpuhost.errors import InputError, MissingDependencyError
from gpuhost.output import check_output_path, write_output
from gpuhost.problems import Problem

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge

    from gpuhost.audit import HostAudit
    from gpuhost.bench.environment import GpuEnvironment
    from gpuhost.bench.node_model import NodeOutcome
    from gpuhost.bench.results import SuiteRun
    from gpuhost.bench.verdict import Verdict
    from gpuhost.rollout.report import RolloutReport

OPTION = "--prometheus"
TEXTFILE_SUFFIX = ".prom"  # node_exporter's textfile collector reads only these


class Verb(str, enum.Enum):
    """The verbs that write metrics (gpuhost_info's `verb` label)."""

    AUDIT = "audit"
    APPLY = "apply"
    SMOKE_TEST = "smoke-test"


class UnitFamily(NamedTuple):
    """Where a smoke-test measurement in the suite's unit goes: a metric in base units."""

    name: str
    help: str
    scale: float  # suite unit -> base unit


# Every unit the kernel suite reports (kernels/*.cu: `unit = "..."`); a test fails when one is missing.
SMOKE_UNITS: Mapping[str, UnitFamily] = {
    "GB/s": UnitFamily(
        "gpuhost_smoke_bandwidth_bytes_per_second", "Measured bandwidth (the figure the verdict judged).", 1e9
    ),
    "TFLOP/s": UnitFamily(
        "gpuhost_smoke_compute_flop_per_second", "Measured floating-point throughput (the figure judged).", 1e12
    ),
    "us": UnitFamily("gpuhost_smoke_latency_seconds", "Measured latency (the figure the verdict judged).", 1e-6),
    "ratio": UnitFamily("gpuhost_smoke_speedup_ratio", "Measured speed-up of one variant over another.", 1.0),
    "pairs": UnitFamily("gpuhost_smoke_peer_pairs", "Ordered GPU pairs with peer-to-peer access.", 1.0),
}


def check_textfile_path(given: str | Path) -> None:
    """Refuse a --prometheus path before any work is done for it: node_exporter would ignore a
    file not ending in .prom, and an unwritable path should not wait for a rollout to fail.
    Give the path as typed: 'x.prom/' names a directory, which Path() would drop the '/' of."""
    path = Path(given)
    if not path.name.endswith(TEXTFILE_SUFFIX) or path.name == TEXTFILE_SUFFIX:
        raise InputError(
            f"{OPTION} {path}: node_exporter's textfile collector reads only files named *{TEXTFILE_SUFFIX}; "
            f"name it e.g. {path.with_name('gpuhost.prom')}."
        )
    check_output_path(given, OPTION)


def write_textfile(path: str | Path, content: bytes) -> None:
    """Write metrics atomically (a temporary file in the same directory, renamed over `path`), so the
    collector never reads half a file; the temporary name ends in .tmp, which it ignores."""
    check_textfile_path(path)
    write_output(path, content, OPTION)


class _Exposition:
    """One verb's metrics: a private registry (never the global one) and its gauges."""

    def __init__(self, verb: Verb) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as error:
            raise MissingDependencyError("prometheus-client", "metrics", OPTION) from error
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=True)
        info = self.gauge("gpuhost_info", "The gpuhost that wrote these metrics, and the verb.", ("verb", "version"))
        info.labels(verb=verb.value, version=__version__).set(1)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        from prometheus_client import Gauge

        return Gauge(name, documentation, labelnames=tuple(labels), registry=self.registry)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _state_set(gauge: Gauge, labels: Mapping[str, str], states: Iterable[str], current: str) -> None:
    """One series per possible state, 1 for the current one (OpenMetrics' StateSet, as gauges)."""
    for state in states:
        gauge.labels(**labels, status=state).set(1 if state == current else 0)


def _count_problems(gauge: Gauge, labels: Mapping[str, str], problems: Iterable[Problem]) -> None:
    counts = Counter((problem.code, problem.severity.value) for problem in problems)
    for (code, severity), count in sorted(counts.items()):
        gauge.labels(**labels, code=code, severity=severity).set(count)


def audit_metrics(results: Sequence[HostAudit], now: float) -> bytes:
    """Per host: audited at all (up), ready, its problems by code and severity, when, how long."""
    from gpuhost.audit import AuditStatus

    out = _Exposition(Verb.AUDIT)
    up = out.gauge("gpuhost_audit_up", "1 if the host could be audited (reached, read), 0 if not.", ("host",))
    ready = out.gauge(
        "gpuhost_audit_ready",
        "1 if the host is ready for passthrough (no error finding); 0 if not or not audited.",
        ("host",),
    )
    problems = out.gauge(
        "gpuhost_audit_problems",
        "Findings of the audit by problem code and severity (absent: none).",
        ("host", "code", "severity"),
    )
    timestamp = out.gauge("gpuhost_audit_timestamp_seconds", "When the audit ran (Unix time).", ("host",))
    duration = out.gauge("gpuhost_audit_duration_seconds", "How long the host's audit took.", ("host",))
    watchdogs = out.gauge(
        "gpuhost_audit_rescue_watchdogs",
        "Hardware watchdog devices that can reset a hung boot (absent: not gathered).",
        ("host",),
    )
    bmc = out.gauge(
        "gpuhost_audit_rescue_bmc",
        "1 if the host has a BMC interface (/dev/ipmi0), whose watchdog survives a reset (absent: not gathered).",
        ("host",),
    )
    for result in results:
        host = {"host": result.target.name}
        up.labels(**host).set(1 if result.error is None else 0)
        ready.labels(**host).set(1 if result.status is AuditStatus.READY else 0)
        _count_problems(problems, host, result.findings)
        timestamp.labels(**host).set(now)
        duration.labels(**host).set(result.seconds)
        rescue = result.facts.rescue if result.facts is not None else None
        if rescue is not None:
            watchdogs.labels(**host).set(len(rescue.watchdogs))
            bmc.labels(**host).set(1 if rescue.ipmi_device else 0)
    return out.text()


def apply_metrics(report: RolloutReport, now: float) -> bytes:
    """Per host: its status in the report (a state set over HostStatus) and whether it rebooted."""
    from gpuhost.rollout.report import HostStatus

    out = _Exposition(Verb.APPLY)
    status = out.gauge(
        "gpuhost_apply_status", "1 for the host's status in the apply report, 0 for the others.", ("host", "status")
    )
    rebooted = out.gauge("gpuhost_apply_rebooted", "1 if apply rebooted the host.", ("host",))
    for host in report.hosts:
        _state_set(status, {"host": host}, (s.value for s in HostStatus), report.status(host).value)
        rebooted.labels(host=host).set(1 if report.rebooted(host) else 0)
    out.gauge("gpuhost_apply_check_mode", "1 if the apply ran in check mode (nothing changed).").set(
        1 if report.check_mode else 0
    )
    if report.seconds is not None:
        out.gauge("gpuhost_apply_duration_seconds", "How long the rollout ran.").set(report.seconds)
    out.gauge("gpuhost_apply_timestamp_seconds", "When the apply finished (Unix time).").set(now)
    return out.text()


def smoke_test_metrics(verdict: Verdict, run: SuiteRun, now: float) -> bytes:
    """Per GPU and measurement: the judged figure in base units, its fraction of the datasheet (and
    of a baseline), its status; the overall verdict, the environment's problems, when."""
    out = _Exposition(Verb.SMOKE_TEST)
    _smoke_gpus(out, ((verdict, run),), now)
    return out.text()


def smoke_node_metrics(outcome: NodeOutcome, now: float) -> bytes:
    """`smoke-test --all`: every GPU's series as smoke_test_metrics writes them, in one exposition,
    and the node's: its verdict, each node figure (GB/s as bytes/s) with its status, its problems."""
    from gpuhost.bench.rules import Status

    out = _Exposition(Verb.SMOKE_TEST)
    _smoke_gpus(out, tuple((o.verdict, o.run) for o in outcome.gpus), now)
    statuses = tuple(s.value for s in Status)
    verdict = outcome.verdict
    node_verdict = out.gauge(
        "gpuhost_smoke_node_verdict",
        "1 for the node measurements' verdict (PASS, INFO, WARN, FAIL), 0 for the others.",
        ("status",),
    )
    _state_set(node_verdict, {}, statuses, verdict.status.value)
    out.gauge("gpuhost_smoke_node_representative", "0 if another process used a GPU during the node measurements.").set(
        1 if verdict.representative else 0
    )
    bandwidth = out.gauge(
        "gpuhost_smoke_node_bandwidth_bytes_per_second",
        "A node figure (P2P pair, all-to-all, host copies at once, NCCL bus bandwidth), bytes/s; gpus: the "
        "PCI addresses of the GPUs it involves (a pair: source, destination), in the metric's order.",
        ("metric", "gpus"),
    )
    status = out.gauge(
        "gpuhost_smoke_node_status", "1 for the node figure's status, 0 for the others.", ("metric", "gpus", "status")
    )
    named = outcome.identities
    for figure in verdict.figures:
        labels = {
            "metric": figure.metric,
            "gpus": ",".join(named[g].pci_bus_id if g in named else str(g) for g in figure.gpus),
        }
        if figure.value is not None:
            bandwidth.labels(**labels).set(figure.value * 1e9)
        _state_set(status, labels, statuses, figure.status.value)
    if outcome.baseline is not None:
        ratio = out.gauge(
            "gpuhost_smoke_node_baseline_ratio",
            "A node figure over the same figure of the --baseline node run (>1: better); size_bytes is a "
            "collective's size, empty for the figures of one size.",
            ("metric", "size_bytes"),
        )
        compared = out.gauge(
            "gpuhost_smoke_node_baseline_status",
            "1 for the status of a node figure against the baseline, 0 for the others.",
            ("metric", "size_bytes", "status"),
        )
        for comparison in verdict.baseline:
            labels = {
                "metric": comparison.metric,
                "size_bytes": "" if comparison.size_bytes is None else str(comparison.size_bytes),
            }
            if comparison.percent_of_baseline is not None:
                ratio.labels(**labels).set(comparison.percent_of_baseline / 100.0)
            _state_set(compared, labels, statuses, comparison.status.value)
    problems = out.gauge(
        "gpuhost_smoke_node_problems",
        "The node's findings by problem code and severity (absent: none).",
        ("code", "severity"),
    )
    _count_problems(problems, {}, verdict.problems)
    return out.text()


def _smoke_gpus(out: _Exposition, runs: Sequence[tuple[Verdict, SuiteRun]], now: float) -> None:
    from gpuhost.bench.rules import Status

    labels_of = ("gpu", "index", "model")
    statuses = tuple(s.value for s in Status)
    families = {
        unit: out.gauge(family.name, family.help, (*labels_of, "metric")) for unit, family in SMOKE_UNITS.items()
    }
    datasheet = out.gauge(
        "gpuhost_smoke_datasheet_ratio",
        "The judged figure over the model's datasheet figure (1 = datasheet).",
        (*labels_of, "metric"),
    )
    baseline = out.gauge(
        "gpuhost_smoke_baseline_ratio",
        "The judged figure over the baseline run's (>1: better).",
        (*labels_of, "metric"),
    )
    status = out.gauge(
        "gpuhost_smoke_status",
        "1 for the measurement's status (PASS, INFO, WARN, FAIL), 0 for the others.",
        (*labels_of, "metric", "status"),
    )
    overall = out.gauge(
        "gpuhost_smoke_verdict",
        "1 for the smoke-test's verdict (PASS, INFO, WARN, FAIL), 0 for the others.",
        (*labels_of, "status"),
    )
    representative = out.gauge(
        "gpuhost_smoke_representative",
        "0 if another process used the GPU during the run (not representative).",
        labels_of,
    )
    problems = out.gauge(
        "gpuhost_smoke_problems",
        "Findings of the environment checks by problem code and severity (absent: none).",
        (*labels_of, "code", "severity"),
    )
    up = out.gauge(
        "gpuhost_smoke_up", "1 if the smoke-test ran and reached a verdict, 0 if it could not run.", labels_of
    )
    stamp = out.gauge("gpuhost_smoke_timestamp_seconds", "When the smoke-test was judged (Unix time).", labels_of)
    for verdict, run in runs:
        # The GPU by its PCI address and NVML's index (bench.identity), as the text and JSON name it.
        gpu = {"gpu": pci_address(run.device.pci_bus_id), "index": str(run.device.index), "model": run.device.name}
        up.labels(**gpu).set(1)
        for metric in verdict.metrics:
            labels = {**gpu, "metric": metric.metric}
            family = SMOKE_UNITS.get(metric.unit)
            if family is not None and metric.judged_value is not None:
                families[metric.unit].labels(**labels).set(metric.judged_value * family.scale)
            if metric.percent_of_reference is not None:
                datasheet.labels(**labels).set(metric.percent_of_reference / 100.0)
            if metric.percent_of_baseline is not None:
                baseline.labels(**labels).set(metric.percent_of_baseline / 100.0)
            _state_set(status, labels, statuses, metric.status.value)
        _state_set(overall, gpu, statuses, verdict.status.value)
        representative.labels(**gpu).set(1 if verdict.representative else 0)
        _count_problems(problems, gpu, verdict.problems)
        stamp.labels(**gpu).set(now)


def smoke_test_failure_metrics(seen: GpuEnvironment | None, now: float) -> bytes:
    """A smoke-test that could not run (no driver, no nvcc, a crashed suite): up 0, so that the
    last run's PASS does not stay on the dashboard as if it were current. The GPU's labels are
    what NVML showed of it before it stopped ('' when nothing)."""
    out = _Exposition(Verb.SMOKE_TEST)
    gpu = {
        "gpu": pci_address(seen.pci_bus_id) if seen else "",
        "index": str(seen.index) if seen else "",
        "model": seen.name if seen else "",
    }
    _smoke_up(out, gpu, 0)
    _smoke_timestamp(out, gpu, now)
    return out.text()


def _smoke_up(out: _Exposition, gpu: Mapping[str, str], value: int) -> None:
    out.gauge(
        "gpuhost_smoke_up", "1 if the smoke-test ran and reached a verdict, 0 if it could not run.", tuple(gpu)
    ).labels(**gpu).set(value)


def _smoke_timestamp(out: _Exposition, gpu: Mapping[str, str], now: float) -> None:
    out.gauge("gpuhost_smoke_timestamp_seconds", "When the smoke-test was judged (Unix time).", tuple(gpu)).labels(
        **gpu
    ).set(now)
