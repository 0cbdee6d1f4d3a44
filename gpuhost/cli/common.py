"""Options, target resolution and rollout output shared by the verbs that reach hosts (audit, apply, ...)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost.cli.text import make_console, printable, untrusted
from gpuhost.errors import InputError, NoHostsSelected
from gpuhost.inventory.policy import Role
from gpuhost.rollout.report import TaskProgress, TaskResult
from gpuhost.targets import (
    SNAPSHOT,
    ConnectionDefaults,
    Target,
    adhoc_target,
    inventory_targets,
    local_target,
    snapshot_target,
    validate_connect_timeout,
    validate_known_hosts,
)

if TYPE_CHECKING:
    from rich.console import Console

    from gpuhost.inventory.spec import HostPolicy, VmSpec


RESULT_STYLE = {
    TaskResult.FAILED: "[red]failed[/]",
    TaskResult.UNREACHABLE: "[red]unreachable[/]",
    TaskResult.CHANGED: "[yellow]changed[/]",
    TaskResult.OK: "ok",
}


def positive_int(text: str) -> int:
    """An argparse type for counts such as --forks: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def add_target_options(parser: argparse.ArgumentParser, *, snapshots: bool) -> None:
    parser.add_argument(
        "hosts", nargs="*", metavar="HOST", help="ad-hoc hosts as [user@]host[:port]; none: this machine"
    )
    parser.add_argument("-i", "--inventory", type=Path, help="an Ansible inventory (YAML or INI)")
    parser.add_argument("-l", "--limit", help="Ansible host pattern to limit the inventory to")
    if snapshots:
        parser.add_argument(
            "--from-snapshot",
            type=Path,
            action="append",
            default=[],
            metavar="DIR",
            help="audit a snapshot directory instead of a live host (repeatable)",
        )
    parser.add_argument("-u", "--user", help="SSH user for hosts that do not set ansible_user (default root)")
    parser.add_argument("--private-key", type=Path, metavar="FILE", help="SSH private key file")
    parser.add_argument(
        "--known-hosts", type=Path, metavar="FILE", help="known_hosts file (default ~/.ssh/known_hosts)"
    )
    parser.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust and record host keys seen for the first time (like OpenSSH accept-new); changed keys still abort",
    )
    parser.add_argument("--connect-timeout", type=float, default=15.0, metavar="S", help="SSH connect timeout")
    parser.add_argument(
        "--gpus",
        metavar="SPEC",
        help="GPUs to pass through: 'all' NVIDIA GPUs (default), or comma-separated addresses / vendor:device IDs",
    )
    parser.add_argument(
        "--role",
        choices=[role.value for role in Role],
        default=Role.AUTO.value,
        help="judge as a passthrough host or as a guest (auto: a VM with no IOMMU whose GPU runs nvidia is a guest)",
    )


def resolve_targets(args: argparse.Namespace) -> list[Target]:
    """Every target named on the command line, validated before anything connects."""
    key = args.private_key
    if key is not None and not key.expanduser().is_file():
        what = "is a directory" if key.expanduser().is_dir() else "no such file"
        raise InputError(f"--private-key {key}: {what}. Name an OpenSSH private key file.")
    defaults = ConnectionDefaults(
        user=args.user,
        key_file=key.expanduser() if key else None,
        known_hosts_file=(
            validate_known_hosts(args.known_hosts, "--known-hosts", "--known-hosts") if args.known_hosts else None
        ),
        accept_new_host_keys=args.accept_new_host_keys,
        connect_timeout=validate_connect_timeout(args.connect_timeout),
        gpus=args.gpus,
        role=Role(args.role),
    )
    targets: list[Target] = []
    if args.inventory is not None:
        targets.extend(inventory_targets(args.inventory, args.limit, defaults))
    elif args.limit is not None:  # an empty --limit too: it must never mean "this machine"
        raise InputError("--limit needs an inventory (-i FILE).")
    targets.extend(adhoc_target(spec, defaults) for spec in args.hosts)
    targets.extend(snapshot_target(directory, defaults) for directory in getattr(args, "from_snapshot", []))
    if not targets:
        targets.append(local_target(defaults))
    return targets


def resolve_vm(args: argparse.Namespace, verb: str) -> tuple[Target, VmSpec, HostPolicy]:
    """The inventory host of --host, its VM --vm from gpuhost_vms, and its render policy (render, guest)."""
    from gpuhost.inventory.spec import validate_name

    if args.inventory is None:
        raise InputError(f"gpuhost {verb} needs the inventory that describes the VM: -i inventory.yml.")
    if args.hosts:
        raise InputError(f"gpuhost {verb} takes the host as --host NAME (an inventory host), not as an argument.")
    host = validate_name(args.host, "--host")
    vm_name = validate_name(args.vm, "--vm")
    if args.limit is not None:  # --host is the selection: a --limit beside it was silently replaced
        raise InputError(f"gpuhost {verb} selects its host with --host {host}; drop --limit {args.limit}.")
    args.limit = host
    try:
        matches = [target for target in resolve_targets(args) if target.name == host]
    except NoHostsSelected:
        matches = []
    if len(matches) != 1 or matches[0].kind == SNAPSHOT:
        raise NoHostsSelected(args.inventory, host, f"no host {host!r}.")
    target = matches[0]
    config = target.require_config()
    return target, config.vm(vm_name, f"inventory host {host}"), config.render


def check_ansible_environment() -> None:
    """apply's and rollback's first step: refuse a shell variable that would weaken host key checking
    (InputError), and say in one line each which ANSIBLE_* variables of the shell gpuhost overrides."""
    import sys

    from gpuhost.rollout.environment import rollout_environment

    for note in rollout_environment().notes:
        print(printable(note), file=sys.stderr)


def run_command(verb: str, args: argparse.Namespace) -> str:
    """The run as the hosts' locks name it (gpuhost.hostlock): the verb, its inventory and limit."""
    import shlex

    return shlex.join(["gpuhost", verb, "-i", str(args.inventory), *(["--limit", args.limit] if args.limit else [])])


def rollout_console() -> Console:
    return make_console(soft_wrap=True)


def ansible_printer() -> Callable[[str], None]:
    """-v: Ansible's own output, each event's text as it comes, escaped (it quotes inventory and host bytes)."""

    def echo(text: str) -> None:
        # ansible-runner reads Ansible through a pty, which ends lines with CR LF.
        print(printable(text.replace("\r\n", "\n")), flush=True)

    return echo


def progress_printer(console: Console, *, verbose: bool, timed: bool) -> Callable[[TaskProgress], None]:
    """One line per progress event (nothing with -v: Ansible's own output is on screen)."""

    def show(line: TaskProgress) -> None:
        if verbose:
            return
        if not timed:  # rollback's lines: host, result, task
            console.print(f"[bold]{untrusted(line.host)}[/]  {RESULT_STYLE[line.result]}  {untrusted(line.task)}")
            return
        detail = untrusted(f": {line.detail}" if line.detail else "")
        host, task = untrusted(line.host), untrusted(line.task)
        console.print(f"{line.seconds:6.0f}s  [bold]{host}[/]  {RESULT_STYLE[line.result]}  {task}{detail}")
        for diff_line in line.diff:
            console.print(f"        {printable(diff_line)}", markup=False)

    return show
