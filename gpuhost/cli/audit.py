"""`gpuhost audit`: read-only passthrough readiness audit of this machine, hosts or a fleet.

Exit status: 0 every host ready, 1 a host has error findings, 2 a host could not be audited
(unreachable, authentication, host key) or the input was bad.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from gpuhost.audit import AuditStatus, HostAudit, audit_fleet, audit_to_json
from gpuhost.checks import Role, Severity
from gpuhost.cli.common import add_target_options, positive_int, resolve_targets
from gpuhost.cli.text import make_console, untrusted
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, MissingDependencyError
from gpuhost.facts.pci import PciFunction
from gpuhost.metrics import audit_metrics, check_textfile_path, write_textfile
from gpuhost.output import check_outputs
from gpuhost.passthrough import functions_to_bind
from gpuhost.problems import listed
from gpuhost.targets import Target

if TYPE_CHECKING:
    from rich.console import Console

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}
STATUS_STYLE = {AuditStatus.READY: "bold green", AuditStatus.NOT_READY: "bold red"}


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser, snapshots=True)
    parser.add_argument("--json", action="store_true", help="one JSON object per host per line (JSON Lines)")
    parser.add_argument("-f", "--forks", type=positive_int, default=64, help="hosts audited in parallel (default 64)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show info findings too")
    parser.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write each host's readiness and findings as Prometheus metrics to FILE (*.prom, atomically, "
        "for node_exporter's textfile collector)",
    )


def run(args: argparse.Namespace) -> int:
    if args.prometheus is not None:
        check_textfile_path(args.prometheus)
    check_outputs([("--prometheus", args.prometheus)], [("-i", args.inventory)])
    targets = resolve_targets(args)
    if args.json:
        results = audit_fleet(targets, args.forks)
        # One write of every line, once every host is done: Ctrl-C leaves no line half-written.
        sys.stdout.write("".join(json.dumps(audit_to_json(result), sort_keys=False) + "\n" for result in results))
    else:
        console = _console()
        results = _audit_with_progress(targets, args.forks)
        for result in results:
            _print_host(console, result, verbose=args.verbose or len(results) == 1)
        if len(results) > 1:
            _print_fleet_summary(console, results)
    if args.prometheus is not None:
        write_textfile(args.prometheus, audit_metrics(results, time.time()))
    return exit_status(results)


def exit_status(results: list[HostAudit]) -> int:
    if any(result.error is not None for result in results):
        return EXIT_UNUSABLE
    if any(result.status is AuditStatus.NOT_READY for result in results):
        return EXIT_FINDINGS
    return EXIT_OK


def _console() -> Console:
    try:
        import rich  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError("rich", "controller", "The audit report") from error
    return make_console()


def _audit_with_progress(targets: list[Target], forks: int) -> list[HostAudit]:
    if len(targets) == 1:
        return audit_fleet(targets, forks)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("auditing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=make_console(stderr=True, fixed_width=False),
        transient=True,
    )
    with progress:
        task = progress.add_task("", total=len(targets))

        def done(result: HostAudit) -> None:
            progress.update(task, advance=1, description=untrusted(f"{result.target.name}: {result.status}"))

        return audit_fleet(targets, forks, on_done=done)


def headline(result: HostAudit) -> str:
    """One line that says what the host is and whether it is ready."""
    if result.error is not None:
        return "could not be audited"
    facts, selection = result.facts, result.selection
    assert facts is not None and selection is not None
    # A guest uses every GPU it was given; a host is about the GPUs it passes through.
    cards = selection.passthrough + selection.kept if result.role is Role.GUEST else selection.passthrough
    parts = ["passthrough guest" if result.role is Role.GUEST else "passthrough host"]
    if cards:
        gpu = cards[0].gpu
        drivers = sorted(
            {
                "unknown" if f.driver_unknown else f.driver or "no driver"
                for card in cards
                for f in functions_to_bind(facts, [card])
            }
        )
        parts.append(
            f"{len(cards)} GPU{'s' if len(cards) > 1 else ''} [{gpu.vendor_device}]"
            f" on {gpu.link.describe()}, driver {', '.join(drivers)}"
        )
    else:
        parts.append("no GPU to pass through")
    if result.role is not Role.GUEST and selection.kept:
        parts.append(f"{len(selection.kept)} kept by the host")
    parts.append(f"{len(facts.iommu.groups)} IOMMU groups" if facts.iommu.active else "no IOMMU")
    return ", ".join(parts)


def _print_host(console: Console, result: HostAudit, verbose: bool) -> None:
    from rich.table import Table

    name = untrusted(result.target.name)
    if result.error is not None:
        console.print(f"[bold red]{name}: NOT AUDITED[/] ({result.error_kind}) — {untrusted(result.error)}")
        return
    status = result.status
    errors, warnings = result.count(Severity.ERROR), result.count(Severity.WARNING)
    summary = untrusted(headline(result))
    console.print(
        f"[bold]{name}[/]: [{STATUS_STYLE[status]}]{status.replace('-', ' ').upper()}[/] — {summary} "
        f"({errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)})"
    )
    facts, selection = result.facts, result.selection
    assert facts is not None and selection is not None
    console.print(f"  boot: {untrusted(facts.firmware.describe())}", soft_wrap=True)
    cards = [(True, card) for card in selection.passthrough] + [(False, card) for card in selection.kept]
    if cards:
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for column in ("GPU", "ID", "passthrough", "IOMMU group", "functions", "driver", "link", "NUMA", "verdict"):
            table.add_column(column, no_wrap=True)
        with_errors = {f.subject for f in result.findings if f.severity == Severity.ERROR}
        crowded: dict[int, tuple[str, ...]] = {}  # groups too big for a cell: named once, below the table
        for selected, card in cards:
            gpu = card.gpu
            bound = functions_to_bind(facts, [card])
            not_ready = any(function.address in with_errors for function in bound)
            verdict = "[red]not ready[/]" if not_ready else "[green]ready[/]" if selected else "kept by host"
            functions = _functions_cell(card.functions, bound, gpu.iommu_group)
            if len(bound) - len(card.functions) > CELL_GROUP_LIMIT and gpu.iommu_group is not None:
                crowded[gpu.iommu_group] = tuple(function.address for function in bound)
            table.add_row(
                untrusted(gpu.address),
                untrusted(gpu.vendor_device),
                "yes" if selected else "no",
                "-" if gpu.iommu_group is None else str(gpu.iommu_group),
                untrusted(functions),
                untrusted(", ".join(sorted({"unknown" if f.driver_unknown else f.driver or "none" for f in bound}))),
                untrusted(gpu.link.describe()),
                "-" if gpu.numa_node is None or gpu.numa_node < 0 else str(gpu.numa_node),
                verdict,
            )
        console.print(table)
        for group, members in sorted(crowded.items()):
            console.print(
                f"  IOMMU group {group}: {len(members)} functions go to a guest together: "
                f"{untrusted(listed(members))} (--json lists them all)",
                soft_wrap=True,
            )
    shown = [f for f in result.findings if verbose or f.severity != Severity.INFO]
    for finding in shown:
        style = SEVERITY_STYLE[finding.severity]
        console.print(
            f"  [{style}]{finding.severity.value:7}[/] {finding.code}: {untrusted(finding.message)}", soft_wrap=True
        )
        if finding.remedy and finding.severity != Severity.INFO:
            console.print(f"          fix: {untrusted(finding.remedy)}", soft_wrap=True)
    hidden = len(result.findings) - len(shown)
    if hidden:
        console.print(f"  [dim]{hidden} info finding(s) hidden; -v shows them[/]")
    console.print()


# Group members beyond a card's own functions that a table cell still names; more are counted, and
# the group's members are named once below the table (a cell per GPU made 300 GPUs in one group
# print 300 x 600 addresses).
CELL_GROUP_LIMIT = 2


def _functions_cell(own: tuple[PciFunction, ...], bound: tuple[PciFunction, ...], group: int | None) -> str:
    """The functions vfio-pci must own for a card, by slot.function: the card's own, and the rest of its
    group while they are few."""
    own_addresses = {function.address for function in own}
    others = [function for function in bound if function.address not in own_addresses]
    if len(others) <= CELL_GROUP_LIMIT:
        return " ".join(function.address.rsplit(":", 1)[-1] for function in bound)
    mine = " ".join(function.address.rsplit(":", 1)[-1] for function in bound if function.address in own_addresses)
    return f"{mine} +{len(others)} in group {group}"


def _print_fleet_summary(console: Console, results: list[HostAudit]) -> None:
    from rich.table import Table

    table = Table(title="fleet", header_style="bold")
    for column in ("host", "status", "what", "errors", "warnings", "time"):
        table.add_column(column)
    for result in results:
        style = STATUS_STYLE.get(result.status, "bold red")
        table.add_row(
            untrusted(result.target.name),
            f"[{style}]{result.status}[/]",
            untrusted(headline(result)) if result.error is None else (result.error_kind or "error"),
            str(result.count(Severity.ERROR)),
            str(result.count(Severity.WARNING)),
            f"{result.seconds:.1f}s",
        )
    console.print(table)
    ready = sum(1 for r in results if r.status is AuditStatus.READY)
    console.print(f"{ready} of {len(results)} hosts ready")
