"""Which host slot each guest GPU came from: the rendered domain's GPUs matched with the smoke-test's.

The domain passes each GPU from a host address to a guest address (render: DomainPlan.guest_address,
also written in the domain's <metadata>). Inside, the smoke-test's report names the GPUs NVML listed
by their guest PCI addresses, each with its verdict. Matching the two by guest address says, for the
VM as a whole, which host slot each verdict is about, and which host slots the guest never showed:
a GPU that did not come up in the guest is named by the host slot the operator knows it by.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuhost.bench.identity import pci_address
from gpuhost.render.domain import DomainPlan


@dataclass(frozen=True)
class PassedGpu:
    """A GPU the domain passes: where the host has it, where the guest should see it."""

    host_address: str
    guest_address: str


@dataclass(frozen=True)
class GuestGpu:
    """A passed GPU and what the guest's smoke-test said of it (None: the report does not say)."""

    host_address: str
    guest_address: str
    seen: bool  # NVML in the guest listed a GPU at guest_address
    index: int | None  # NVML's index in the guest
    uuid: str | None
    verdict: str | None  # its verdict: PASS, WARN, FAIL, NOT REPRESENTATIVE; None where none was judged

    def describe(self) -> str:
        return f"host slot {self.host_address} (guest {self.guest_address})"


def passed_gpus(plan: DomainPlan) -> tuple[PassedGpu, ...]:
    """Every GPU function the domain passes, with its host and guest address."""
    return tuple(
        PassedGpu(function.host.address, plan.guest_address(port, function))
        for port in plan.gpu_ports
        for function in port.functions
        if function.host.is_gpu
    )


@dataclass(frozen=True)
class _Seen:
    index: int
    uuid: str | None


def _listed(document: dict[str, Any]) -> dict[str, _Seen] | None:
    """The GPUs the guest's NVML listed, by PCI address, from any environment in a smoke-test report."""
    environments: list[Any] = [document.get("environment")]
    environments += [g.get("environment") for g in document.get("gpus") or [] if isinstance(g, dict)]
    for environment in environments:
        if isinstance(environment, dict) and isinstance(environment.get("gpus"), list):
            return {
                pci_address(str(g.get("pci_bus_id", ""))): _Seen(int(g.get("index", -1)), g.get("uuid") or None)
                for g in environment["gpus"]
                if isinstance(g, dict)
            }
    return None


def _verdicts(document: dict[str, Any]) -> dict[int, str]:
    """Each judged GPU's verdict by its NVML index in the guest: --all's list, or a one-GPU run's."""
    if isinstance(document.get("verdicts"), list):
        return {
            int(v["gpu"]): str(v.get("outcome") or v.get("status"))
            for v in document["verdicts"]
            if isinstance(v, dict) and isinstance(v.get("gpu"), int)
        }
    gpu = document.get("gpu")
    suite = document.get("suite")
    index = gpu.get("index") if isinstance(gpu, dict) else None
    if index is None and isinstance(suite, dict) and isinstance(suite.get("device"), dict):
        index = suite["device"].get("index")
    outcome = document.get("outcome")
    return {int(index): str(outcome)} if isinstance(index, int) and outcome else {}


def match_report(passed: Iterable[PassedGpu], report: bytes | None) -> tuple[GuestGpu, ...] | None:
    """Each passed GPU with what the guest's smoke-test report (its --json) says of it; None when the
    report names no GPU listing (the smoke-test could not start: whether the GPUs came up is unknown)."""
    try:
        document = json.loads(report) if report is not None else None
    except ValueError:
        document = None
    listed = _listed(document) if isinstance(document, dict) else None
    if listed is None or not isinstance(document, dict):
        return None
    verdicts = _verdicts(document)
    rows = []
    for gpu in passed:
        seen = listed.get(gpu.guest_address)
        rows.append(
            GuestGpu(
                gpu.host_address,
                gpu.guest_address,
                seen is not None,
                None if seen is None else seen.index,
                None if seen is None else seen.uuid,
                None if seen is None else verdicts.get(seen.index),
            )
        )
    return tuple(rows)
