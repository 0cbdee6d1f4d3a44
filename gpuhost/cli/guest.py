"""`gpuhost guest`: define, boot and provision an inventory VM, run the smoke-test in it, report.

    gpuhost guest up     -i inventory.yml --host gpu01 --vm train-1 [--skip-cuda]
    gpuhost guest status -i inventory.yml --host gpu01 --vm train-1
    gpuhost guest logs   -i inventory.yml --host gpu01 --vm train-1 [--serial | --provision]
    gpuhost guest down   -i inventory.yml --host gpu01 --vm train-1

libvirt is reached at qemu:///system for a host with ansible_connection: local, else at
qemu+ssh://USER@HOST:PORT/system (host keys verified), or at --libvirt-uri. Exit status of `up`:
the smoke-test's (0 PASS/WARN, 1 FAIL, 2 cannot run: no GPU or driver); 2 as well when a
lifecycle step fails, with the step named. Other actions: 0 done, 2 error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuhost.cli.common import add_target_options, resolve_vm
from gpuhost.cli.text import printable
from gpuhost.errors import EXIT_OK, EXIT_UNUSABLE, InputError
from gpuhost.guest.state import GuestDir, default_state_root
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.targets import Target

ACTIONS = {
    "up": "define, boot, provision the VM and run the smoke-test in it",
    "status": "the domain's state, address and last report",
    "logs": "the serial console log (on the host) and the provisioning log (here)",
    "down": "destroy and undefine the domain, delete its disk and seed; nothing else",
}


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, summary in ACTIONS.items():
        sub = actions.add_parser(name, help=summary, description=summary)
        add_target_options(sub, snapshots=False)
        sub.add_argument("--host", required=True, metavar="NAME", help="the inventory host the VM runs on")
        sub.add_argument("--vm", required=True, metavar="NAME", help="the VM's name in that host's gpuhost_vms")
        sub.add_argument(
            "--libvirt-uri", metavar="URI", help="libvirt URI instead of the one derived from the inventory"
        )
        sub.add_argument(
            "--state-dir",
            type=Path,
            metavar="DIR",
            help="where guest keys, logs and reports are kept (default ~/.local/state/gpuhost/guests)",
        )
        if name == "up":
            sub.add_argument(
                "--skip-cuda",
                action="store_true",
                help="do not install the NVIDIA driver and CUDA toolkit (a base image that has them, or a test guest)",
            )
            sub.add_argument(
                "--wheel-dir",
                type=Path,
                metavar="DIR",
                help="install gpuhost and nvidia-ml-py from the wheels in DIR (default: build and fetch them)",
            )
            sub.add_argument("--quick", action="store_true", help="run `gpuhost smoke-test --quick` in the guest")
            sub.add_argument(
                "--break-lock",
                action="store_true",
                help="remove the lock another run left on the host (it died: gpuhost names it and says when it is "
                "stale) and hold the host for this guest",
            )
            sub.add_argument(
                "--cuda-repo",
                default=None,
                metavar="URL",
                help="base URL of NVIDIA's CUDA apt repositories (a mirror of the default, NVIDIA's own)",
            )
        if name == "logs":
            which = sub.add_mutually_exclusive_group()
            which.add_argument("--serial", action="store_true", help="only the serial console log")
            which.add_argument("--provision", action="store_true", help="only the provisioning log")


def run(args: argparse.Namespace) -> int:
    from gpuhost.guest import lifecycle

    target, spec, policy = _resolve(args)
    state = GuestDir.of(args.state_dir or default_state_root(), target.name, spec.name)
    if args.action == "up":
        return _up(args, target, spec, policy, state)
    if args.action == "status":
        current = lifecycle.status(target, spec.name, state, args.libvirt_uri)
        print(f"{current.vm} on {current.host} ({current.uri}): {current.state}")
        print(f"  address: {', '.join(current.addresses) or '-'}")
        print(
            f"  last report: {current.last_report or '-'}"
            + (f" ({current.last_verdict})" if current.last_verdict else "")
        )
        return EXIT_OK
    if args.action == "logs":
        if not args.provision:
            print(f"== serial console of {spec.name} (on {target.name})")
            print(printable(lifecycle.serial_log(target, spec, policy)), end="")
        if not args.serial:
            print(f"== provisioning log ({state.provision_log})")
            try:
                print(printable(state.provision_log.read_text(errors="replace")), end="")
            except OSError:
                print("(none yet)")
        return EXIT_OK
    result = lifecycle.down(target, spec, policy, state, args.libvirt_uri)
    if not (result.undefined or result.removed_volumes):
        print(f"{spec.name} on {target.name}: nothing to remove (no such domain, disk or seed)")
        return EXIT_OK
    print(
        f"{spec.name} on {target.name}: "
        + ("destroyed, " if result.destroyed else "")
        + ("undefined" if result.undefined else "no domain")
        + (f"; removed {', '.join(result.removed_volumes)}" if result.removed_volumes else "")
    )
    return EXIT_OK


def _up(args: argparse.Namespace, target: Target, spec: VmSpec, policy: HostPolicy, state: GuestDir) -> int:
    from gpuhost.guest import lifecycle, provision

    repo = args.cuda_repo or provision.CUDA_REPO_BASE
    if not repo.startswith("https://") or any(ch in repo for ch in " '\"`$;\\\n"):
        raise InputError(f"--cuda-repo {repo!r}: an https:// URL is required.")
    options = lifecycle.UpOptions(
        state=state,
        libvirt_uri=args.libvirt_uri,
        skip_cuda=args.skip_cuda,
        wheel_dir=args.wheel_dir,
        cuda_repo_base=repo,
        quick=args.quick,
        command=f"gpuhost guest up -i {args.inventory} --host {target.name} --vm {spec.name}",
        break_lock=args.break_lock,
    )

    def progress(message: str) -> None:
        print(f"gpuhost guest {spec.name}: {message}", flush=True)

    result = lifecycle.up(target, spec, policy, options, progress)
    print(result.smoke.output, end="" if result.smoke.output.endswith("\n") else "\n")
    smoke = result.smoke
    print(f"{spec.name} on {target.name} at {result.address}: smoke-test {smoke.verdict} (exit {smoke.exit_status})")
    for gpu in result.gpus or ():  # every GPU of the VM, by the host slot it came from
        judged = f"GPU {gpu.index} {gpu.verdict or 'not judged'}" if gpu.seen else "NOT SEEN in the guest"
        print(f"  {printable(gpu.describe())}: {printable(judged)}")
    print(f"report: {result.report_dir}")
    total = sum(step.seconds for step in result.steps)
    print("steps: " + ", ".join(f"{s.step} {s.seconds:.1f} s" for s in result.steps) + f"; total {total:.1f} s")
    sys.stdout.flush()
    return result.smoke.exit_status if result.smoke.exit_status in (0, 1, 2) else EXIT_UNUSABLE


def _resolve(args: argparse.Namespace) -> tuple[Target, VmSpec, HostPolicy]:
    return resolve_vm(args, "guest")
