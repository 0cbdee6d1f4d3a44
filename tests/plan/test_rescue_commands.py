"""The trial rescue's shell (arm and stop), run by sh against stand-ins for ipmitool, systemctl and
busctl that keep their state in files: what each command runs, and that a second stop changes nothing.

The stand-ins print what the real programs print: `ipmitool mc watchdog get` as ipmitool's
ipmi_mc.c formats it (lines "Watchdog Timer Use:     OS Load (0x43)" and "Watchdog Timer Is:
Started/Running" or "Stopped"). The busctl stand-in only logs: the stop must never call it
(gpuhost does not drive systemd's watchdog; gpuhost.plan.rescue says why).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan.model import TRIAL_MARKER
from gpuhost.plan.rescue import deadline_units, plan_rescue
from tests.helpers import FIXTURES

Q35 = build_facts(SnapshotTree(FIXTURES / "rescue" / "q35-watchdogs-ipmi")).rescue

IPMITOOL = r"""#!/bin/sh
echo "ipmitool $*" >> "$STATE/log"
case "$*" in
  "mc watchdog get")
    use=$(cat "$STATE/use"); running=$(cat "$STATE/running")
    printf 'Watchdog Timer Use:     %s\nWatchdog Timer Is:      %s\n' "$use" "$running"
    [ -e "$STATE/expired" ] && printf 'Timer Expiration Flags: OS Load (0x08)\n'
    true;;
  "mc watchdog off") echo Stopped > "$STATE/running";;
  "mc watchdog reset") echo Started/Running > "$STATE/running";;
  raw*) echo 'OS Load (0x43)' > "$STATE/use";;
esac
"""
SYSTEMCTL = r"""#!/bin/sh
echo "systemctl $*" >> "$STATE/log"
case "$1" in
  is-active) [ "$(cat "$STATE/timer")" = active ];;
  stop) echo inactive > "$STATE/timer";;
esac
"""
JOURNALCTL = r"""#!/bin/sh
[ -e "$STATE/journal" ] && cat "$STATE/journal"
true
"""
BUSCTL = r"""#!/bin/sh
echo "busctl $*" >> "$STATE/log"
case "$*" in
  *get-property*) echo "t $(cat "$STATE/runtime")";;
  *"set-property"*RuntimeWatchdogUSec*) echo 0 > "$STATE/runtime";;
esac
"""


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, script in (
        ("ipmitool", IPMITOOL),
        ("systemctl", SYSTEMCTL),
        ("busctl", BUSCTL),
        ("journalctl", JOURNALCTL),
    ):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    for name, value in (
        ("use", "SMS/OS (0x44)"),
        ("running", "Stopped"),
        ("timer", "active"),
        ("runtime", "120000000"),
    ):
        (state / name).write_text(value + "\n")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}


def _proc(tmp_path: Path, cmdline: str) -> Path:
    """A stand-in /proc: the trial boot's command line and its kernel settings as the trial entry set them."""
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "cmdline").write_text(cmdline + "\n")
    trial = {
        "softlockup_panic": 1,
        "panic_on_rcu_stall": 1,
        "hung_task_panic": 1,
        "hung_task_timeout_secs": 600,
        "watchdog_thresh": 60,
    }
    for name, value in trial.items():
        (proc / "sys/kernel" / name).write_text(f"{value}\n")
    (tmp_path / "sys/module/rcupdate/parameters").mkdir(parents=True)
    (tmp_path / "sys/module/rcupdate/parameters/rcu_cpu_stall_timeout").write_text("120\n")
    return proc


def _sh(command: str, env: dict[str, str], proc: Path | None = None) -> subprocess.CompletedProcess[str]:
    if proc is not None:
        command = command.replace("/proc/", f"{proc}/").replace(" /sys/module/", f" {proc.parent}/sys/module/")
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_arm_then_stop_stops_everything_once_and_a_second_stop_changes_nothing(tmp_path: Path) -> None:
    assert Q35 is not None
    rescue = plan_rescue(
        dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool"),
        reboot_timeout_s=900,
        panic_seconds=10,
        kernel_release=None,
    )
    env = _stand_ins(tmp_path)
    state = Path(env["STATE"])
    armed = _sh(rescue.bmc_arm_command, env)
    assert armed.returncode == 0, armed.stderr
    assert (state / "running").read_text().strip() == "Started/Running"
    proc = _proc(tmp_path, f"BOOT_IMAGE=/vmlinuz root=/dev/vda1 panic=10 {TRIAL_MARKER} softlockup_panic=1")
    stopped = _sh(rescue.stop_command, env, proc)
    assert stopped.returncode == 0, stopped.stderr
    # The stall panics, the deadline and the BMC's timer.
    assert stopped.stdout.split() == ["stopped"] * 3
    # Back to what the q35 host had before its trial (its capture's /proc/sys/kernel).
    restored = {f.name: f.read_text().strip() for f in (proc / "sys/kernel").iterdir()}
    assert restored == {
        "softlockup_panic": "0",
        "panic_on_rcu_stall": "0",  # not in the q35 capture: the kernel's default
        "hung_task_panic": "0",
        "hung_task_timeout_secs": "120",
        "watchdog_thresh": "10",
    }
    rcu = tmp_path / "sys/module/rcupdate/parameters/rcu_cpu_stall_timeout"
    assert rcu.read_text() == "21\n"  # CONFIG_RCU_CPU_STALL_TIMEOUT's default, where it was not read
    log = (state / "log").read_text()
    assert "systemctl stop gpuhost-trial-deadline.timer" in log and "ipmitool mc watchdog off" in log
    assert "busctl" not in log  # systemd's watchdog is never driven for the trial (gpuhost.plan.rescue)
    again = _sh(rescue.stop_command, env, proc)
    assert again.returncode == 0 and "stopped" not in again.stdout  # the role's changed_when: not changed


def test_a_bmc_timer_that_is_not_gpuhosts_is_left_running(tmp_path: Path) -> None:
    assert Q35 is not None
    rescue = plan_rescue(
        dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool"),
        reboot_timeout_s=900,
        panic_seconds=10,
        kernel_release=None,
    )
    env = _stand_ins(tmp_path)
    state = Path(env["STATE"])
    (state / "running").write_text("Started/Running\n")  # the host's own SMS/OS timer (ipmi_watchdog)
    # The host came back on its old entry (no marker): its kernel settings are its own, left alone.
    proc = _proc(tmp_path, "BOOT_IMAGE=/vmlinuz root=/dev/vda1")
    result = _sh(rescue.stop_command, env, proc)
    assert (proc / "sys/kernel/hung_task_timeout_secs").read_text() == "600\n"
    assert result.returncode == 0 and "ipmitool mc watchdog off" not in (state / "log").read_text()
    assert (state / "running").read_text().strip() == "Started/Running"


def test_a_failing_stop_fails_the_task(tmp_path: Path) -> None:
    assert Q35 is not None
    rescue = plan_rescue(
        dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool"),
        reboot_timeout_s=900,
        panic_seconds=10,
        kernel_release=None,
    )
    env = _stand_ins(tmp_path)
    (Path(env["PATH"].split(":")[0]) / "ipmitool").write_text("#!/bin/sh\nexit 1\n")
    proc = _proc(tmp_path, "root=/dev/vda1")
    assert _sh(rescue.stop_command, env, proc).returncode != 0  # the host fails before anything is committed


def test_the_rescue_that_reset_the_trial_is_named_from_its_trace(tmp_path: Path) -> None:
    assert Q35 is not None
    rescue = plan_rescue(
        dataclasses.replace(Q35, ipmitool="/usr/bin/ipmitool"),
        reboot_timeout_s=900,
        panic_seconds=10,
        kernel_release=None,
    )
    env = _stand_ins(tmp_path)
    state = Path(env["STATE"])

    def acted() -> list[str]:
        done = _sh(rescue.acted_command, env)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert acted() == []  # a panic leaves no trace of these
    (state / "expired").write_text("")
    assert acted() == ["bmc-watchdog"]
    _timer, service = deadline_units(rescue.deadline_s)
    message = next(line for line in service.splitlines() if line.startswith("ExecStart=")).split(" ", 1)[1]
    (state / "journal").write_text(message + "\n")
    assert acted() == ["bmc-watchdog", "trial-deadline"]


def test_the_stall_panics_go_back_to_what_the_host_had_and_a_setting_the_kernel_lacks_is_skipped(
    tmp_path: Path,
) -> None:
    assert Q35 is not None
    host = dataclasses.replace(Q35.kernel, rcu_stall_panic=False, rcu_stall_timeout_s=59, hung_task_timeout_s=240)
    rescue = plan_rescue(
        dataclasses.replace(Q35, kernel=host), reboot_timeout_s=900, panic_seconds=10, kernel_release=None
    )
    env = _stand_ins(tmp_path)
    proc = _proc(tmp_path, f"BOOT_IMAGE=/vmlinuz root=/dev/vda1 {TRIAL_MARKER}")
    (proc / "sys/kernel/panic_on_rcu_stall").unlink()  # a kernel older than 4.6 has no RCU stall panic
    stopped = _sh(rescue.stop_command, env, proc)
    assert stopped.returncode == 0, stopped.stderr
    assert not (proc / "sys/kernel/panic_on_rcu_stall").exists()
    assert (proc / "sys/kernel/hung_task_timeout_secs").read_text() == "240\n"
    assert (tmp_path / "sys/module/rcupdate/parameters/rcu_cpu_stall_timeout").read_text() == "59\n"
