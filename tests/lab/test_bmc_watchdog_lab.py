"""Apply's own arming of the BMC's watchdog (the extended lab set, tests/lab/rotation.py), on a host
whose kernel talks to an emulated BMC, is what brings back a trial that nothing inside the host can
rescue.

The host is a gpu-pair-bmc lab host (QEMU's ipmi-bmc-sim behind isa-ipmi-kcs: /dev/ipmi0 once
ipmi_si and ipmi_devintf are loaded), with ipmitool installed from Debian's .debs for this run only
(downloaded here with apt-get download, so the lab image is not changed). Its trial entry loads the
image's gpuhost_stall.ko (gpuhost/data/lab_stall_module.c) with irqs_off=1 (testing-only options): the
one vCPU spins with interrupts disabled, so no timer, RCU or soft-lockup report runs, TCG has no NMI watchdog, and the
deadline timer is userspace: none of the trial's other rescues can act. The audit sees the BMC and
ipmitool, the plan arms the BMC's OS Load timer just before the trial reboot, the timer survives the
reboot, expires, and the BMC resets the host; GRUB's one-shot entry is spent, so the old default
boots, and apply reports the trial reverted, reset by the BMC's watchdog (the OS Load expiration flag
that arming cleared), with the timer stopped.

It needs Debian's package mirror (apt-get download, on this machine). Run alone:

    GPUHOST_LAB_EXTENDED=test_bmc_watchdog_lab.py pytest -m lab tests/lab/test_bmc_watchdog_lab.py -n 0 -s
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.inventory.plan_settings import TRIAL_TESTING_OPTIONS_ENV
from gpuhost.lab.image import Image
from gpuhost.plan.model import TRIAL_MARKER

from .rollout_lab import (
    STALL_MODULE_CHECK,
    STALL_MODULE_OPTION,
    Host,
    HostLayout,
    Lab,
    apply,
    booted_lab,
    console_since,
    timing,
    trial_console,
)

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

A = "a-1"
IRQS_OFF_STALL = (STALL_MODULE_OPTION, "gpuhost_stall.irqs_off=1")
# The controller waits for the BMC's timer and one more boot: gpuhost_verify_reboot_timeout + its
# verification allowance (60 s) + the arming slack (60 s) for the timer, then the reboot timeout again.
BMC_REBOOT_TIMEOUT = 120
IPMI_PACKAGES = ("freeipmi-common", "libfreeipmi17", "ipmitool")
IPMI_MODULES = ("ipmi_si", "ipmi_devintf")


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    layout = {A: HostLayout("base", 2048, {"gpuhost_hugepages": 0}, topology="gpu-pair-bmc")}
    with booted_lab(tmp_path_factory.mktemp("bmc-watchdog-lab"), image_dir, layout) as booted:
        yield booted


def install_ipmitool(host: Host, work: Path) -> None:
    """ipmitool and its FreeIPMI library from Debian's mirror, for this host only, and the BMC's
    device: ipmi_si and ipmi_devintf now and at every boot."""
    fetched = subprocess.run(["apt-get", "download", *IPMI_PACKAGES], cwd=work, capture_output=True, text=True)
    if fetched.returncode != 0:
        pytest.fail(f"apt-get download {' '.join(IPMI_PACKAGES)} failed (Debian's mirror is needed): {fetched.stderr}")
    for deb in sorted(work.glob("*.deb")):
        encoded = base64.b64encode(deb.read_bytes()).decode()
        host.sh(f"mkdir -p /tmp/ipmi-debs && base64 -d > /tmp/ipmi-debs/{deb.name} <<'EOF'\n{encoded}\nEOF")
    host.sh(
        "dpkg -i /tmp/ipmi-debs/*.deb > /dev/null && rm -r /tmp/ipmi-debs && "
        f"printf '%s\\n' {' '.join(IPMI_MODULES)} > /etc/modules-load.d/gpuhost-lab-ipmi.conf && "
        f"for module in {' '.join(IPMI_MODULES)}; do modprobe $module; done && "
        "for i in $(seq 30); do [ -c /dev/ipmi0 ] && break; sleep 1; done; test -c /dev/ipmi0"
    )


def test_a_trial_that_nothing_in_the_host_can_rescue_is_reset_by_the_bmc_watchdog_apply_armed(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_a = lab.hosts[A]
    assert host_a.sh(STALL_MODULE_CHECK).strip() == "gpuhost_stall", "the lab image has no gpuhost_stall.ko"
    install_ipmitool(host_a, tmp_path)
    idle = host_a.sh("ipmitool mc watchdog get")
    assert "Stopped" in idle, idle
    before = host_a.cmdline()
    serial_log = Path(host_a.record.serial_log)
    log_before = serial_log.stat().st_size
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, " ".join(IRQS_OFF_STALL))
    inventory = lab.inventory("bmc-watchdog", **{A: {"gpuhost_verify_reboot_timeout": BMC_REBOOT_TIMEOUT}})
    code, report, seconds = apply(lab, inventory, "bmc-watchdog")
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    assert "came back without the trial entry" in entry["message"], entry
    assert "Reset by: bmc-watchdog." in entry["message"], entry
    # The console: the trial kernel, its CPU stuck with interrupts off and never a panic, then a boot
    # of the old entry (the BMC's reset: nothing in the host could reboot it).
    trial = trial_console(console_since(serial_log, log_before), TRIAL_MARKER)
    boots = [line for line in trial.splitlines() if "Command line:" in line]
    assert all(option in boots[0] for option in IRQS_OFF_STALL), boots[0]
    assert "gpuhost_stall: CPU 0 now spins with preemption disabled and interrupts off" in trial, trial[-3000:]
    assert "Kernel panic" not in trial, trial[-3000:]
    assert len(boots) >= 2 and TRIAL_MARKER not in boots[1], boots
    timing(f"bmc-watchdog: the trial stalled with interrupts off, the BMC reset it, reverted, apply {seconds:.0f} s")
    assert host_a.cmdline() == before
    state = host_a.sh("ipmitool mc watchdog get")
    assert "Stopped" in state and "OS Load" in state, state  # gpuhost's timer, expired: nothing left running
    assert "gpuhost_stall" not in host_a.sh("cat /proc/modules")
