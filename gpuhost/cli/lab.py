"""`gpuhost lab`: an emulated GPU-host fleet (Debian 12 under QEMU TCG) for rehearsals and CI.

gpuhost lab image [--variant base|nested]     build (or reuse) the cached base image (root)
gpuhost lab up --hosts 2 --topology gpu-pair  start hosts, wait for SSH, write the inventory
    [--firmware bios|uefi|uefi-secureboot] [--boot grub|systemd-boot]
gpuhost lab status                            hosts, SSH ports, PIDs, serial logs, inventory
gpuhost lab ssh lab-1 [COMMAND...]            SSH into a host (key and host key of the lab)
gpuhost lab reboot lab-1                      reboot a host and wait until it is back
gpuhost lab fake-nvidia lab-1                 make a host look like it has NVIDIA's driver
gpuhost lab topologies                        what each topology looks like
gpuhost lab down                              stop every VM `lab up` started, remove overlays
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, InputError
from gpuhost.lab import fake_nvidia, fleet
from gpuhost.lab import image as lab_image
from gpuhost.lab.boot import FIRMWARE_CHOICES, BootMode, Loader, boot_mode
from gpuhost.lab.builder import ensure_image
from gpuhost.lab.paths import IMAGE_DIR_ENV, LAB_DIR_ENV, LabPaths
from gpuhost.lab.recipe import VARIANTS
from gpuhost.lab.topology import TOPOLOGIES, parse_memory


def _progress(message: str) -> None:
    print(f"gpuhost lab: {message}", file=sys.stderr, flush=True)


_BOOT_OPTIONS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    (
        "--firmware",
        tuple(FIRMWARE_CHOICES),
        "bios",
        "bios (SeaBIOS, the default), uefi (OVMF) or uefi-secureboot (OVMF enforcing Secure Boot with "
        "Microsoft's keys enrolled; boots Debian's signed shim, GRUB and kernel)",
    ),
    (
        "--boot",
        tuple(loader.value for loader in Loader),
        Loader.GRUB.value,
        "boot loader: grub (default) or systemd-boot (needs --firmware uefi; kernel-install, "
        "/etc/kernel/cmdline, loader entries on the ESP)",
    ),
)


def _add_boot_options(parser: argparse.ArgumentParser) -> None:
    for flag, choices, default, text in _BOOT_OPTIONS:
        parser.add_argument(flag, choices=choices, default=default, help=text)


def _boot_mode(args: argparse.Namespace) -> BootMode:
    return boot_mode(args.firmware, args.boot)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Boot emulated GPU hosts (Debian 12 under QEMU TCG, emulated Intel IOMMU, GPU-like PCI "
        "functions) reachable over SSH on 127.0.0.1, with an Ansible inventory."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--lab-dir",
        type=Path,
        default=None,
        help=f"state, overlays, logs, inventory (default: ${LAB_DIR_ENV} or ~/.cache/gpuhost/lab)",
    )
    common.add_argument(
        "--image-dir",
        type=Path,
        default=None,
        help=f"cached images and the lab's SSH keys (default: ${IMAGE_DIR_ENV} or LAB_DIR/images)",
    )
    sub = parser.add_subparsers(dest="lab_verb", metavar="SUBVERB", required=True)

    image = sub.add_parser("image", parents=[common], help="build or reuse the cached disk image (needs root)")
    image.add_argument(
        "--variant",
        choices=VARIANTS,
        default="base",
        help="nested: also carries qemu, libvirt and a tiny guest (slower build)",
    )
    _add_boot_options(image)
    image.add_argument("--force", action="store_true", help="rebuild even if the cached image is current")
    image.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses)")

    up = sub.add_parser("up", parents=[common], help="start lab hosts and write their inventory")
    up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    up.add_argument("--topology", choices=sorted(TOPOLOGIES), default="gpu-pair")
    up.add_argument("--memory", default="4G", help="memory per host, e.g. 4G or 2048M (default 4G)")
    up.add_argument(
        "--cpus", type=int, default=fleet.DEFAULT_CPUS, help=f"vCPUs per host (default {fleet.DEFAULT_CPUS})"
    )
    up.add_argument("--variant", choices=VARIANTS, default="base", help="image variant to boot")
    _add_boot_options(up)
    up.add_argument(
        "--fake-nvidia", action="store_true", help="install the stand-in NVIDIA driver on every host once it is up"
    )
    up.add_argument("--no-wait", action="store_true", help="return without waiting for SSH")
    up.add_argument("--timeout", type=float, default=300, help="seconds to wait for SSH (default 300)")

    status = sub.add_parser("status", parents=[common], help="hosts, ports, PIDs, logs, inventory")
    status.add_argument("--json", action="store_true", help="one JSON object")

    ssh = sub.add_parser("ssh", parents=[common], help="SSH into a lab host")
    ssh.add_argument("host", help="e.g. lab-1")
    ssh.add_argument(
        "remote",
        nargs=argparse.REMAINDER,
        help="command to run instead of a shell: one argument is a shell command line, "
        "several are one command and its arguments, each passed as is",
    )

    reboot = sub.add_parser("reboot", parents=[common], help="reboot a host and wait for SSH")
    reboot.add_argument("host")
    reboot.add_argument("--timeout", type=float, default=300)

    fake = sub.add_parser(
        "fake-nvidia",
        parents=[common],
        help="install a stand-in host NVIDIA driver (package, modprobe.d, nvidia-uninstall)",
    )
    fake.add_argument("hosts", nargs="+", metavar="HOST")

    sub.add_parser("topologies", parents=[common], help="list the topologies")
    sub.add_parser("down", parents=[common], help="stop every VM lab up started; remove overlays")


def run(args: argparse.Namespace) -> int:
    verb: str = args.lab_verb
    paths = LabPaths.resolve(args.lab_dir, args.image_dir)
    if verb in ("ssh", "reboot", "fake-nvidia") and args.image_dir is None and not os.environ.get(IMAGE_DIR_ENV):
        # Reach running hosts with the keys of the images they were started from.
        paths = fleet.with_recorded_images(paths)
    if verb == "image":
        return _image(paths, args)
    if verb == "up":
        return _up(paths, args)
    if verb == "status":
        return _status(paths, args.json)
    if verb == "ssh":
        record = fleet.find_host(paths, args.host)
        remote = args.remote[1:] if args.remote[:1] == ["--"] else args.remote
        if len(remote) == 1:
            # One word is a shell command line, as with plain ssh (`lab ssh lab-1 'ls /etc/*'`).
            remote = ["sh", "-c", remote[0]]
        argv = fleet.host_ssh_argv(paths, record, remote, tty=not remote and sys.stdin.isatty())
        return subprocess.run(argv, check=False).returncode
    if verb == "reboot":
        seconds = fleet.reboot(paths, args.host, timeout=args.timeout)
        print(f"{args.host}: back on SSH {seconds:.0f} s after the reboot")
        return EXIT_OK
    if verb == "fake-nvidia":
        for host in args.hosts:
            done = fake_nvidia.install(paths, host)
            print(
                f"{host}: installed {done.package} {done.version}; files: {', '.join(done.files)}; "
                f"nvidia-uninstall calls are recorded in {done.uninstall_calls_file}"
            )
        return EXIT_OK
    if verb == "topologies":
        for topology in TOPOLOGIES.values():
            iommu = "IOMMU" if topology.iommu else "no IOMMU"
            print(
                f"{topology.name:13} {iommu:9} GPU functions {' '.join(topology.gpu_functions)}"
                + (f"; intruders {' '.join(topology.intruders)}" if topology.intruders else "")
            )
            print(f"{'':13} {topology.summary}")
        return EXIT_OK
    if verb == "down":
        result = fleet.down(paths, progress=_progress)
        for name in result.stopped:
            print(f"{name}: stopped" + (" (killed after SIGTERM grace)" if name in result.killed else ""))
        for name in result.not_running:
            print(f"{name}: was not running (crashed or stopped outside the lab); files removed")
        if not result.stopped and not result.not_running:
            print("no lab hosts were running")
        return EXIT_OK
    raise InputError(f"unknown lab sub-verb {verb!r}")


def _image(paths: LabPaths, args: argparse.Namespace) -> int:
    started = time.monotonic()
    layout = _boot_mode(args).layout
    image = ensure_image(paths, args.variant, layout, mirror=args.mirror, force=args.force, progress=_progress)
    name = lab_image.image_name(args.variant, layout)
    if image.reused:
        print(
            f"{image.disk}: current ({name}, recipe {image.recipe_hash}, kernel {image.kernel}); "
            f"reused in {time.monotonic() - started:.1f} s"
        )
    else:
        print(
            f"{image.disk}: built ({name}, recipe {image.recipe_hash}, kernel {image.kernel}) "
            f"in {image.build_seconds:.0f} s"
        )
    return EXIT_OK


def _up(paths: LabPaths, args: argparse.Namespace) -> int:
    try:
        memory = parse_memory(args.memory)
    except ValueError as error:
        raise InputError(str(error)) from error
    if args.cpus < 1:
        raise InputError("--cpus must be at least 1")
    boot = _boot_mode(args)
    result = fleet.up(
        paths,
        hosts=args.hosts,
        topology=args.topology,
        memory_mib=memory,
        cpus=args.cpus,
        variant=args.variant,
        boot=boot,
        wait=not args.no_wait,
        timeout=args.timeout,
        progress=_progress,
    )
    if args.fake_nvidia and not args.no_wait:
        for record in result.hosts:
            fake_nvidia.install(paths, record.name)
            _progress(f"{record.name}: fake NVIDIA driver installed")
    for record in result.hosts:
        _progress(
            f"{record.name}: PID {record.pid}, ssh -p {record.ssh_port} root@127.0.0.1, serial log {record.serial_log}"
        )
    if not args.no_wait:
        _progress(f"{len(result.hosts)} host(s) up ({boot.describe()}) in {result.boot_seconds:.0f} s")
    _progress(f"inventory written to {result.inventory}; try: gpuhost audit -i {result.inventory}")
    sys.stdout.write(result.inventory_text)
    return EXIT_OK


def _status(paths: LabPaths, as_json: bool) -> int:
    state, hosts = fleet.status(paths)
    crashed = [h for h in hosts if not h.running]
    if as_json:
        print(
            json.dumps(
                {
                    "lab_dir": str(paths.root),
                    "inventory": state.inventory if hosts else None,
                    "hosts": [
                        {**asdict(h.record), "running": h.running, "serial_tail": list(h.serial_tail)} for h in hosts
                    ],
                },
                indent=2,
            )
        )
        return EXIT_FINDINGS if crashed else EXIT_OK
    if not hosts:
        print(f"no lab hosts in {paths.root}")
        return EXIT_OK
    print(f"{'HOST':8} {'STATE':8} {'TOPOLOGY':13} {'SSH':16} {'PID':>7}  SERIAL LOG")
    for host in hosts:
        record = host.record
        print(
            f"{record.name:8} {'running' if host.running else 'CRASHED':8} {record.topology:13} "
            f"127.0.0.1:{record.ssh_port:<6} {record.pid:>7}  {record.serial_log}"
        )
    print(f"inventory: {state.inventory}")
    for host in crashed:
        print(f"\n{host.record.name}: QEMU (PID {host.record.pid}) is gone; its serial log ends with:")
        for line in host.serial_tail:
            print(f"  {line}")
    return EXIT_FINDINGS if crashed else EXIT_OK
