"""The BIOS GRUB trial boot's rescues through a panic (the extended lab set, tests/lab/rotation.py),
each fault caused for real on one gpu-pair host (2 GiB), each rescue acting with no help from the test.
In this order:

1. the root-device hang (testing-only root= naming no disk): the trial entry's initramfs gives up on
   its root device and panics, the trial entry's panic=N reboots it, and GRUB has cleared its one-shot
   entry, so the host comes back on its old command line by itself;
2. the kernel stall: the image's gpuhost_stall.ko (gpuhost/data/lab_stall_module.c, built in the image
   against its own kernel), loaded on the trial boot only (modules-load=, a testing-only option),
   spins on the one vCPU with preemption disabled. The trial entry's own stall panics turn the stall
   into a panic, and its panic=N into a reboot onto the old default. With RCU's default 21 s timeout,
   RCU's stall reports touched the soft-lockup timer every 63 s and softlockup_panic never acted
   (2026-11-28); the trial entry also has RCU's panic with a 120 s timeout
   (sysctl.kernel.panic_on_rcu_stall=1, rcupdate.rcu_cpu_stall_timeout=120), so whichever of the two
   reports the stall first panics.

Their systemd-boot twins are test_systemd_boot_hangs_lab.py and test_systemd_boot_kernel_stall_lab.py.
Run alone: `GPUHOST_LAB_EXTENDED=test_panic_rescues_lab.py pytest -m lab
tests/lab/test_panic_rescues_lab.py -n 0 -s`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab.image import Image
from gpuhost.plan.model import TRIAL_MARKER

from .rollout_lab import (
    ROOT_HANG_TRIAL_OPTION,
    STALL_MODULE_CHECK,
    STALL_MODULE_OPTION,
    STALL_PANICS,
    STALL_SETTINGS,
    HostLayout,
    Lab,
    apply,
    booted_lab,
    console_since,
    gave_up_on_root_and_rebooted,
    panicked_and_rebooted,
    timing,
)

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

A = "a-1"


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    layout = {A: HostLayout("base", 2048, {"gpuhost_hugepages": 0})}
    with booted_lab(tmp_path_factory.mktemp("panic-rescues-lab"), image_dir, layout) as booted:
        yield booted


def test_trial_whose_root_never_comes_is_rebooted_onto_the_old_command_line_by_itself(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root-device hang on BIOS GRUB: the trial entry's initramfs waits for a root device
    no disk has and gives up; panic=N (the trial entry's rescue; without it, the initramfs's shell
    holds the host for good) reboots it, and GRUB has cleared its one-shot entry, so the host boots
    the old default."""
    host_a = lab.hosts[A]
    before = host_a.cmdline()
    serial_log = Path(host_a.record.serial_log)
    log_before = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, ROOT_HANG_TRIAL_OPTION)
    code, report, _ = apply(lab, lab.inventory("root-hang"), "root-hang")
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "came back without the trial entry" in entry["message"], entry
    assert "Reset by: no rescue that leaves a trace" in entry["message"], entry
    trial = gave_up_on_root_and_rebooted(console_since(serial_log, log_before), TRIAL_MARKER)
    assert ROOT_HANG_TRIAL_OPTION in trial.splitlines()[0], trial[:3000]
    assert host_a.cmdline() == before
    state = host_a.sh("ls /etc/default/gpuhost-trial.cfg 2>&1; grep -c gpuhost-trial /boot/grub/grub.cfg || true")
    assert "No such file" in state and state.strip().endswith("0"), state


def test_a_trial_kernel_that_stalls_without_a_panic_is_rebooted_onto_the_old_command_line_by_itself(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_a = lab.hosts[A]
    assert host_a.sh(STALL_MODULE_CHECK).strip() == "gpuhost_stall", "the lab image has no gpuhost_stall.ko"
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
