"""The plan's kernel command line against gpuhost.cmdline's table: what it writes, what it claims of the
host's own options, and that the trial entry's options stay out of both (the lab's fresh GRUB host)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from gpuhost.cmdline import (
    KERNEL_OPTIONS,
    PENDING_REBOOT_KEYS,
    AuditUse,
    KernelOption,
    Owner,
    claim,
    key_of,
    option_for,
)
from gpuhost.facts.model import Iommu
from gpuhost.facts.parsers import parse_cmdline
from gpuhost.plan.model import TRIAL_MARKER
from tests.plan.test_planner import lab_facts, plan, shell_effective

# A host's own options beside gpuhost's keys: some are its own values of a key gpuhost writes too.
HOST_LINUX = "console=ttyS0 pci=noaer pcie_aspm=force modprobe.blacklist=floppy hugepages=64 nomodeset"
HOST_DEFAULT = "quiet intel_iommu=off amd_iommu=fullflush video=efifb:off iommu=soft default_hugepagesz=2M"
OPTIONAL = {"gpuhost_pci_realloc": True, "gpuhost_pcie_aspm_off": True, "gpuhost_nomodeset": True}


def _lab_host_with_its_own_options():
    """The lab's fresh host with HOST_LINUX and HOST_DEFAULT as its GRUB lines."""
    facts = lab_facts()
    grub = dataclasses.replace(
        facts.grub, cmdline_linux=parse_cmdline(HOST_LINUX), cmdline_linux_default=parse_cmdline(HOST_DEFAULT)
    )
    return dataclasses.replace(facts, grub=grub)


def test_the_plan_takes_every_value_of_its_keys_and_only_its_own_value_of_the_others():
    facts = _lab_host_with_its_own_options()
    # No 1 GiB page planned: the host's hugepages= and default_hugepagesz= go all the same.
    result = plan(facts, gpuhost_hugepages=0, **OPTIONAL)
    assert result.owned_keys == ("vfio-pci.ids", "iommu", "hugepages", "hugepagesz", "default_hugepagesz")
    assert result.owned_tokens == (
        "modprobe.blacklist=nouveau,nvidia,nvidiafb",
        "pci=realloc",
        "pcie_aspm=off",
        "nomodeset",
    )
    effective = shell_effective(result.grub_dropin, HOST_LINUX, HOST_DEFAULT)
    assert effective == result.desired_grub_line
    assert effective.split() == [
        # the host's own, in order
        "console=ttyS0",
        "pci=noaer",
        "pcie_aspm=force",
        "modprobe.blacklist=floppy",
        "quiet",
        "intel_iommu=off",  # not gpuhost's: this plan writes no intel_iommu
        "amd_iommu=fullflush",
        "video=efifb:off",
        # gpuhost's, once
        "vfio-pci.ids=1234:1111,8086:293e",
        "modprobe.blacklist=nouveau,nvidia,nvidiafb",
        "iommu=pt",
        "pci=realloc",
        "pcie_aspm=off",
        "nomodeset",
    ]


def test_intel_iommu_is_gpuhosts_where_the_plan_writes_it():
    facts = _lab_host_with_its_own_options()
    off = Iommu(dmar_table=True, ivrs_table=False, units=(), groups={}, group_types={})
    result = plan(dataclasses.replace(facts, iommu=off))
    assert "intel_iommu=on" in result.kernel_options and result.owned_keys[-1] == "intel_iommu"
    tokens = shell_effective(result.grub_dropin, HOST_LINUX, HOST_DEFAULT).split()
    assert [t for t in tokens if t.startswith("intel_iommu")] == ["intel_iommu=on"]


def test_every_option_a_plan_writes_is_gpuhosts_in_the_table_and_a_pending_reboot_to_the_audit():
    facts = _lab_host_with_its_own_options()
    off = Iommu(dmar_table=True, ivrs_table=False, units=(), groups={}, group_types={})
    result = plan(dataclasses.replace(facts, iommu=off), **OPTIONAL)
    written = {key_of(option) for option in result.kernel_options}
    assert written == {o.key for o in KERNEL_OPTIONS if o.owner.value.startswith("gpuhost")}  # each row is used
    for option in result.kernel_options:
        assert option_for(option).owner in (Owner.GPUHOST, Owner.GPUHOST_WHEN_WRITTEN, Owner.GPUHOST_VALUE)
        # An apply not yet rebooted shows as cmdline.pending_reboot.
        assert key_of(option) in PENDING_REBOOT_KEYS, option


def test_the_trial_entrys_own_options_are_none_of_the_tables():
    """A committed trial runs on with them until its next reboot: were one a passthrough option, the
    audit would call the committed host's line a pending reboot; were one gpuhost's, the plan would
    take the host's own value of it."""
    result = plan(lab_facts())
    trial_only = (*result.rescue.kernel_options, f"panic={result.trial.panic_seconds}", TRIAL_MARKER)
    assert len(trial_only) > 3
    known = {option.key for option in KERNEL_OPTIONS}
    assert [option for option in trial_only if key_of(option) in known] == []


@pytest.mark.parametrize("option", ["video=efifb:off", "root=/dev/vda1", "quiet", "panic=30"])
def test_the_plan_cannot_claim_an_option_that_is_not_gpuhosts(option: str):
    with pytest.raises(ValueError, match=r"never writes it|not in gpuhost\.cmdline\.KERNEL_OPTIONS"):
        claim(["iommu=pt", option])


PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "kernel-options.md"
REGENERATE = os.environ.get("GPUHOST_REGEN_GOLDEN") == "1"

INTRO = """# Kernel command-line options

Every option of the kernel command line that gpuhost reads or writes: who owns it, what `gpuhost
apply` writes, and what the audit makes of it. An option gpuhost owns for every value is taken out
of the host's own lines (`GRUB_CMDLINE_LINUX`, `GRUB_CMDLINE_LINUX_DEFAULT`, `/etc/kernel/cmdline`)
before gpuhost's options are appended, even where the plan writes none of it; one it owns for its own
value only leaves the host's other values in place. The audit reports a pending reboot
(`cmdline.pending_reboot`) when GRUB's line and the running kernel's differ in a marked option, and
an ignored file (`bootloader.cmdline_ignored`) when a marked option is set in a file the active boot
loader never reads. The trial boot's own options (`panic=N`, `gpuhost.trial=1`, the stall
panics) go on the one-shot trial entry only and are not listed here. This page is generated from
`gpuhost.cmdline` (a test fails when they differ).
"""

OWNERS = {
    Owner.GPUHOST: "gpuhost, every value",
    Owner.GPUHOST_WHEN_WRITTEN: "gpuhost, every value where it writes it; else the host",
    Owner.GPUHOST_VALUE: "gpuhost, its own value only",
    Owner.HOST: "the host (read, never written)",
    Owner.BOOT_LOADER: "the boot loader (before the configured line)",
}


def _written(option: KernelOption) -> str:
    if option.owner not in (Owner.GPUHOST, Owner.GPUHOST_WHEN_WRITTEN, Owner.GPUHOST_VALUE):
        return "-"
    return f"`{option.token()}`" if option.value is not None else f"`{option.key}=...` (per host)"


def expected_page() -> str:
    rows = [
        "| option | owner | gpuhost writes | pending reboot | in an ignored file | what it is for |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for option in KERNEL_OPTIONS:
        cells = [
            f"`{option.key}`",
            OWNERS[option.owner],
            _written(option),
            "yes" if AuditUse.PENDING_REBOOT in option.audit else "-",
            "yes" if AuditUse.IGNORED_FILE in option.audit else "-",
            option.purpose,
        ]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join([INTRO, *rows, ""])


def test_the_kernel_options_page_is_the_table() -> None:
    expected = expected_page()
    if REGENERATE:
        PAGE.write_text(expected)
    assert PAGE.read_text() == expected, "docs/reference/kernel-options.md differs from gpuhost.cmdline: regenerate it"
