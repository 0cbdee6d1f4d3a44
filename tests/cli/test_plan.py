"""`gpuhost plan` on real captures, and the apply verb's input checks (no host is reached)."""

from __future__ import annotations

import json

import pytest

from gpuhost.cli.main import main
from tests.helpers import SNAPSHOTS

LAB = str(SNAPSHOTS / "lab-gpu-pair-fresh")


def test_plan_json_of_a_fresh_lab_host(capsys):
    assert main(["plan", "--from-snapshot", LAB, "--gpus", "1234:1111", "--json"]) == 0
    (plan,) = json.loads(capsys.readouterr().out)
    assert plan["schema"] == "gpuhost.plan/1" and plan["applicable"] and plan["reboot_needed"]
    assert plan["vfio_ids"] == ["1234:1111", "8086:293e"]


def test_plan_text_names_refusals_and_exits_1(capsys):
    assert main(["plan", "--from-snapshot", str(SNAPSHOTS / "h100-guest")]) == 1
    out = capsys.readouterr().out
    assert "refused, nothing will be written" in out and "no IOMMU" in out and "fix:" in out


def test_plan_text_shows_the_files(capsys):
    assert main(["plan", "--from-snapshot", LAB, "--gpus", "1234:1111", "--show-files"]) == 0
    out = capsys.readouterr().out
    assert "GRUB line then: console=tty0 console=ttyS0,115200n8 vfio-pci.ids=1234:1111,8086:293e" in out
    assert "--- /etc/initramfs-tools/scripts/init-top/gpuhost-vfio" in out


@pytest.mark.parametrize("serial", ["4;reboot", "$(id)", "1,", "20 %", "x"])
def test_apply_rejects_a_bad_serial_before_anything_runs(serial, tmp_path, capsys):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts: {}\n")
    assert main(["apply", "-i", str(inventory), "--yes", "--serial", serial]) == 2
    assert "--serial" in capsys.readouterr().err


def test_apply_asks_and_refuses_to_run_unattended_without_yes(tmp_path, capsys, monkeypatch):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts: {}\n")
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["apply", "-i", str(inventory)]) == 2
    assert "--yes" in capsys.readouterr().err
