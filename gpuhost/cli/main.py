"""Entry point: `gpuhost VERB ...`.

Each verb lives in its own module exposing `configure(parser)` and `run(args) -> int`.
Verb modules are imported only when their verb is used, so that the guest-side verbs
(smoke-test) run on a machine that has none of the controller's packages installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, Protocol, cast

from gpuhost import __version__
from gpuhost.cli.text import printable
from gpuhost.errors import EXIT_UNUSABLE, GpuhostError, shortened
from gpuhost.output import OutputLost, guarded_stdout
from gpuhost.transport import TransportError

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "audit": ("gpuhost.cli.audit", "read-only passthrough readiness audit of hosts"),
    "snapshot": ("gpuhost.cli.snapshot", "capture what the audit reads from a host into a directory"),
    "lab": ("gpuhost.cli.lab", "emulated GPU hosts under QEMU (TCG) with SSH on 127.0.0.1, for rehearsals and CI"),
    "plan": ("gpuhost.cli.plan", "what gpuhost apply would change on each host, and why; changes nothing"),
    "apply": ("gpuhost.cli.apply", "configure hosts for VFIO passthrough with the playbooks: rolling reboot, verified"),
    "rollback": ("gpuhost.cli.rollback", "undo gpuhost apply on a host (GRUB, initramfs, backed-up files), reboot"),
    "smoke-test": ("gpuhost.cli.smoke_test", "inside a guest: benchmark the GPU and judge it against its datasheet"),
    "render": ("gpuhost.cli.render", "libvirt domain XML of an inventory VM with its GPUs passed through, validated"),
    "guest": (
        "gpuhost.cli.guest",
        "define, boot and provision an inventory VM and run the smoke-test in it",
    ),
}


class VerbModule(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(verb: str) -> VerbModule:
    return cast(VerbModule, importlib.import_module(VERBS[verb][0]))


class _Parser(argparse.ArgumentParser):
    """argparse quotes a bad argument in its error (`unrecognized arguments: ...` raw): escaped."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_UNUSABLE, f"{printable(self.prog)}: error: {printable(message)}\n")


def build_parser(verb: str | None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuhost",
        description="Audit, configure and prove GPU passthrough hosts.",
    )
    parser.add_argument("--version", action="version", version=f"gpuhost {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, (_, summary) in VERBS.items():
        verb_parser = sub.add_parser(name, help=summary, description=summary)
        # Only the chosen verb's module is imported to add its options.
        if name == verb:
            _load(name).configure(verb_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:  # `2>&-`: print(file=None) would write the errors to stdout
        sys.stderr = Path(os.devnull).open("w")  # noqa: SIM115 - for the life of the process
    arguments = list(sys.argv[1:] if argv is None else argv)
    stdout = sys.stdout
    try:
        with guarded_stdout(stdout) as sys.stdout:
            status = _main(arguments)
    except OutputLost as error:
        _print_error(next((a for a in arguments if a in VERBS), None), error)
        return error.exit_code
    finally:
        sys.stdout = stdout
    return status


def _print_error(verb: str | None, error: BaseException) -> None:
    """The CLI's one error line on stderr; a stderr that cannot be written to loses it quietly."""
    with contextlib.suppress(OSError):
        print(f"gpuhost{f' {verb}' if verb else ''}: error: {printable(shortened(str(error)))}", file=sys.stderr)


def _main(arguments: list[str]) -> int:
    verb = next((a for a in arguments if not a.startswith("-")), None)
    parser = build_parser(verb if verb in VERBS else None)
    args = parser.parse_args(arguments)
    if args.verb is None:
        parser.print_help()
        return EXIT_UNUSABLE
    try:
        return _load(args.verb).run(args)
    except OutputLost:
        raise  # main's: the stream is dealt with there
    except GpuhostError as error:
        _print_error(args.verb, error)
        return error.exit_code
    except TransportError as error:  # a verb's one host could not be reached (guest logs, ...)
        _print_error(args.verb, error)
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        print(f"gpuhost {args.verb}: interrupted", file=sys.stderr)
        return 130


def entry_point() -> None:
    sys.exit(main())
