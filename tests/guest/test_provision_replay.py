"""The in-guest provisioning steps of `gpuhost guest up`, as they ran on the H100 test machine.

tests/fixtures/h100-provision/ holds what tests/fixtures/h100-provision/capture.py produced
there (wheels installed without an index, `gpuhost smoke-test --json` run from that venv, the
report brought back), on a real H100 passed through to a microVM.
"""

from __future__ import annotations

import json

import pytest

from gpuhost.cli.main import main
from gpuhost.guest.provision import GUEST_PATH, PIP_FROM_WHEEL, REPORT_JSON, VENV
from tests.helpers import FIXTURES

FIXTURE = FIXTURES / "h100-provision"


def test_the_h100_guest_report_is_a_pass_from_the_provisioned_venv() -> None:
    summary = json.loads((FIXTURE / "guest-report.json").read_text())
    assert summary["schema"] == "gpuhost.guest-report/1"
    assert summary["smoke_test"] == {"exit_status": 0, "verdict": "PASS"}
    assert [step["step"] for step in summary["steps"]] == ["install", "smoke-test"]
    log = (FIXTURE / "provision.log").read_text()
    # The commands the provisioning ran are the ones the code builds today.
    assert f"python3 -m venv --clear --without-pip {VENV}  -> exit 0" in log
    assert f"sh -c {PIP_FROM_WHEEL}" in log
    assert f"env PATH={GUEST_PATH} {VENV}/bin/gpuhost smoke-test --json {REPORT_JSON}  -> exit 0" in log
    assert "VERDICT: PASS" in (FIXTURE / "smoke-test.out").read_text()


def test_the_report_brought_back_replays_to_the_same_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["smoke-test", "--replay", str(FIXTURE / "smoke-test.json")]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3" in out and "VERDICT: PASS" in out
