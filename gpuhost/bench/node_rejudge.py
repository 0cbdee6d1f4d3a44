"""Each GPU's run of `--all` judged as its own: its contention, its Xids (NVML's and the kernel log's
that are its own), its environment among the judged GPUs, and its run in a node baseline."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from gpuhost.bench.contention import Contention
from gpuhost.bench.environment_judge import judge_environment
from gpuhost.bench.health import GpuXid, Health, XidEvent, judge_gpu_xids, judge_health, same_pci_device
from gpuhost.bench.models import ModelTable
from gpuhost.bench.node_model import NodeBaseline
from gpuhost.bench.outcome import Outcome
from gpuhost.bench.rules import CheckOutcome, Status, found
from gpuhost.bench.verdict import judge
from gpuhost.problems import Severity, Stage, register

BASELINE_MISSING_GPU = register(
    "smoke.baseline.missing-gpu",
    Stage.SMOKE_TEST,
    Severity.WARNING,
    "the node baseline holds no finished run of this GPU: its figures are not compared",
)


def _only_gpu(contention: Contention | None, gpu: int) -> Contention | None:
    """The processes of others on this GPU only: a busy neighbour does not make this GPU's figures
    unrepresentative."""
    if contention is None:
        return None
    return Contention(
        tuple(p for p in contention.processes if p.gpu == gpu), contention.utilization_before_pct, contention.readable
    )


def logged_xids(outcomes: Iterable[Outcome]) -> tuple[XidEvent, ...]:
    """Every kernel-log Xid logged during any GPU's run of --all."""
    return tuple(event for o in outcomes if o.health is not None for event in o.health.xid_events)


def attributed_health(outcome: Outcome, gpu: int, logged: tuple[XidEvent, ...]) -> Health | None:
    """This GPU's health with the kernel-log Xids that are its own: the kernel log is the guest's, so
    during GPU 0's run it also shows an Xid of GPU 2, which belongs to GPU 2's verdict, not GPU 0's.
    An Xid whose address names no GPU of the guest stays with the run it was logged in."""
    health = outcome.health
    if health is None:
        return None
    bus_ids = [g.pci_bus_id for g in outcome.environment.gpus]
    mine = next((g.pci_bus_id for g in outcome.environment.gpus if g.index == gpu), "")
    events = [e for e in logged if same_pci_device(e.address, mine)]
    events += [e for e in health.xid_events if not any(same_pci_device(e.address, b) for b in bus_ids)]
    return replace(health, xid_events=tuple(dict.fromkeys(events)))


def rejudged(
    outcome: Outcome,
    table: ModelTable,
    gpu: int,
    complete: bool,
    baseline: NodeBaseline | None = None,
    xids: tuple[GpuXid, ...] = (),
    logged: tuple[XidEvent, ...] | None = None,
    judged: Collection[int] | None = None,
) -> Outcome:
    """One GPU's run of --all judged as its own; with a node baseline, against that GPU's run in it
    (the one-GPU comparison, verdict.judge's); every Xid NVML reported on this GPU during --all, in
    whichever phase, is a row of its verdict, and so is every kernel-log Xid of it in `logged` (those of
    every GPU's run: attributed_health)."""
    contention = _only_gpu(outcome.contention, gpu)
    health = outcome.health if logged is None else attributed_health(outcome, gpu, logged)
    models = {g.index: table.lookup(g.pci_device_id) for g in outcome.environment.gpus}
    bus_ids = {g.index: g.pci_bus_id for g in outcome.environment.gpus}
    checks: list[CheckOutcome] = [
        *judge_environment(outcome.environment, outcome.samples, models, only=judged),
        *(judge_health(health) if health is not None else []),
        *judge_gpu_xids(tuple(x for x in xids if x.gpu == gpu), health, bus_ids.get(gpu, "")),
    ]
    theirs = None if baseline is None else baseline.gpus.get(gpu)
    if baseline is not None and theirs is None:
        checks.append(
            found(
                BASELINE_MISSING_GPU,
                Status.WARN,
                "baseline",
                f"the baseline {baseline.origin} holds no finished run of GPU {gpu}: not compared",
                gpu,
                "record the baseline again with every GPU finishing (smoke-test --all --json)",
            )
        )
    verdict = judge(
        outcome.run,
        model=models.get(gpu),
        checks=checks,
        complete=complete,
        contention=contention,
        baseline=theirs,
        in_node=True,
    )
    return replace(outcome, verdict=verdict, contention=contention, health=health, with_baseline=theirs is not None)
