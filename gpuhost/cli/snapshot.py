"""`gpuhost snapshot`: capture what the audit reads from a host into a directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuhost.audit import open_transport, unexpected_error
from gpuhost.cli.common import add_target_options, resolve_targets
from gpuhost.cli.text import printable
from gpuhost.errors import EXIT_OK, EXIT_UNUSABLE, InputError, shortened
from gpuhost.facts.gather import capture
from gpuhost.facts.snapshot import GatherFormatError
from gpuhost.targets import SNAPSHOT
from gpuhost.transport import TransportError


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser, snapshots=False)
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory to create (for several hosts: one subdirectory per host inside it)",
    )


def run(args: argparse.Namespace) -> int:
    targets = resolve_targets(args)
    output: Path = args.output
    destinations = [output] if len(targets) == 1 else [output / target.name for target in targets]
    names = [target.name for target in targets]
    if len(targets) > 1 and len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise InputError(
            f"host {', '.join(twice)} is named twice; each host is captured once, into {output}/HOST. "
            "Name each host once."
        )
    for destination in destinations:
        if destination.exists():
            raise InputError(f"{destination} already exists; choose a new directory (snapshots are never merged).")
    # Under a file nothing can be written: said before any host is reached, not after its capture.
    existing = output.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(
            f"-o {output}: {existing} is not a directory, so nothing can be written under it. Choose another -o."
        )
    status = EXIT_OK
    for target, destination in zip(targets, destinations, strict=True):
        if target.kind == SNAPSHOT:
            raise InputError("gpuhost snapshot captures live hosts; a snapshot is already a snapshot.")
        try:
            transport = open_transport(target)
            try:
                capture(transport, destination, target.name)
            finally:
                transport.close()
        except (TransportError, GatherFormatError) as error:
            print(printable(shortened(f"gpuhost snapshot: {target.name}: {error}")), file=sys.stderr)
            status = EXIT_UNUSABLE
            continue
        except OSError as error:  # the output path: under a file, no permission, disk full
            reason = error.strerror or str(error)
            print(
                printable(f"gpuhost snapshot: {target.name}: cannot write {destination}: {reason}. Choose another -o."),
                file=sys.stderr,
            )
            status = EXIT_UNUSABLE
            continue
        except Exception as error:  # the fleet barrier, as in the audit: this host fails, the others go on
            print(printable(f"gpuhost snapshot: {unexpected_error(target.name, error)}"), file=sys.stderr)
            status = EXIT_UNUSABLE
            continue
        print(printable(f"{target.name}: snapshot written to {destination}"))
    return status
