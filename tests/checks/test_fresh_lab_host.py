"""The audit of a real emulated lab host (gpu-pair topology) before any configuration.

tests/fixtures/snapshots/lab-gpu-pair-fresh is `gpuhost snapshot` of a `gpuhost lab up` host:
Debian 12, kernel 6.1, QEMU q35 with an emulated Intel IOMMU, a stand-in GPU (VGA 1234:1111)
and its HDA function (8086:293e) behind their own root port, a cirrus BMC console.
"""

from __future__ import annotations

from gpuhost.checks import AuditPolicy, Severity, run_checks
from gpuhost.cli.main import main
from gpuhost.facts.model import BootloaderKind, VfioPci
from gpuhost.selection import GpuSelector
from tests.helpers import SNAPSHOTS, snapshot_facts

LAB = "lab-gpu-pair-fresh"
STAND_IN = AuditPolicy(gpus=GpuSelector.parse(["1234:1111"], "test"))


def test_lab_host_facts():
    facts = snapshot_facts(LAB)
    assert facts.kernel_release == "6.1.0-50-amd64" and facts.os_pretty_name.startswith("Debian GNU/Linux 12")
    assert facts.iommu.dmar_table is True and facts.iommu.units == ("dmar0",)
    assert facts.iommu.groups[6] == ("0000:01:00.0", "0000:01:00.1")
    assert facts.iommu.group_types[6] == "DMA"
    gpu = facts.function("0000:01:00.0")
    assert gpu.vendor_device == "1234:1111" and gpu.class_code == 0x030000 and gpu.driver == "bochs-drm"
    assert gpu.parents == ("0000:00:03.0",)  # its own PCIe root port
    assert gpu.boot_vga is False and facts.function("0000:00:02.0").boot_vga is True  # cirrus is the console
    assert gpu.reset_methods == ("bus",)
    assert facts.function("0000:01:00.1").driver == "snd_hda_intel"
    assert facts.cpu.has_virtualization and "pdpe1gb" in facts.cpu.flags
    assert facts.bootloader.kind == BootloaderKind.GRUB and facts.bootloader.efi is False
    assert facts.bootloader.update_command == "update-grub"
    assert facts.grub.syntax_error is None
    assert str(facts.grub.effective) == "console=tty0 console=ttyS0,115200n8"
    assert facts.vfio_pci == VfioPci.MODULE
    assert facts.initramfs.entries is not None and facts.initramfs.has_module("vfio_pci") is False
    assert facts.kernel_log.matching("Enabled IRQ remapping")
    assert facts.nvidia.packages == () and not facts.nvidia.runfile_installed


def test_fresh_lab_host_says_exactly_which_steps_are_missing():
    _, selection, findings = run_checks("lab-1", snapshot_facts(LAB), STAND_IN)
    assert [card.gpu.address for card in selection.passthrough] == ["0000:01:00.0"]
    errors = sorted((f.code, f.subject) for f in findings if f.severity == Severity.ERROR)
    assert errors == [
        ("gpu.driver", "0000:01:00.0"),
        ("gpu.driver", "0000:01:00.1"),
        ("gpu.vfio_ids.missing", "0000:01:00.0"),
        ("gpu.vfio_ids.missing", "0000:01:00.1"),
    ]
    warnings = sorted(f.code for f in findings if f.severity == Severity.WARNING)
    assert warnings == ["gpu.reset", "initramfs.vfio"]
    codes = {f.code for f in findings}
    assert {"gpu.group.clean", "iommu.active", "bootloader"} <= codes
    assert "iommu.interrupt_remapping" not in codes  # DMAR-IR enabled it


def test_lab_host_cli_verdict(capsys):
    assert main(["audit", "--from-snapshot", str(SNAPSHOTS / LAB), "--gpus", "1234:1111"]) == 1
    out = capsys.readouterr().out
    assert "lab-1: NOT READY" in out
    assert "1 GPU [1234:1111] on no PCIe link, driver bochs-drm, snd_hda_intel, 1 kept by the host" in out
    assert "Add 8086:293e to vfio-pci.ids" in out


def test_without_the_inventory_selection_the_stand_in_is_not_an_nvidia_gpu(capsys):
    assert main(["audit", "--from-snapshot", str(SNAPSHOTS / LAB)]) == 1
    assert "gpu.none_selected" in capsys.readouterr().out
