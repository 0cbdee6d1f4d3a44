"""The audit engine: reach each target, gather, build facts, run the checks. Prints nothing."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhost import __version__
from gpuhost.checks import Role, run_checks
from gpuhost.checks.base import class_name
from gpuhost.errors import GpuhostError, InputError, shortened
from gpuhost.facts.build import build_facts
from gpuhost.facts.gather import gather_tree
from gpuhost.facts.model import GIB_KIB, HostFacts, TextEnum
from gpuhost.facts.pci import LONE_GPU_CLASSES, PciFunction
from gpuhost.facts.snapshot import GatherFormatError, open_snapshot
from gpuhost.passthrough import analyse_group, group_members
from gpuhost.problems import Problem, Severity
from gpuhost.selection import GpuSelection, GpuSelector
from gpuhost.targets import LOCAL, SNAPSHOT, Target
from gpuhost.transport import Transport, TransportError
from gpuhost.transport.local import LocalTransport

JSON_SCHEMA = "gpuhost.audit/1"


class AuditStatus(TextEnum):
    """A host's verdict (the JSON's `status`)."""

    READY = "ready"
    NOT_READY = "not-ready"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class HostAudit:
    target: Target
    facts: HostFacts | None
    role: Role | None
    selection: GpuSelection | None
    findings: tuple[Problem, ...]
    error: str | None  # why the host could not be audited
    error_kind: str | None  # unreachable, auth, host-key-unknown, host-key-changed, timeout, command, input, internal
    round_trips: int
    seconds: float

    @property
    def status(self) -> AuditStatus:
        if self.error is not None:
            return AuditStatus.UNREACHABLE
        return AuditStatus.NOT_READY if self.count(Severity.ERROR) else AuditStatus.READY

    def count(self, severity: Severity) -> int:
        return sum(1 for finding in self.findings if finding.severity == severity)


def open_transport(target: Target) -> Transport:
    if target.kind == LOCAL:
        return LocalTransport()
    assert target.ssh is not None
    from gpuhost.transport.ssh import SshTransport  # paramiko only when SSH is used

    return SshTransport(target.ssh)


def audit_target(target: Target, transport: Transport | None = None) -> HostAudit:
    """Gather, build facts and run the checks of one host; never raises (its error is the result's).

    `transport`: a connection to the host that someone else opened (the Ansible collection's audit
    action hands over the play's own connection); without it the target's is opened and closed here.
    """
    started = time.monotonic()
    round_trips = 0
    try:
        if target.kind == SNAPSHOT:
            assert target.snapshot is not None
            facts = build_facts(open_snapshot(target.snapshot))
        else:
            connection = transport if transport is not None else open_transport(target)
            try:
                facts = build_facts(gather_tree(connection))
            finally:
                round_trips = connection.round_trips
                if transport is None:
                    connection.close()
    except TransportError as error:
        return _failed(target, str(error), error.kind, round_trips, started)
    except GatherFormatError as error:
        return _failed(target, f"{target.name}: {error}", "command", round_trips, started)
    except GpuhostError as error:
        return _failed(target, str(error), "input", round_trips, started)
    except Exception as error:  # the fleet barrier: one host's surprise is that host's error
        return _failed(target, unexpected_error(target.name, error), "internal", round_trips, started)
    try:
        require_gpus_named(target.name, facts, target.policy.gpus)
    except GpuhostError as error:
        return _failed(target, str(error), "input", round_trips, started)
    try:
        role, selection, findings = run_checks(target.name, facts, target.policy)
    except Exception as error:  # as above: odd facts fail this host closed, never the run
        return _failed(target, unexpected_error(target.name, error), "internal", round_trips, started)
    return HostAudit(
        target=target,
        facts=facts,
        role=role,
        selection=selection,
        findings=tuple(findings),
        error=None,
        error_kind=None,
        round_trips=round_trips,
        seconds=time.monotonic() - started,
    )


def require_gpus_named(host: str, facts: HostFacts, gpus: GpuSelector) -> None:
    """The GPU selection (--gpus, gpuhost_gpus) names GPUs only: an address or vendor:device ID of the
    host's that is another function (a NIC among GPU IDs, a card's audio function) is an input error
    naming it, not a silent extra (or missing) passthrough. An ID the host does not have stays the
    plan's and audit's to report (another host of the fleet may have it)."""
    wrong = []
    for function in facts.pci:
        named = function.address in gpus.addresses or function.vendor_device in gpus.vendor_devices
        if named and not (function.is_gpu or function.base_class in LONE_GPU_CLASSES or function.is_nvswitch):
            how = function.address if function.address in gpus.addresses else function.vendor_device
            wrong.append(f"{how} is {function.describe()} ({class_name(function.base_class)}), not a GPU")
    if wrong:
        raise InputError(
            f"{host}: the GPU selection (--gpus, gpuhost_gpus) names functions that are not GPUs: "
            f"{'; '.join(dict.fromkeys(wrong))}. Name GPUs only (their audio and USB functions go with them)."
        )


def unexpected_error(host: str, error: BaseException) -> str:
    """The message of a per-host failure that no layer anticipated: it names the host and what broke,
    so the run goes on and the operator can report it (the host is not audited, never ready)."""
    detail = str(error)[:300] or "no detail"
    return f"{host}: unexpected {type(error).__name__} ({detail}); the host was not audited. Please report this."


def not_audited(target: Target, message: str, kind: str) -> HostAudit:
    """A host refused before anything connected (its inventory variables), as audit_target reports
    a host it could not audit; `kind` is one of HostAudit.error_kind's."""
    return _failed(target, message, kind, 0, time.monotonic())


def _failed(target: Target, message: str, kind: str, round_trips: int, started: float) -> HostAudit:
    # The one place a host's error is made: bounded here, it is bounded in JSON, text, plan and render.
    error = shortened(message)
    return HostAudit(target, None, None, None, (), error, kind, round_trips, time.monotonic() - started)


def audit_fleet(
    targets: Sequence[Target], forks: int, on_done: Callable[[HostAudit], None] | None = None
) -> list[HostAudit]:
    """Audit every target in parallel; one failing host never stops the others. Input order kept.

    Ctrl-C (KeyboardInterrupt in the calling thread) propagates at once: hosts not started are never
    started, and hosts in progress are not waited for. The workers are daemon threads for that
    reason: ThreadPoolExecutor joins its threads on shutdown and again at interpreter exit, so an
    interrupt would wait for every connection in progress (up to its connect and command timeouts).
    """
    pending: queue.SimpleQueue[tuple[int, Target]] = queue.SimpleQueue()
    for index, target in enumerate(targets):
        pending.put((index, target))
    finished: queue.SimpleQueue[tuple[int, HostAudit]] = queue.SimpleQueue()
    interrupted = threading.Event()

    def work() -> None:
        while not interrupted.is_set():
            try:
                index, target = pending.get_nowait()
            except queue.Empty:
                return
            finished.put((index, audit_target(target)))  # audit_target is the per-host barrier: it never raises

    results: list[HostAudit | None] = [None] * len(targets)
    try:
        for number in range(max(1, min(forks, len(targets)))):
            threading.Thread(target=work, name=f"gpuhost-audit-{number}", daemon=True).start()
        for _ in targets:
            index, result = _next_finished(finished)
            results[index] = result
            if on_done is not None:
                on_done(result)
    except BaseException:
        interrupted.set()  # workers take no further host; the ones in progress die with the process
        raise
    return [result for result in results if result is not None]


# How often the waiting main thread wakes to run Python's signal handlers (see _next_finished).
SIGNAL_POLL_SECONDS = 0.2


def _next_finished(finished: queue.SimpleQueue[tuple[int, HostAudit]]) -> tuple[int, HostAudit]:
    """The next finished host, waking every SIGNAL_POLL_SECONDS. Linux gives a process's SIGINT to any
    thread that does not block it: when a worker (or paramiko's transport thread) gets it, a main
    thread blocked in an untimed get() never sees EINTR and Ctrl-C waits for the next host to finish
    (up to its connect timeout). Seen in CI: audit ignored Ctrl-C for 30 s. A timed wait returns to
    the interpreter, which then runs the handler and raises KeyboardInterrupt here."""
    while True:
        try:
            return finished.get(timeout=SIGNAL_POLL_SECONDS)
        except queue.Empty:
            continue


def audit_to_json(audit: HostAudit) -> dict[str, Any]:
    """The documented, stable JSON object of one host (schema gpuhost.audit/1, see docs/audit.md)."""
    facts = audit.facts
    data: dict[str, Any] = {
        "schema": JSON_SCHEMA,
        "gpuhost_version": __version__,
        "host": audit.target.name,
        "source": audit.target.kind,
        "status": audit.status.value,
        "reachable": audit.error is None,
        "ready": audit.status is AuditStatus.READY,
        "error": audit.error,
        "error_kind": audit.error_kind,
        "role": audit.role.value if audit.role is not None else None,
        "round_trips": audit.round_trips,
        "seconds": round(audit.seconds, 3),
        "counts": {severity.value: audit.count(severity) for severity in Severity},
        "system": None,
        "gpus": [],
        "findings": [finding.as_dict() for finding in audit.findings],
    }
    if facts is None or audit.selection is None:
        return data
    data["system"] = {
        "hostname": facts.hostname,
        "os": facts.os_pretty_name,
        "kernel": facts.kernel_release,
        "cpu_vendor": facts.cpu.vendor if facts.cpu else None,
        "memory_kib": facts.memory.total_kib if facts.memory else None,
        "iommu_active": facts.iommu.active,
        "iommu_groups": len(facts.iommu.groups),
        "cmdline": str(facts.cmdline) if facts.cmdline else None,
        "bootloader": facts.bootloader.kind.value,
        "firmware": {
            "mode": None if facts.firmware.mode is None else facts.firmware.mode.value,
            "secure_boot": facts.firmware.secure_boot,
            "loader": facts.firmware.loader.value,
            "loader_info": facts.firmware.loader_info,
            "esp": facts.firmware.esp,
            "cmdline_source": facts.firmware.cmdline_source,
            "proxmox_boot_tool": facts.firmware.proxmox_boot_tool,
        },
        "hugepages_1g": (pool.total if (pool := facts.hugepage_pool(GIB_KIB)) else None),
        "numa_nodes": [
            {
                "node": node.node_id,
                "cpus": node.cpulist,
                "memory_kib": node.mem_total_kib,
                "hugepages_1g": (pool.total if (pool := node.pool(GIB_KIB)) else None),
            }
            for node in facts.numa_nodes
        ],
        # What can reset the host when a boot hangs (null: not gathered; an older snapshot).
        "rescue": facts.rescue.to_json() if facts.rescue is not None else None,
    }
    selected = {card.gpu.address for card in audit.selection.passthrough}
    for passthrough, cards in ((True, audit.selection.passthrough), (False, audit.selection.kept)):
        for card in cards:
            gpu = card.gpu
            # The card's own functions; what else shares its group and is no GPU's is listed apart
            # (issue 27.4: a SATA controller once showed as the card's function).
            isolation = analyse_group(facts, card, selected)
            data["gpus"].append(
                {
                    "address": gpu.address,
                    "vendor_device": gpu.vendor_device,
                    "class": f"0x{gpu.class_code:06x}" if gpu.class_code is not None else None,
                    "selected": passthrough,
                    "driver": gpu.driver,
                    "iommu_group": gpu.iommu_group,
                    "group_members": [member.address for member in group_members(facts, gpu)],
                    "functions": [_function_json(f) for f in card.functions],
                    "intruders": [_function_json(f) for f in isolation.intruders],
                    "link": {
                        "current_gen": gpu.link.current_generation,
                        "current_width": gpu.link.current_width,
                        "max_gen": gpu.link.max_generation,
                        "max_width": gpu.link.max_width,
                    },
                    "numa_node": gpu.numa_node,
                    "reset_methods": list(gpu.reset_methods) if gpu.reset_methods is not None else None,
                    "boot_vga": gpu.boot_vga,
                }
            )
    return data


def _function_json(function: PciFunction) -> dict[str, Any]:
    return {
        "address": function.address,
        "vendor_device": function.vendor_device,
        "driver": function.driver,
        # Memory BARs only: their sizes are what the guest's address space must hold.
        "bars": [
            {"index": bar.index, "size": bar.size, "is_64bit": bar.is_64bit, "prefetchable": bar.is_prefetchable}
            for bar in function.bars
            if bar.is_memory and bar.size
        ],
    }
