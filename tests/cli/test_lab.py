"""`gpuhost lab` through the CLI entry point, on an empty lab directory (no QEMU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhost.cli.main import main


def test_topologies_lists_all_four(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "topologies"]) == 0
    out = capsys.readouterr().out
    for name in ("gpu-pair", "two-gpus", "shared-group", "no-iommu"):
        assert name in out


def test_status_of_an_empty_lab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "status", "--lab-dir", str(tmp_path)]) == 0
    assert "no lab hosts" in capsys.readouterr().out
    assert main(["lab", "status", "--lab-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"] == []


def test_down_of_an_empty_lab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "down", "--lab-dir", str(tmp_path)]) == 0
    assert "no lab hosts were running" in capsys.readouterr().out


def test_ssh_to_an_unknown_host_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "ssh", "--lab-dir", str(tmp_path), "lab-9"]) == 2
    assert "no lab host named 'lab-9'" in capsys.readouterr().err


def test_bad_memory_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "up", "--lab-dir", str(tmp_path), "--memory", "lots"]) == 2
    assert "4G" in capsys.readouterr().err
