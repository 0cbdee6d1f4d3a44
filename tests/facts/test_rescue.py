"""What can reset a host whose boot hangs: the rescue facts and findings, on real captures
(tests/fixtures/rescue/README.md says how each was taken)."""

from __future__ import annotations

import math

import pytest

from gpuhost.checks import AuditPolicy, run_checks
from gpuhost.checks.rescue import RESCUE_NONE, RESCUE_STALLS, RESCUE_UNKNOWN, RESCUE_WATCHDOG
from gpuhost.facts.build import build_facts
from gpuhost.facts.rescue import parse_systemd_watchdogs, parse_time_span, parse_watchdog_names
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.selection import GpuSelector
from tests.helpers import FIXTURES, snapshot_facts

RESCUE = FIXTURES / "rescue"


def _findings(facts, code):
    _, _, findings = run_checks("h", facts, AuditPolicy(gpus=GpuSelector(select_all_nvidia=True)))
    return [f for f in findings if f.code == code]


def test_the_q35_host_has_two_watchdogs_and_a_bmc():
    facts = build_facts(SnapshotTree(RESCUE / "q35-watchdogs-ipmi"))
    rescue = facts.rescue
    assert rescue is not None
    assert [(w.name, w.identity, w.timeout_s, w.active, w.nowayout) for w in rescue.watchdogs] == [
        ("watchdog0", "iTCO_wdt", 30, False, False),
        ("watchdog1", "i6300ESB timer", 30, False, False),
    ]
    assert rescue.ipmi_device == "/dev/ipmi0"
    kernel = rescue.kernel
    assert (kernel.panic_s, kernel.panic_on_oops, kernel.stalls_that_panic()) == (10, False, ())
    # What a trial changes for its boot and puts back once verified (gpuhost.plan.rescue).
    assert (kernel.hung_task_timeout_s, kernel.watchdog_thresh_s) == (120, 10)
    # Debian 12's system.conf leaves both commented out: systemd's defaults.
    assert (rescue.systemd_runtime_watchdog_s, rescue.systemd_reboot_watchdog_s) == (0.0, 600.0)
    [found] = _findings(facts, RESCUE_WATCHDOG)
    assert "watchdog0 (iTCO_wdt, 30 s)" in found.message and "/dev/ipmi0" in found.message
    assert "RuntimeWatchdogSec off" in found.message
    [stalls] = _findings(facts, RESCUE_STALLS)
    assert "a panic reboots after 10 s" in stalls.message and "stalls that panic: none" in stalls.message
    assert "softlockup_panic, hung_task_panic, hardlockup_panic" in stalls.message
    assert not _findings(facts, RESCUE_NONE)
    data = rescue.to_json()
    assert data["watchdogs"][1]["identity"] == "i6300ESB timer" and data["ipmi_device"] == "/dev/ipmi0"


def test_a_host_with_no_watchdog_and_no_bmc_is_warned():
    facts = build_facts(SnapshotTree(RESCUE / "dev-vm-none"))
    assert facts.rescue is not None and facts.rescue.watchdogs == () and facts.rescue.ipmi_device is None
    assert facts.rescue.systemd_runtime_watchdog_s is None  # no systemd configuration on that machine
    [none] = _findings(facts, RESCUE_NONE)
    assert none.severity.value == "warning" and "power-cycles" in none.message and "iTCO_wdt" in none.remedy
    assert not _findings(facts, RESCUE_WATCHDOG)


def test_a_snapshot_from_before_the_rescue_facts_says_unknown_never_none():
    facts = snapshot_facts("dev-vm")
    assert facts.rescue is None
    assert _findings(facts, RESCUE_UNKNOWN) and not _findings(facts, RESCUE_NONE)


def test_watchdog_names_are_the_class_devices_in_number_order():
    assert parse_watchdog_names("watchdog10\nwatchdog1\nwatchdog0\n") == ("watchdog0", "watchdog1", "watchdog10")
    assert parse_watchdog_names("") == ()
    # Only ASCII digits: a look-alike is not a device name.
    assert parse_watchdog_names("watchdog\u0661\n") == ()


@pytest.mark.parametrize(
    ("text", "seconds"),
    # systemd.time(7)'s own examples of time spans, and the values system.conf documents.
    [("2 h", 7200), ("2hours", 7200), ("48hr", 172800), ("55s500ms", 55.5), ("10min", 600), ("off", 0), ("30s", 30)],
)
def test_time_spans_read_as_systemd_reads_them(text, seconds):
    assert parse_time_span(text) == pytest.approx(seconds)


def test_time_span_edge_cases():
    assert parse_time_span("infinity") == math.inf
    assert parse_time_span("10 parsecs") is None and parse_time_span("") is None


def test_a_later_drop_in_wins_and_a_bad_value_keeps_the_default():
    debian = (RESCUE / "q35-watchdogs-ipmi/etc/systemd/system.conf").read_text()
    assert parse_systemd_watchdogs([debian]) == {"RuntimeWatchdogSec": 0.0, "RebootWatchdogSec": 600.0}
    later = parse_systemd_watchdogs(
        [debian, "[Manager]\nRuntimeWatchdogSec=30s\n", "[Manager]\nRuntimeWatchdogSec=1min\n"]
    )
    assert later["RuntimeWatchdogSec"] == 60.0
    assert parse_systemd_watchdogs(["[Manager]\nRuntimeWatchdogSec=soon\n"])["RuntimeWatchdogSec"] == 0.0
    # Only the [Manager] section counts.
    assert parse_systemd_watchdogs(["[Other]\nRuntimeWatchdogSec=30s\n"])["RuntimeWatchdogSec"] == 0.0


def test_the_rescue_facts_reach_json_and_prometheus(tmp_path, capsys):
    import json
    import shutil

    from gpuhost.cli.main import main
    from tests.test_metrics import samples, value

    snapshot = tmp_path / "q35"
    shutil.copytree(RESCUE / "q35-watchdogs-ipmi", snapshot)
    metrics = tmp_path / "audit.prom"
    main(["audit", "--json", "--from-snapshot", str(snapshot), "--prometheus", str(metrics)])
    [report] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [w["name"] for w in report["system"]["rescue"]["watchdogs"]] == ["watchdog0", "watchdog1"]
    found = samples(metrics.read_text())
    host = report["host"]
    assert value(found, "gpuhost_audit_rescue_watchdogs", host=host) == 2
    assert value(found, "gpuhost_audit_rescue_bmc", host=host) == 1
