"""The kernel stall on systemd-boot (the extended lab set, tests/lab/rotation.py): a trial kernel that
stalls without a panic, on one OVMF + systemd-boot host. The image's gpuhost_stall.ko
(gpuhost/data/lab_stall_module.c, built in the image against its own kernel), loaded on the trial boot
only (modules-load=, a testing-only option), spins on the one vCPU with preemption disabled; the trial
entry's own stall panics (RCU's or the soft lockup's, 120 s) turn it into a panic, and panic=10 into a
reboot, which systemd-boot, the one-shot spent, takes onto the unchanged default entry. The same fault
on BIOS GRUB is test_panic_rescues_lab.py.

Run alone: `GPUHOST_LAB_EXTENDED=test_systemd_boot_kernel_stall_lab.py pytest -m lab
tests/lab/test_systemd_boot_kernel_stall_lab.py -n 0 -s`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.lab.paths import LabPaths
from gpuhost.plan.model import TRIAL_MARKER

from .conftest import on_lab_host, uefi_lab_host
from .rollout_lab import STALL_MODULE_CHECK, STALL_MODULE_OPTION, STALL_PANICS, STALL_SETTINGS, panicked_and_rebooted
from .systemd_boot_host import SYSTEMD_BOOT, apply_with_trial_options, assert_reverted, boot_state

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]


@pytest.fixture(scope="module")
def systemd_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(SYSTEMD_BOOT, image_dir, tmp_path_factory.mktemp("systemd-boot-kernel-stall"))


def test_a_trial_kernel_that_stalls_without_a_panic_boots_the_default_entry_again_by_itself(
    systemd_boot_lab: LabPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert on_lab_host(systemd_boot_lab, "sh", "-c", STALL_MODULE_CHECK).strip() == "gpuhost_stall", (
        "the lab image has no gpuhost_stall.ko"
    )
    before = boot_state(systemd_boot_lab)
    host_settings = on_lab_host(systemd_boot_lab, "sh", "-c", STALL_SETTINGS)
    run = apply_with_trial_options(systemd_boot_lab, monkeypatch, "kernel-stall", STALL_MODULE_OPTION)
    assert run.code != 0 and run.entry["status"] == "trial reverted", run.entry
    assert "came back without the trial entry" in run.entry["message"], run.entry
    trial = panicked_and_rebooted(run.console, TRIAL_MARKER)
    command_line = trial.splitlines()[0]
    assert STALL_MODULE_OPTION in command_line and "sysctl.kernel.panic_on_rcu_stall=1" in command_line
    assert "gpuhost_stall: CPU" in trial and "now spins with preemption disabled" in trial, trial[-3000:]
    panics = [name for name, line in STALL_PANICS.items() if line in trial]
    assert len(panics) == 1, trial[-3000:]
    assert_reverted(systemd_boot_lab, before)
    assert on_lab_host(systemd_boot_lab, "sh", "-c", STALL_SETTINGS) == host_settings
    assert "gpuhost_stall" not in on_lab_host(systemd_boot_lab, "cat", "/proc/modules")
