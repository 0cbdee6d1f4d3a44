"""The hang faults of the systemd-boot trial boot (the extended lab set, tests/lab/rotation.py), each
caused for real on one OVMF + systemd-boot host, each rescue acting with no help from the test. In
this order:

1. the root-device hang (testing-only root= naming no disk): the trial entry's initramfs waits for a
   root device no disk has and gives up; panic=10 (the trial entry's rescue; without it, the
   initramfs's shell holds the host for good) reboots it, and systemd-boot, which cleared the one-shot
   when it booted the trial, starts the unchanged default entry;
2. the userspace stall (testing-only systemd.mask=ssh.service): the trial boots on but never answers;
   the deadline timer the trial entry pulls in (systemd.wants=) force-reboots it onto the default entry.

Each time apply says "trial reverted" and which rescue acted, the trial entry is gone from the ESP and
/etc/kernel/cmdline and the default entry are unchanged. The kernel stall on systemd-boot is
test_systemd_boot_kernel_stall_lab.py; apply, commit and rollback on systemd-boot are
test_systemd_boot_lab.py (every landing).

Run alone: `GPUHOST_LAB_EXTENDED=test_systemd_boot_hangs_lab.py pytest -m lab
tests/lab/test_systemd_boot_hangs_lab.py -n 0 -s`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.lab.paths import LabPaths
from gpuhost.plan.model import TRIAL_MARKER

from .conftest import uefi_lab_host
from .rollout_lab import (
    ROOT_HANG_TRIAL_OPTION,
    USERSPACE_STALL_OPTION,
    USERSPACE_STALL_REBOOT_TIMEOUT,
    gave_up_on_root_and_rebooted,
)
from .systemd_boot_host import SYSTEMD_BOOT, apply_with_trial_options, assert_reverted, boot_state

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]


@pytest.fixture(scope="module")
def systemd_boot_lab(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPaths]:
    yield from uefi_lab_host(SYSTEMD_BOOT, image_dir, tmp_path_factory.mktemp("systemd-boot-hangs"))


def test_trial_entry_whose_root_never_comes_is_rebooted_onto_the_default_entry_by_itself(
    systemd_boot_lab: LabPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = boot_state(systemd_boot_lab)
    run = apply_with_trial_options(systemd_boot_lab, monkeypatch, "root-hang", ROOT_HANG_TRIAL_OPTION)
    assert run.code != 0 and run.entry["status"] == "trial reverted", run.entry
    assert "came back without the trial entry" in run.entry["message"], run.entry
    # No rescue that leaves a trace acted (no deadline's journal line, no BMC): the report says so.
    assert "Reset by: no rescue that leaves a trace" in run.entry["message"], run.entry
    trial = gave_up_on_root_and_rebooted(run.console, TRIAL_MARKER)
    assert ROOT_HANG_TRIAL_OPTION in trial.splitlines()[0], trial[:3000]
    assert_reverted(systemd_boot_lab, before)


def test_trial_entry_that_never_answers_is_reset_by_its_deadline_onto_the_default_entry(
    systemd_boot_lab: LabPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = boot_state(systemd_boot_lab)
    run = apply_with_trial_options(
        systemd_boot_lab,
        monkeypatch,
        "userspace-stall",
        USERSPACE_STALL_OPTION,
        gpuhost_verify_reboot_timeout=USERSPACE_STALL_REBOOT_TIMEOUT,
    )
    assert run.code != 0 and run.entry["status"] == "trial reverted", run.entry
    assert "came back without the trial entry" in run.entry["message"], run.entry
    assert "Reset by: trial-deadline." in run.entry["message"], run.entry
    # On the console: the trial kernel with the stall, then (the deadline's reset) a kernel without the marker.
    boots = [line for line in run.console.splitlines() if "Command line:" in line]
    trial = next(i for i, line in enumerate(boots) if TRIAL_MARKER in line and USERSPACE_STALL_OPTION in line)
    assert any(TRIAL_MARKER not in line for line in boots[trial + 1 :]), boots
    assert_reverted(systemd_boot_lab, before)
