"""Which rescue each trial boot gets, and for how long (gpuhost.plan.rescue), on real captures.

The lab snapshot gives the host (its GPUs, GRUB or systemd-boot); the rescue facts come from the
captures of tests/fixtures/rescue (README.md there says how each was taken): a q35 machine with
two watchdogs and a BMC, and the development VM with neither. A snapshot taken before the rescue
facts existed (the lab's) has none.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuhost.cli import apply as apply_cli
from gpuhost.cli.views import describe_plan
from gpuhost.facts.build import build_facts
from gpuhost.facts.model import HostFacts
from gpuhost.facts.rescue import RescueFacts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.plan_settings import VERIFY_REBOOT_TIMEOUT_DEFAULT
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.model import DEADLINE_SERVICE_PATH, DEADLINE_TIMER_PATH, TRIAL_MARKER, FileState, HostPlan
from gpuhost.plan.rescue import (
    BMC_MAX_TIMEOUT_S,
    KERNEL_STALL_OPTIONS,
    MIN_VERIFICATION_S,
    Hang,
    RescueKind,
    deadline_units,
    plan_rescue,
)
from tests.helpers import COLLECTION, FIXTURES, snapshot_facts

RESCUE = FIXTURES / "rescue"
Q35 = build_facts(SnapshotTree(RESCUE / "q35-watchdogs-ipmi")).rescue
NONE = build_facts(SnapshotTree(RESCUE / "dev-vm-none")).rescue
LAB_VARS = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}
HOST_FILES = COLLECTION / "plugins" / "modules" / "host_files.py"


def with_rescue(rescue: RescueFacts | None, snapshot: str = "lab-gpu-pair-fresh") -> HostFacts:
    return dataclasses.replace(snapshot_facts(snapshot), rescue=rescue)


def plan_of(facts: HostFacts, **variables: object) -> HostPlan:
    return plan_host("lab-1", facts, PlanSettings.from_variables({**LAB_VARS, **variables}, "inventory host lab-1"))


def armed(plan: HostPlan) -> list[RescueKind]:
    return [r.kind for r in plan.rescue.rescues if r.armed]


def test_a_host_with_watchdogs_but_no_ipmitool_gets_no_watchdog_and_is_told_why_for_each() -> None:
    assert Q35 is not None and Q35.ipmi_device == "/dev/ipmi0" and Q35.ipmitool is None
    plan = plan_of(with_rescue(Q35))
    assert plan.applicable and plan.trial_now
    assert armed(plan) == [RescueKind.KERNEL_PANICS, RescueKind.TRIAL_DEADLINE]
    bmc, hardware, *_ = plan.rescue.rescues
    assert bmc.kind is RescueKind.BMC_WATCHDOG and "ipmitool is not installed" in bmc.how
    assert plan.rescue.bmc_arm_command == "" and "ipmitool" not in plan.rescue.stop_command
    # The free iTCO watchdog is named, not driven: nothing could stop systemd's watchdog after the
    # trial (busctl cannot reach PID 1 without D-Bus), and the fix is the host's own RuntimeWatchdogSec.
    assert hardware.kind is RescueKind.HARDWARE_WATCHDOG and not hardware.armed
    assert "watchdog0 (iTCO_wdt, 30 s) is there" in hardware.how and "RuntimeWatchdogSec" in hardware.how
    assert not any(option.startswith("systemd.watchdog") for option in plan.rescue.kernel_options)
    assert "RuntimeWatchdogUSec" not in plan.rescue.stop_command and "busctl" not in plan.rescue.stop_command
    assert not plan.rescue.has_watchdog and "no watchdog is armed" in plan.rescue.warning
    text = "\n".join(describe_plan(plan))
    assert "hardware-watchdog: not armed, watchdog0 (iTCO_wdt, 30 s) is there" in text
    assert "bmc-watchdog: not armed, the BMC interface /dev/ipmi0 is there but ipmitool is not installed" in text


def test_with_ipmitool_the_bmc_watchdog_comes_first_and_is_armed_and_stopped_with_it() -> None:
    assert Q35 is not None
    plan = plan_of(with_rescue(dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool")))
    assert armed(plan)[0] is RescueKind.BMC_WATCHDOG
    bmc = plan.rescue.rescues[0]
    assert bmc.catches == tuple(Hang) and plan.rescue.uncaught == ()
    timeout = plan.rescue.bmc_watchdog_timeout_s
    assert timeout == bmc.seconds == VERIFY_REBOOT_TIMEOUT_DEFAULT * 3 // 2 + 60 == plan.rescue.deadline_s + 60
    assert plan.rescue.controller_wait_s == timeout + VERIFY_REBOOT_TIMEOUT_DEFAULT  # the BMC's timer is the latest
    ticks = timeout * 10  # 100 ms ticks, least significant byte first
    assert plan.rescue.bmc_arm_command == (
        f"ipmitool raw 0x06 0x24 0x03 0x01 0x00 0x08 0x{ticks & 0xFF:02x} 0x{ticks >> 8:02x} > /dev/null "
        "&& ipmitool mc watchdog reset"
    )
    # Stopped only where it is gpuhost's OS Load timer, still running.
    assert "*'OS Load'*" in plan.rescue.stop_command and "ipmitool mc watchdog off" in plan.rescue.stop_command
    data = plan.to_json()["rescue"]
    assert data["has_watchdog"] and data["uncaught"] == [] and data["rescues"][0]["kind"] == "bmc-watchdog"


def test_a_bmc_timer_in_use_or_too_short_is_not_armed() -> None:
    assert Q35 is not None
    with_tool = dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool")
    busy = dataclasses.replace(
        with_tool, watchdogs=(dataclasses.replace(Q35.watchdogs[0], identity="IPMI", active=True),)
    )
    [bmc, hardware, *_] = plan_rescue(busy, reboot_timeout_s=900, panic_seconds=10, kernel_release=None).rescues
    assert not bmc.armed and "in use" in bmc.how
    assert not hardware.armed and "every watchdog is in use" in hardware.how
    [bmc, *_] = plan_rescue(with_tool, reboot_timeout_s=86400, panic_seconds=10, kernel_release=None).rescues
    assert not bmc.armed and f"at most {BMC_MAX_TIMEOUT_S} s" in bmc.how


def test_a_host_whose_systemd_already_pets_a_watchdog_keeps_it_as_it_is() -> None:
    assert Q35 is not None
    rescue = plan_rescue(
        dataclasses.replace(Q35, systemd_runtime_watchdog_s=30.0),
        reboot_timeout_s=900,
        panic_seconds=10,
        kernel_release=None,
    )
    # The host's own watchdog resets a stalled trial kernel too: counted, and left as it is.
    hardware = rescue.rescues[1]
    assert rescue.armed(RescueKind.HARDWARE_WATCHDOG) and "pets the watchdog on every boot" in hardware.how
    assert hardware.seconds == 30 and hardware.catches == (Hang.KERNEL_STALL,) and rescue.has_watchdog
    assert not any(option.startswith("systemd.watchdog") for option in rescue.kernel_options)
    assert "RuntimeWatchdogUSec" not in rescue.stop_command  # never turns off the host's own watchdog


def test_a_host_with_no_watchdog_is_named_and_refused_with_require_rescue() -> None:
    plan = plan_of(with_rescue(NONE))
    assert plan.applicable and not plan.rescue.has_watchdog
    assert armed(plan) == [RescueKind.KERNEL_PANICS, RescueKind.TRIAL_DEADLINE]
    assert "no watchdog is armed" in plan.rescue.warning
    assert plan.rescue.uncaught == (Hang.FIRMWARE,)
    text = describe_plan(plan)
    assert any(line.startswith("  warning: no watchdog is armed") and "firmware" in line for line in text)
    refused = plan_of(with_rescue(NONE), gpuhost_require_rescue=True)
    assert [r.code for r in refused.refusals] == ["plan.rescue.none"]
    assert "no watchdog device (/sys/class/watchdog)" in refused.refusals[0].message
    assert "ipmitool" in refused.refusals[0].remedy
    # A host with a watchdog passes; a straight reboot (no trial) arms nothing, so it is refused too.
    with_bmc = with_rescue(dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool"))
    assert plan_of(with_bmc, gpuhost_require_rescue=True).applicable
    straight = plan_of(with_bmc, gpuhost_require_rescue=True, gpuhost_trial_boot=False)
    assert [r.code for r in straight.refusals] == ["plan.rescue.none"] and "--no-trial" in straight.refusals[0].remedy


def test_a_snapshot_without_rescue_facts_gets_the_kernel_options_and_the_deadline_and_says_so() -> None:
    plan = plan_of(snapshot_facts("lab-gpu-pair-fresh"))
    assert armed(plan) == [RescueKind.KERNEL_PANICS, RescueKind.TRIAL_DEADLINE]
    assert "did not gather the rescue facts" in plan.rescue.rescues[0].how
    assert plan.rescue.kernel_options == (*KERNEL_STALL_OPTIONS, "systemd.wants=gpuhost-trial-deadline.timer")


@pytest.mark.parametrize("timeout", [30, 60, VERIFY_REBOOT_TIMEOUT_DEFAULT, 3600, 86400])
def test_the_deadline_is_derived_from_the_controllers_wait_never_shorter(timeout: int) -> None:
    plan = plan_of(with_rescue(Q35), gpuhost_verify_reboot_timeout=timeout)
    rescue = plan.rescue
    assert rescue.deadline_s == timeout + max(MIN_VERIFICATION_S, timeout // 2) > timeout
    # The controller waits for the deadline (or the BMC's later timer) and one more boot, so it sees
    # the old entry come back; a host without ipmitool has no BMC timer.
    assert rescue.controller_wait_s == rescue.deadline_s + timeout
    if rescue.armed(RescueKind.BMC_WATCHDOG):
        assert rescue.bmc_watchdog_timeout_s > rescue.deadline_s
    [timer] = [c for c in plan.files.configure if c.path == DEADLINE_TIMER_PATH]
    assert f"OnBootSec={rescue.deadline_s}s\n" in timer.content


def test_the_plan_reads_the_verify_roles_default_wait() -> None:
    defaults = yaml.safe_load((COLLECTION / "roles/gpuhost_verify/defaults/main.yml").read_text())
    assert defaults["gpuhost_verify_reboot_timeout"] == VERIFY_REBOOT_TIMEOUT_DEFAULT


@pytest.mark.parametrize("snapshot", ["lab-gpu-pair-fresh", "lab-uefi-systemd-boot"])
def test_the_rescue_options_are_on_the_trial_entry_only(snapshot: str) -> None:
    plan = plan_of(with_rescue(Q35, snapshot))
    options = set(plan.rescue.kernel_options)
    if plan.systemd_boot is None:
        trial_line = plan.trial.settings.splitlines()[-1]
        assert all(option in trial_line for option in options) and TRIAL_MARKER in trial_line
        assert not options & set(plan.desired_grub_line.split()) and "softlockup" not in plan.grub_dropin
    else:
        assert all(option in plan.systemd_boot.trial_entry for option in options)
        assert not options & set(plan.systemd_boot.kernel_cmdline.split())
    assert not options & set(plan.kernel_options)


def test_the_deadline_units_are_written_for_the_trial_and_removed_by_commit_revert_and_a_plan_without_one() -> None:
    plan = plan_of(with_rescue(Q35))
    timer, service = deadline_units(plan.rescue.deadline_s)
    configure = {c.path: c for c in plan.files.configure}
    assert configure[DEADLINE_TIMER_PATH].content == timer and configure[DEADLINE_SERVICE_PATH].content == service
    for unit in (timer, service):
        assert f"ConditionKernelCommandLine={TRIAL_MARKER}\n" in unit and "DefaultDependencies=no\n" in unit
        assert "[Install]" not in unit  # nothing enables it: only the trial entry's systemd.wants= pulls it in
    assert "SuccessAction=reboot-force\n" in service and "Unit=gpuhost-trial-deadline.service\n" in timer
    for phase in (plan.files.commit, plan.files.revert):
        gone = {c.path for c in phase if c.state is FileState.ABSENT}
        assert {DEADLINE_TIMER_PATH, DEADLINE_SERVICE_PATH} <= gone
    straight = plan_of(with_rescue(Q35), gpuhost_trial_boot=False)
    assert not any("rescue" in line for line in describe_plan(straight))
    configure = {c.path: c for c in straight.files.configure}
    assert configure[DEADLINE_TIMER_PATH].state is FileState.ABSENT


def test_check_mode_shows_the_deadline_units_and_writes_nothing(tmp_path: Path) -> None:
    plan = plan_of(with_rescue(Q35))
    root = tmp_path / "root"
    files = [{**change, "path": f"{root}{change['path']}"} for change in plan.to_json()["files"]["configure"]]
    arguments = tmp_path / "args.json"
    arguments.write_text(
        json.dumps(
            {
                "ANSIBLE_MODULE_ARGS": {
                    "files": files,
                    "_ansible_check_mode": True,
                    "_ansible_diff": True,
                    "_ansible_tmpdir": str(tmp_path),
                }
            }
        )
    )
    done = subprocess.run([sys.executable, str(HOST_FILES), str(arguments)], capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout)
    assert result["changed"] and not root.exists()
    diffs = {d["after_header"]: d["after"] for d in result["diff"]}
    assert f"OnBootSec={plan.rescue.deadline_s}s" in diffs[f"{root}{DEADLINE_TIMER_PATH}"]


def test_the_kernel_note_says_when_sysctl_options_are_ignored() -> None:
    old = plan_rescue(NONE, reboot_timeout_s=900, panic_seconds=10, kernel_release="5.4.0-150-generic")
    assert "ignores sysctl.*=" in old.rescues[2].how
    new = plan_rescue(NONE, reboot_timeout_s=900, panic_seconds=10, kernel_release="6.1.0-56-amd64")
    assert "ignores" not in new.rescues[2].how


def test_apply_takes_require_rescue() -> None:
    parser = argparse.ArgumentParser()
    apply_cli.configure(parser)
    assert parser.parse_args(["-i", "x.yml", "--require-rescue"]).require_rescue
    assert not parser.parse_args(["-i", "x.yml"]).require_rescue
