"""What one GPU's smoke-test comes to: its verdict with everything it was judged on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuhost.bench.contention import Contention
from gpuhost.bench.environment import Environment, RunSamples
from gpuhost.bench.health import Health
from gpuhost.bench.identity import GpuIdentity
from gpuhost.bench.jsonout import BuildInfo, Timings, build_document
from gpuhost.bench.results import SuiteRun
from gpuhost.bench.verdict import Verdict


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    run: SuiteRun
    suite_document: dict[str, Any]
    environment: Environment
    samples: tuple[RunSamples, ...]
    model_table: str
    timings: Timings
    build: BuildInfo
    with_baseline: bool
    contention: Contention | None = None  # None: a run recorded before contention was read
    health: Health | None = None  # likewise
    gpu: GpuIdentity | None = None  # the GPU measured; None in a replay of a run recorded without it

    def document(self) -> dict[str, Any]:
        """This run's --json document (gpuhost-smoke-test/1), as one GPU's run and each GPU of --all write it."""
        return build_document(
            verdict=self.verdict,
            suite_document=self.suite_document,
            environment=self.environment,
            samples=self.samples,
            model_table=self.model_table,
            timings=self.timings,
            build=self.build,
            contention=self.contention,
            health=self.health,
            gpu=self.gpu,
        )
