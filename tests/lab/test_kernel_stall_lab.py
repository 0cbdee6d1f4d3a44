"""Issue 31's kernel stall, by hand (not in CI: about six minutes of lab time its budget does not
have). A trial entry whose kernel stalls without a panic: kernel_stall/gpuhost_stall.ko, loaded on the
trial boot only (modules-load=, a testing-only option), spins on a CPU with preemption disabled. The
trial entry's own stall panics must turn the stall into a panic and its panic=N into a reboot onto the
old default, with no action from the test. With RCU's default 21 s timeout, RCU's stall reports
touched the soft-lockup timer every 63 s and softlockup_panic never acted (2026-11-28); the trial
entry now also has RCU's panic with a 120 s timeout (sysctl.kernel.panic_on_rcu_stall=1,
rcupdate.rcu_cpu_stall_timeout=120), so whichever of the two reports the stall first panics.

Collected only with GPUHOST_LAB_BY_HAND=1 (tests/lab/conftest.py); it needs the lab kernel's headers
on this machine (apt-get install linux-headers-<the lab's kernel release>):

    GPUHOST_LAB_BY_HAND=1 pytest -m lab tests/lab/test_kernel_stall_lab.py -n 0 -s
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab.image import Image
from gpuhost.plan.model import TRIAL_MARKER

from .rollout_lab import (
    STALL_MODULE_OPTION,
    STALL_SETTINGS,
    HostLayout,
    Lab,
    apply,
    booted_lab,
    console_since,
    install_stall_module,
    panicked_and_rebooted,
    timing,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]

A = "a-1"
# The trial entry's two panics for a CPU stuck in the kernel, as each announces itself.
STALL_PANICS = {
    "RCU stall": "Kernel panic - not syncing: RCU Stall",
    "soft lockup": "Kernel panic - not syncing: softlockup: hung tasks",
}


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    layout = {A: HostLayout("base", 2048, {"gpuhost_hugepages": 0})}
    with booted_lab(tmp_path_factory.mktemp("kernel-stall-lab"), image_dir, layout) as booted:
        yield booted


def test_a_trial_kernel_that_stalls_without_a_panic_is_rebooted_onto_the_old_command_line_by_itself(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_a = lab.hosts[A]
    install_stall_module(host_a, tmp_path)
    before = host_a.cmdline()
    host_settings = host_a.sh(STALL_SETTINGS)
    serial_log = Path(host_a.record.serial_log)
    log_before = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, STALL_MODULE_OPTION)
    code, report, seconds = apply(lab, lab.inventory("kernel-stall"), "kernel-stall")
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "came back without the trial entry" in entry["message"], entry
    trial = panicked_and_rebooted(console_since(serial_log, log_before), TRIAL_MARKER)
    command_line = trial.splitlines()[0]
    assert STALL_MODULE_OPTION in command_line and "sysctl.kernel.panic_on_rcu_stall=1" in command_line
    assert "gpuhost_stall: CPU" in trial and "now spins with preemption disabled" in trial, trial[-3000:]
    # Both stall panics are armed with 120 s: RCU's report or the soft lockup, whichever comes first.
    panics = [name for name, line in STALL_PANICS.items() if line in trial]
    assert len(panics) == 1, trial[-3000:]
    timing(f"kernel-stall: trial stalled, {panics[0]} panic, rebooted and reverted, apply {seconds:.0f} s in all")
    assert host_a.cmdline() == before
    assert host_a.sh(STALL_SETTINGS) == host_settings  # the old entry's kernel: the host's own settings
    assert "gpuhost_stall" not in host_a.sh("cat /proc/modules")
