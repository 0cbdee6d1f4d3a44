"""What `smoke-test --all` records and concludes about a node: typed, frozen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuhost.bench.contention import GpuProcess
from gpuhost.bench.environment import NvlinkReading
from gpuhost.bench.health import GpuXid
from gpuhost.bench.identity import GpuIdentity, pci_address
from gpuhost.bench.outcome import Outcome
from gpuhost.bench.results import SuiteRun
from gpuhost.bench.rules import Status, worst
from gpuhost.bench.verdict import NOT_REPRESENTATIVE
from gpuhost.problems import Problem


# ---------------------------------------------------------------------------------- facts
@dataclass(frozen=True)
class NodeFinding:
    """One row of the node table: a check that passed (problem None) or what it found."""

    check: str
    detail: str
    status: Status
    problem: Problem | None = None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeFigure:
    metric: str
    label: str
    value: float | None
    unit: str
    reference: float | None
    reference_kind: str | None
    percent_of_reference: float | None
    status: Status
    reason: str
    gpus: tuple[int, ...]
    extra: dict[str, Any]


@dataclass(frozen=True)
class BaselineComparison:
    """One node figure against the same figure of a baseline node run (--all --baseline): a P2P
    pair, both at once, all to all, a host aggregate, or a collective's bus bandwidth at one size."""

    metric: str  # the node figure's metric (NodeFigure.metric)
    label: str
    size_bytes: int | None  # a collective's size; None for the figures measured at one size
    value: float | None
    baseline: float | None
    percent_of_baseline: float | None
    status: Status
    reason: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class NodeVerdict:
    status: Status
    representative: bool
    figures: tuple[NodeFigure, ...]
    findings: tuple[NodeFinding, ...]
    reasons: tuple[str, ...]
    baseline: tuple[BaselineComparison, ...] = ()  # empty: judged without a baseline

    @property
    def outcome(self) -> str:
        return self.status.value if self.representative else NOT_REPRESENTATIVE

    @property
    def problems(self) -> tuple[Problem, ...]:
        return tuple(f.problem for f in self.findings if f.problem is not None)


@dataclass(frozen=True)
class NodeRecord:
    """What the node measurements produced, as recorded: enough to judge them again with no GPU."""

    gpu_count: int
    pci_device_ids: tuple[int, ...]
    suite: dict[str, Any] | None  # the p2p_matrix/host_all suite document; None when it did not run
    suite_error: str | None
    nccl: dict[str, Any] | None  # the nccl suite document
    nccl_library: str | None
    nccl_error: str | None
    nccl_topology: str | None  # NCCL_TOPO_DUMP_FILE: the topology NCCL detected
    nvlinks: tuple[NvlinkReading, ...]
    contention: tuple[GpuProcess, ...]
    seconds: float
    # NVML's Xid events over the whole --all run (health.XidWatch), each on its GPU and phase.
    xids: tuple[GpuXid, ...] = ()
    xids_watched: bool | None = None  # None: recorded before the watch; False: see xid_unwatched
    xid_unwatched: str | None = None
    # The GPUs measured, in NVML's order (CUDA_VISIBLE_DEVICES may leave some out); () in a run
    # recorded before identities were kept, which measured every GPU: 0 .. gpu_count - 1.
    gpus: tuple[GpuIdentity, ...] = ()

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus) if self.gpus else tuple(range(self.gpu_count))


@dataclass(frozen=True)
class GpuStopped:
    """A GPU whose one-GPU run stopped (no usable GPU, a crashed or hung suite): a FAIL of that GPU
    with the reason; the other GPUs and the node are still measured."""

    gpu: int
    reason: str


@dataclass(frozen=True)
class NodeBaseline:
    """An earlier `--all --json` run of a node of the same GPUs (e.g. on bare metal): each GPU's
    suite run, by index, and the node's record; `origin` is the file it came from."""

    origin: str
    gpus: dict[int, SuiteRun]
    record: NodeRecord


@dataclass(frozen=True)
class NodeOutcome:
    gpus: tuple[Outcome, ...]
    record: NodeRecord
    verdict: NodeVerdict
    seconds: float
    stopped: tuple[GpuStopped, ...] = ()
    baseline: str | None = None  # the --baseline file the node was compared with
    left_out: str | None = None  # the GPUs CUDA_VISIBLE_DEVICES left out, and why (identity.Visibility)

    @property
    def status(self) -> Status:
        return worst(
            [self.verdict.status, *(o.verdict.status for o in self.gpus), *(Status.FAIL for _ in self.stopped)]
        )

    @property
    def representative(self) -> bool:
        return self.verdict.representative and all(o.verdict.representative for o in self.gpus)

    @property
    def identities(self) -> dict[int, GpuIdentity]:
        """Each judged GPU's identity by NVML index: the record's, else (a run recorded before
        identities were kept) the PCI address each GPU's own run reported, and for a GPU whose run
        stopped, NVML's listing."""
        known = {g.index: g for g in self.record.gpus}
        for o in self.gpus:
            index = o.run.device.index
            if index not in known:
                uuid = next((g.uuid for g in o.environment.gpus if g.index == index), "")
                known[index] = GpuIdentity(index, uuid, pci_address(o.run.device.pci_bus_id))
        for o in self.gpus:
            for g in o.environment.gpus:
                known.setdefault(g.index, GpuIdentity(g.index, g.uuid, pci_address(g.pci_bus_id)))
        return known

    def describe_gpu(self, gpu: int) -> str:
        """'GPU 2 (0000:00:08.0)': NVML's index and the PCI address, as every line of the node report names a GPU."""
        identity = self.identities.get(gpu)
        return f"GPU {gpu}" if identity is None else identity.describe()

    @property
    def outcome(self) -> str:
        return self.status.value if self.representative else NOT_REPRESENTATIVE
