"""A second apply keeps what the first added and the host still needs (issue 27.1).

The host: the lab capture lab-gpu-pair-fresh as booted without intel_iommu=on (no IOMMU groups),
planned; then the same capture as that first apply and its reboot leave it: the plan's own GRUB
drop-in written, GRUB's effective line computed by sourcing the files as gather.sh does (real sh
on the real template), the options booted, the card on vfio-pci. A second plan with a change (the
huge page count) must keep intel_iommu=on, and its "GRUB line then" must be what the files it
leaves give, not a line computed from /proc/cmdline or the old drop-in's output.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.model import HostFacts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.model import GRUB_DROPIN_PATH
from tests.helpers import SNAPSHOTS, snapshot_facts

FIRST = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}
SECOND = {**FIRST, "gpuhost_hugepages": 0}  # the change between the applies: no huge pages
# What gather.sh runs to compute GRUB's line (its grub-effective command), on the snapshot's files.
_EFFECTIVE = (
    'set +u; . ./etc/default/grub; for f in ./etc/default/grub.d/*.cfg; do [ -r "$f" ] && . "$f"; done; '
    'printf "GRUB_CMDLINE_LINUX=%s\\nGRUB_CMDLINE_LINUX_DEFAULT=%s\\nGRUB_DEFAULT=%s\\nGRUB_DISABLE_RECOVERY=%s\\n" '
    '"${GRUB_CMDLINE_LINUX-}" "${GRUB_CMDLINE_LINUX_DEFAULT-}" "${GRUB_DEFAULT-}" "${GRUB_DISABLE_RECOVERY-}"'
)


def _without_iommu(facts: HostFacts) -> HostFacts:
    """Booted without intel_iommu=on: the DMAR table is there, the kernel made no groups."""
    pci = tuple(dataclasses.replace(f, iommu_group=None) for f in facts.pci)
    return dataclasses.replace(facts, pci=pci, iommu=dataclasses.replace(facts.iommu, groups={}, units=()))


def _grub_effective(root: Path) -> str:
    return subprocess.run(["sh", "-c", _EFFECTIVE], cwd=root, capture_output=True, text=True, check=True).stdout


def _applied_snapshot(tmp_path: Path, dropin: str, options: tuple[str, ...]) -> Path:
    root = tmp_path / "after-first-apply"
    shutil.copytree(SNAPSHOTS / "lab-gpu-pair-fresh", root, symlinks=True)
    (root / GRUB_DROPIN_PATH.lstrip("/")).write_text(dropin)
    (root / "commands/grub-effective.txt").write_text(_grub_effective(root))
    cmdline = root / "proc/cmdline"
    cmdline.write_text(f"{cmdline.read_text().strip()} {' '.join(options)}\n")
    for function in ("0000:01:00.0", "0000:01:00.1"):
        (root / f"sys/bus/pci/devices/{function}/driver").write_text("../../../../bus/pci/drivers/vfio-pci")
    return root


def test_a_second_apply_keeps_the_iommu_option_the_first_added(tmp_path: Path):
    fresh = _without_iommu(snapshot_facts("lab-gpu-pair-fresh"))
    first = plan_host("lab-1", fresh, PlanSettings.from_variables(FIRST, "inventory host lab-1"))
    assert "intel_iommu=on" in first.kernel_options  # booted without it: the first apply adds it
    root = _applied_snapshot(tmp_path, first.grub_dropin, first.kernel_options)
    applied = build_facts(SnapshotTree(root))
    assert applied.iommu.active and applied.grub.gpuhost_options is not None
    assert "intel_iommu=on" in applied.grub.gpuhost_options.tokens  # read back from the host's own drop-in

    second = plan_host("lab-1", applied, PlanSettings.from_variables(SECOND, "inventory host lab-1"))
    second.require_applicable()
    assert "intel_iommu=on" in second.kernel_options and "hugepages=1" not in second.kernel_options
    # "GRUB line then" is what the files this plan leaves give: its drop-in sourced after /etc/default/grub.
    (root / GRUB_DROPIN_PATH.lstrip("/")).write_text(second.grub_dropin)
    effective = dict(line.split("=", 1) for line in _grub_effective(root).splitlines())
    then = f"{effective['GRUB_CMDLINE_LINUX']} {effective['GRUB_CMDLINE_LINUX_DEFAULT']}".split()
    assert second.desired_grub_line.split() == then
    assert then.count("intel_iommu=on") == 1 and "hugepages=1" not in then


def test_an_option_the_old_drop_in_added_and_this_plan_does_not_is_not_shown_as_kept(tmp_path: Path):
    """pci=realloc added by the first apply, turned off for the second: the new drop-in drops it, so
    the plan's "then" must not show it (it was computed from the old drop-in's output)."""
    fresh = snapshot_facts("lab-gpu-pair-fresh")
    first = plan_host("lab-1", fresh, PlanSettings.from_variables({**FIRST, "gpuhost_pci_realloc": True}, "inv"))
    assert "pci=realloc" in first.kernel_options
    root = _applied_snapshot(tmp_path, first.grub_dropin, first.kernel_options)
    second = plan_host("lab-1", build_facts(SnapshotTree(root)), PlanSettings.from_variables(FIRST, "inv"))
    (root / GRUB_DROPIN_PATH.lstrip("/")).write_text(second.grub_dropin)
    effective = dict(line.split("=", 1) for line in _grub_effective(root).splitlines())
    then = f"{effective['GRUB_CMDLINE_LINUX']} {effective['GRUB_CMDLINE_LINUX_DEFAULT']}".split()
    assert "pci=realloc" not in then and second.desired_grub_line.split() == then
