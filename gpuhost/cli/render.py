"""`gpuhost render`: the libvirt domain XML of one VM of `gpuhost_vms`, validated, on stdout.

    gpuhost render -i inventory.yml --host gpu01 --vm train-1 > train-1.xml

The host is audited read-only (one round trip, as `gpuhost audit`) for its facts, or they are
read from a capture with --from-snapshot DIR. The VM, the host's other VMs (CPUs are allocated
for all of them, in inventory order) and the host's policy come from the inventory. Exit
status: 0 rendered (and valid), 2 refused or bad input (the message names each conflict).

With -o FILE.xml it also writes FILE.nccl-topo.xml beside it: the VM's NCCL topology file (which
guest NUMA node each GPU hangs off, at its guest bus ID, with the host's PCIe link), the file
`gpuhost guest up` installs and names in the guest's /etc/nccl.conf (NCCL_TOPO_FILE).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuhost.audit import audit_target
from gpuhost.cli.common import add_target_options, resolve_vm
from gpuhost.errors import EXIT_OK, GpuhostError, InputError
from gpuhost.facts.build import build_facts
from gpuhost.facts.model import HostFacts
from gpuhost.facts.snapshot import open_snapshot
from gpuhost.inventory.spec import validate_cpulist, validate_name
from gpuhost.output import check_outputs, write_output
from gpuhost.render.domain import parse_cpulist, plan_domain
from gpuhost.render.nccl_topology import topology_for_plan, topology_path_for, topology_xml
from gpuhost.render.validate import validate_domain_xml
from gpuhost.render.xml import render_plan
from gpuhost.selection import GpuSelector
from gpuhost.targets import SNAPSHOT, Target


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser, snapshots=False)
    parser.add_argument("--host", required=True, metavar="NAME", help="the inventory host the VM runs on")
    parser.add_argument("--vm", required=True, metavar="NAME", help="the VM's name in that host's gpuhost_vms")
    parser.add_argument(
        "--from-snapshot",
        dest="snapshot_dir",
        type=Path,
        metavar="DIR",
        help="take the host's facts from a snapshot directory instead of auditing it",
    )
    parser.add_argument(
        "--taken",
        action="append",
        default=[],
        metavar="ADDRESS=DOMAIN",
        help="a host PCI function another defined domain already has (repeatable); `guest up` reads these from libvirt",
    )
    parser.add_argument(
        "--taken-cpus",
        action="append",
        default=[],
        metavar="CPULIST=DOMAIN",
        help="host CPUs another defined domain's vCPUs are pinned to (repeatable); `guest up` reads these from libvirt",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the XML here instead of stdout, and the VM's NCCL topology file beside it (FILE.nccl-topo.xml)",
    )
    parser.add_argument("--no-validate", action="store_true", help="skip libvirt's schema check (virt-xml-validate)")


def run(args: argparse.Namespace) -> int:
    topology_path = topology_path_for(args.output) if args.output is not None else None
    check_outputs([("-o", args.output), ("-o (its NCCL topology)", topology_path)], [("-i", args.inventory)])
    target, spec, policy = resolve_vm(args, "render")
    host = target.name
    facts = _facts(target, args.snapshot_dir)
    vms = target.require_config().vms  # the host's other VMs: CPUs are allocated for them all
    taken, cpus_taken = parse_taken(args.taken), parse_taken_cpus(args.taken_cpus)
    plan = plan_domain(facts, spec, policy, host=host, taken=taken, host_vms=vms, cpus_taken=cpus_taken)
    xml = render_plan(plan)
    if not args.no_validate:
        validate_domain_xml(xml)
    if args.output is not None:
        write_output(args.output, xml, "-o")
        assert topology_path is not None
        write_output(topology_path, topology_xml(topology_for_plan(facts, plan)), "-o (its NCCL topology)")
    else:
        sys.stdout.write(xml)
    return EXIT_OK


def _facts(target: Target, snapshot: Path | None) -> HostFacts:
    if snapshot is not None:
        tree = open_snapshot(snapshot)
        meta = tree.meta()
        # A snapshot names the host it was taken of: another host's facts would render a VM for hardware
        # --host does not have. (A snapshot without snapshot.json, made by hand, cannot say: it is taken.)
        if meta is not None and meta.host != target.name:
            raise InputError(
                f"--from-snapshot {snapshot}: it is a snapshot of {meta.host!r}, not of --host {target.name}. "
                f"Render for the host it was taken of (--host {meta.host}), or take one of {target.name}: "
                f"gpuhost snapshot -i INVENTORY {target.name} -o DIR."
            )
        return build_facts(tree)
    if target.kind == SNAPSHOT:  # pragma: no cover - inventories do not produce snapshot targets
        assert target.snapshot is not None
        return build_facts(open_snapshot(target.snapshot))
    audit = audit_target(target)
    if audit.error is not None or audit.facts is None:
        raise GpuhostError(f"could not audit {target.name} for its facts: {audit.error}")
    return audit.facts


def parse_taken(values: list[str]) -> dict[str, str]:
    """'0000:41:00.0=train-2' -> {'0000:41:00.0': 'train-2'}."""
    taken: dict[str, str] = {}
    for value, address, domain in _taken_pairs(values, "--taken", "ADDRESS=DOMAIN, e.g. 0000:41:00.0=train-2"):
        try:
            selector = GpuSelector.parse([address], f"--taken {value!r}")
        except InputError:
            selector = None
        if selector is None or not selector.addresses:
            raise InputError(f"--taken {value!r}: {address!r} is not a PCI address like 0000:41:00.0.")
        taken[selector.addresses[0]] = domain
    return taken


def parse_taken_cpus(values: list[str]) -> dict[int, str]:
    """'64-71=train-2' -> {64: 'train-2', ..., 71: 'train-2'}."""
    taken: dict[int, str] = {}
    form = "CPULIST=DOMAIN, e.g. 64-71=train-2"
    for value, cpulist, domain in _taken_pairs(values, "--taken-cpus", form):
        cpus = parse_cpulist(validate_cpulist(cpulist, f"--taken-cpus {value!r}", f"Write it as {form}."))
        taken.update(dict.fromkeys(cpus, domain))
    return taken


def _taken_pairs(values: list[str], option: str, form: str) -> list[tuple[str, str, str]]:
    """(value, what, domain) of each `option` WHAT=DOMAIN value, the domain a valid name."""
    pairs: list[tuple[str, str, str]] = []
    for value in values:
        what, sep, domain = value.partition("=")
        if not sep:
            raise InputError(f"{option} {value!r}: write it as {form}.")
        pairs.append((value, what.strip(), validate_name(domain.strip(), f"{option} {value!r}")))
    return pairs
