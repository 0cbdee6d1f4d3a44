"""A host gone dark in its BIOS GRUB trial boot is powered on through its BMC (the extended lab set,
tests/lab/rotation.py): the rescue for a trial that no rescue on the host can reach, caused for real.

Two gpu-pair hosts from the base image, 2 GiB each, as in the fault suite (tests/lab/test_faults_lab.py):
A is batch 1 of every rollout and the host every fault is done to; B is batch 2, the next batch, which
a reverted batch must leave untouched. A's QEMU is killed as its trial kernel boots (a host gone
dark: no rescue on it can act); once the reboot's wait has passed, apply powers A on through its BMC
(OpenIPMI's ipmi_sim over IPMI-LAN on 127.0.0.1, whose power on starts A's QEMU from its disk); A is
back on its old command line, the report says "trial reverted" and names the BMC with the times, and
B is not reached and untouched.

Run alone: `GPUHOST_LAB_EXTENDED=test_bmc_power_on_lab.py pytest -m lab
tests/lab/test_bmc_power_on_lab.py -n 0 -s`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhost.lab import fleet
from gpuhost.lab.image import Image
from gpuhost.lab.state import load_state, process_start_ticks, save_state
from tests.bmc.emulators import IPMI_USER, ipmi_power_switch

from .rollout_lab import (
    Host,
    HostLayout,
    Lab,
    apply,
    booted_lab,
    timing,
)

# In the lab-rest group, the lighter of the two per-landing groups (tests/lab/rotation.py).
pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800), pytest.mark.xdist_group("lab-rest")]

A, B = "a-1", "b-1"
# Fault 1 waits this out (the controller waits 75 + 60 + 75 s), and A must answer within it once its BMC
# powers it on: 42-58 s in ten runs by hand beside another lab host (2026-11-28).
KILLED_REBOOT_TIMEOUT = 75
# The trial kernel's first words on A's serial console (console=ttyS0): its command line.
TRIAL_BOOT_LINE = re.compile(rb"Command line: [^\n]*gpuhost\.trial=1")
LAYOUT = {
    A: HostLayout("base", 2048, {"gpuhost_hugepages": 0}),
    B: HostLayout("base", 2048, {"gpuhost_hugepages": 0}),
}


@pytest.fixture(scope="module")
def lab(base_image: Image, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with booted_lab(tmp_path_factory.mktemp("bmc-power-on-lab"), image_dir, LAYOUT) as booted:
        yield booted


@pytest.fixture(scope="module")
def original(lab: Lab) -> dict[str, dict[str, Any]]:
    return {name: {"hashes": host.hashes(), "cmdline": host.cmdline()} for name, host in lab.hosts.items()}


def _kill_in_trial_boot(host: Host, killed: dict[str, float]) -> None:
    """Kill A's QEMU as soon as its serial console shows the trial kernel booting: GRUB has used its
    one-shot entry by then, so this is a host that hangs or loses power in its trial boot."""
    serial_log = Path(host.record.serial_log)
    offset = serial_log.stat().st_size
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        time.sleep(0.5)
        with serial_log.open("rb") as console:
            console.seek(offset)
            if TRIAL_BOOT_LINE.search(console.read()):
                os.kill(host.record.pid, signal.SIGKILL)
                killed["at"] = time.monotonic()
                return


def _adopt_started(host: Host) -> None:
    """Take the VM's QEMU started again (by the test or A's BMC) into the lab's state, so that the
    lab stops it and finds it by its new PID; wait for its SSH."""
    record = host.record
    assert Path(record.pidfile).exists(), f"{host.name}'s QEMU was not started again (no {record.pidfile})"
    pid = int(Path(record.pidfile).read_text().strip())
    ticks = process_start_ticks(pid)
    assert ticks is not None
    state = load_state(host.paths.state_file)
    fresh = dataclasses.replace(record, pid=pid, start_ticks=ticks)
    save_state(host.paths.state_file, dataclasses.replace(state, hosts=(fresh,)))
    fleet.wait_for_ssh(host.paths, [fresh], 900)


def _power_on_script(host: Host, path: Path) -> Path:
    """What A's BMC runs to power A on: its QEMU command line as the lab started it (same disk
    overlay, same SSH port), which daemonizes, so the BMC's own stop leaves it running."""
    record = host.record
    path.write_text(
        f"#!/bin/sh\nrm -f {shlex.quote(record.pidfile)}\nexec {shlex.join(record.argv)} </dev/null >/dev/null 2>&1\n"
    )
    path.chmod(0o755)
    return path


BMC_PASSWORD = "Lab-Bmc-Pass-31"
BMC_PASSWORD_ENV = "GPUHOST_LAB_A_BMC_PASSWORD"


def test_host_killed_during_its_trial_boot_is_powered_on_through_its_bmc_and_the_next_is_untouched(
    lab: Lab, original: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host gone dark in its trial boot (its QEMU killed: no rescue on the host can act) is brought
    back through its BMC once the reboot's wait has passed; the trial is reverted, the next batch untouched."""
    host_a = lab.hosts[A]
    monkeypatch.setenv(BMC_PASSWORD_ENV, BMC_PASSWORD)
    power_on = _power_on_script(host_a, tmp_path / "power-on-a")
    with ipmi_power_switch(tmp_path / "bmc-a", BMC_PASSWORD, power_on) as bmc:
        killed: dict[str, float] = {}
        killer = threading.Thread(target=_kill_in_trial_boot, args=(host_a, killed), daemon=True)
        killer.start()
        # A short reboot timeout for A: it is killed, so the whole wait is waited out before the BMC acts.
        a_settings = {
            "gpuhost_verify_reboot_timeout": KILLED_REBOOT_TIMEOUT,
            "gpuhost_bmc": {
                "protocol": "ipmi",
                "address": f"127.0.0.1:{bmc.port}",
                "user": IPMI_USER,
                "password_env": BMC_PASSWORD_ENV,
            },
        }
        code, report, _ = apply(lab, lab.inventory("bmc-power-on", **{A: a_settings}), "bmc-power-on")
        killer.join(timeout=5)
    assert "at" in killed, "A's QEMU was never killed"
    # First, whatever else fails: the lab stops the QEMU that A's BMC started only once it knows it.
    _adopt_started(host_a)
    entry = report["hosts"][A]
    assert code != 0 and entry["status"] == "trial reverted", entry
    # The BMC found A off (its QEMU gone) and powered it on: the trial's one-shot entry was spent.
    assert "Reset by: the BMC power cycle." in entry["message"], entry
    # The times, in the order they happened (UTC, ISO 8601: their text order is their time order).
    cycle = re.search(
        rf"power-cycled through the BMC \(chassis power on to ipmi://127\.0\.0\.1:{bmc.port}: the reboot's deadline "
        r"passed at (\S+), the power cycle was sent at (\S+), the host answered at (\S+)\); the host came back",
        entry["message"],
    )
    assert cycle is not None, entry
    assert cycle[1] <= cycle[2] <= cycle[3], cycle.groups()
    # The same, as data: the report of a reverted host keeps the power cycle (the engine reads the fact).
    cycled = entry["power_cycled"]
    assert cycled["action"] == "chassis power on" and cycled["bmc"] == f"ipmi://127.0.0.1:{bmc.port}", entry
    assert (cycled["deadline_passed"], cycled["sent_at"]) == (cycle[1], cycle[2]) and cycled["answered_at"] >= cycle[2]
    assert BMC_PASSWORD not in json.dumps(report)
    assert report["hosts"][B]["status"] == "not reached", report["hosts"][B]
    assert lab.hosts[B].hashes() == original[B]["hashes"], "the next batch was touched"
    waited = time.monotonic() - killed["at"]
    timing(f"bmc-power-on: A powered on through its BMC and reverted, apply done {waited:.0f} s after the kill")
    assert host_a.cmdline() == original[A]["cmdline"]
