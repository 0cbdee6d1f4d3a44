"""What `smoke-test --all` records and concludes about a node: typed, frozen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuhost.bench.contention import GpuProcess
from gpuhost.bench.rules import Status, worst
from gpuhost.bench.runner import Outcome
from gpuhost.bench.verdict import NOT_REPRESENTATIVE
from gpuhost.problems import Problem


# ---------------------------------------------------------------------------------- facts
@dataclass(frozen=True)
class NvlinkReading:
    gpu: int
    active: int | None  # None: NVML could not say
    queried: int  # links NVML answered for


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
class NodeVerdict:
    status: Status
    representative: bool
    figures: tuple[NodeFigure, ...]
    findings: tuple[NodeFinding, ...]
    reasons: tuple[str, ...]

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


@dataclass(frozen=True)
class GpuStopped:
    """A GPU whose one-GPU run stopped (no usable GPU, a crashed or hung suite): a FAIL of that GPU
    with the reason; the other GPUs and the node are still measured."""

    gpu: int
    reason: str


@dataclass(frozen=True)
class NodeOutcome:
    gpus: tuple[Outcome, ...]
    record: NodeRecord
    verdict: NodeVerdict
    seconds: float
    stopped: tuple[GpuStopped, ...] = ()

    @property
    def status(self) -> Status:
        return worst(
            [self.verdict.status, *(o.verdict.status for o in self.gpus), *(Status.FAIL for _ in self.stopped)]
        )

    @property
    def representative(self) -> bool:
        return self.verdict.representative and all(o.verdict.representative for o in self.gpus)

    @property
    def outcome(self) -> str:
        return self.status.value if self.representative else NOT_REPRESENTATIVE
