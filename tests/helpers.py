"""Shared test helpers: load the real captures under tests/fixtures."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from gpuhost.facts.build import build_facts
from gpuhost.facts.model import HostFacts, Iommu
from gpuhost.facts.parsers import LspciEntry, parse_cmdline, parse_lspci_nn
from gpuhost.facts.pci import PcieLinkStatus, PciFunction
from gpuhost.facts.snapshot import SnapshotTree

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOTS = FIXTURES / "snapshots"
# The Ansible collection gpuhost.passthrough (its roles, playbooks and plugins) in the checkout.
COLLECTION = Path(__file__).resolve().parents[1] / "playbooks/collections/ansible_collections/gpuhost/passthrough"


def snapshot_facts(name: str) -> HostFacts:
    return build_facts(SnapshotTree(SNAPSHOTS / name))


def function_from_lspci(entry: LspciEntry, group: int, **known: Any) -> PciFunction:
    """A PCI function as an `lspci -nn` line shows it, in IOMMU group `group`; what lspci does not
    show is unknown (None) unless given in `known` (driver, numa_node, ...)."""
    values: dict[str, Any] = {
        "subsystem_vendor": None,
        "subsystem_device": None,
        "revision": None,
        "driver": None,
        "driver_override": None,
        "numa_node": None,
        "local_cpulist": None,
        "link": PcieLinkStatus(None, None, None, None),
        "reset_methods": None,
        "bars": (),
    }
    values.update(known)
    return PciFunction(
        address=entry.address,
        vendor=entry.vendor,
        device=entry.device,
        class_code=entry.class_code << 8,
        iommu_group=group,
        **values,
    )


def guide_host(listing: str, cmdline: str, base: HostFacts) -> HostFacts:
    """A host whose PCI functions and IOMMU groups are those the guide printed (lspci -nns lines
    under 'IOMMU Group N:' headers), on top of a real captured host for everything else."""
    functions: list[PciFunction] = []
    groups: dict[int, tuple[str, ...]] = {}
    group = None
    for block in re.split(r"^IOMMU Group (\d+):$", listing, flags=re.M)[1:]:
        if group is None:
            group = int(block)
            continue
        entries = parse_lspci_nn(block)
        groups[group] = tuple(entry.address for entry in entries)
        for entry in entries:
            # the ASPEED BMC display is the console
            functions.append(function_from_lspci(entry, group, boot_vga=entry.vendor == 0x1A03))
        group = None
    iommu = Iommu(dmar_table=False, ivrs_table=True, units=("ivhd0",), groups=groups, group_types={})
    return dataclasses.replace(base, pci=tuple(functions), iommu=iommu, cmdline=parse_cmdline(cmdline))


def replay_smoke_test(path: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """`gpuhost smoke-test --replay PATH --json ...` with no GPU: its exit status and the JSON it wrote."""
    import json

    from gpuhost.cli.main import main

    again = tmp_path / "again.json"
    code = main(["smoke-test", "--replay", str(path), "--json", str(again), *extra])
    return code, json.loads(again.read_text())


def capture_json(capture: Path, name: str) -> dict[str, Any]:
    """A device capture's `NAME.json` (tests/fixtures/<capture>/)."""
    import json

    document: dict[str, Any] = json.loads((capture / f"{name}.json").read_text())
    return document


def capture_wall_times(capture: Path) -> dict[str, tuple[int, float]]:
    """A device capture's wall-times.txt: each step's exit status and wall time, as its capture
    script wrote them ("NAME exit N wall S s")."""
    rows = {}
    for line in (capture / "wall-times.txt").read_text().splitlines():
        found = re.fullmatch(r"(\S+) exit (\d+) wall ([\d.]+) s", line)
        assert found, line
        rows[found[1]] = (int(found[2]), float(found[3]))
    return rows
