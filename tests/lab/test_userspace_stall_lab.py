"""The userspace stall of the BIOS GRUB trial boot (the extended lab set, tests/lab/rotation.py): a
trial that boots but never answers, caused for real on one gpu-pair host (2 GiB) with the testing-only
systemd.mask=ssh.service on the trial entry. No watchdog sees that (PID 1 runs on); the deadline timer
the trial entry pulls in (systemd.wants=) force-reboots it, GRUB has cleared its one-shot entry, so the
host boots the old default, and apply says "trial reverted" and names the deadline. Its systemd-boot
twin is in test_systemd_boot_hangs_lab.py.

Run alone: `GPUHOST_LAB_EXTENDED=test_userspace_stall_lab.py pytest -m lab
tests/lab/test_userspace_stall_lab.py -n 0 -s`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab.image import Image
from gpuhost.plan.model import TRIAL_MARKER

from .rollout_lab import (
    USERSPACE_STALL_OPTION,
    USERSPACE_STALL_REBOOT_TIMEOUT,
    HostLayout,
    Lab,
    apply,
    booted_lab,
    console_since,
    timing,
)

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

A = "a-1"


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    layout = {A: HostLayout("base", 2048, {"gpuhost_hugepages": 0})}
    with booted_lab(tmp_path_factory.mktemp("userspace-stall-lab"), image_dir, layout) as booted:
        yield booted


def test_trial_that_never_answers_is_reset_by_its_deadline_and_comes_back_on_the_old_command_line(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_a = lab.hosts[A]
    before = host_a.cmdline()
    serial_log = Path(host_a.record.serial_log)
    log_before = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, USERSPACE_STALL_OPTION)
    settings = {"gpuhost_verify_reboot_timeout": USERSPACE_STALL_REBOOT_TIMEOUT}
    inventory = lab.inventory("userspace-stall", **{A: settings})
    code, report, seconds = apply(lab, inventory, "userspace-stall")
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "came back without the trial entry" in entry["message"], entry
    assert "Reset by: trial-deadline." in entry["message"], entry
    # On the console: the trial kernel with the stall, then (the deadline's reset) a kernel without the marker.
    boots = [line for line in console_since(serial_log, log_before).splitlines() if "Command line:" in line]
    trial = next(i for i, line in enumerate(boots) if TRIAL_MARKER in line and USERSPACE_STALL_OPTION in line)
    assert any(TRIAL_MARKER not in line for line in boots[trial + 1 :]), boots
    timing(f"userspace-stall: trial reset by its deadline and reverted, apply {seconds:.0f} s in all")
    assert host_a.cmdline() == before
    state = host_a.sh(
        "ls /etc/default/gpuhost-trial.cfg /etc/systemd/system/gpuhost-trial-deadline.timer 2>&1; "
        "grep -c gpuhost-trial /boot/grub/grub.cfg || true"
    )
    assert state.count("No such file") == 2 and state.strip().endswith("0"), state
