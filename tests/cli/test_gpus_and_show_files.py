"""Issue 42 class 4: --gpus naming a function that is not a GPU is an input error naming it; plan
--show-files shows every file of the plan."""

from __future__ import annotations

import json

from gpuhost.cli.main import main
from tests.helpers import SNAPSHOTS

LAB = str(SNAPSHOTS / "lab-gpu-pair-fresh")


def test_a_nic_id_among_gpu_ids_is_an_input_error_naming_it(capsys):
    # Before: accepted silently (the lab's virtio NIC, 1af4:1000, stands for the 15b3:1021).
    assert main(["audit", "--from-snapshot", LAB, "--gpus", "1234:1111,1af4:1000"]) == 2
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "1af4:1000 is 0000:00:05.0 [1af4:1000] (Ethernet controller), not a GPU" in out
    assert main(["plan", "--from-snapshot", LAB, "--gpus", "1234:1111,1af4:1000"]) == 2
    assert "1af4:1000" in capsys.readouterr().out


def test_a_gpu_s_audio_function_by_address_is_an_input_error(capsys):
    assert main(["audit", "--from-snapshot", LAB, "--gpus", "0000:01:00.1"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "0000:01:00.1 is 0000:01:00.1 [8086:293e] (HD audio), not a GPU" in out


def test_an_id_the_host_does_not_have_stays_the_audit_s_finding(capsys):
    # Another host of the fleet may have it: not an input error, the plan's empty-selection refusal.
    assert main(["plan", "--from-snapshot", LAB, "--gpus", "10de:2330"]) == 1
    assert "plan.selection.empty" not in capsys.readouterr().err


def test_show_files_shows_every_file_the_json_lists(capsys):
    # Before: two of the seven files of the configure phase (the GRUB drop-in and the initramfs script).
    assert main(["plan", "--from-snapshot", LAB, "--gpus", "1234:1111", "--json"]) == 0
    files = json.loads(capsys.readouterr().out)[0]["files"]
    assert main(["plan", "--from-snapshot", LAB, "--gpus", "1234:1111", "--show-files"]) == 0
    out = capsys.readouterr().out
    for phase, changes in files.items():
        for change in changes:
            assert f"--- {change['path']} ({phase}," in out, (phase, change["path"])
            for line in change["content"].splitlines():
                assert f"  | {line}" in out
    assert "Pin-Priority: -1" in out and "linux-modules-nvidia-*" in out
