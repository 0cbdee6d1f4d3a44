"""Xid events and PCIe replays (issue 14), parsed from real NVRM kernel-log lines (tests/fixtures/xid)."""

from __future__ import annotations

from gpuhost.bench.health import Health, XidEvent, judge_health, lines_since, parse_xid_lines
from gpuhost.bench.rules import Status
from tests.helpers import FIXTURES

XID_LOG = (FIXTURES / "xid" / "kernel-log-xid.txt").read_text()
H100_DMESG = (FIXTURES / "h100-smoke" / "issue14" / "run2" / "dmesg.txt").read_text()


def test_xid_lines_of_current_and_older_drivers_are_parsed() -> None:
    events = parse_xid_lines(XID_LOG)
    assert [(e.address, e.code) for e in events] == [
        ("0000:cb:00", 13),
        ("0000:cb:00", 109),
        ("0000:08:00", 31),
        ("0000:2b:00", 79),
        ("0000:dc:00", 45),
        ("0000:9b:00", 94),
        ("0000:01:00", 3),
    ]
    assert events[3].detail == "GPU has fallen off the bus."
    assert events[5].detail == "pid=1234, name=python3, Contained ECC error"


def test_the_h100_guests_kernel_log_has_nvrm_lines_but_no_xid() -> None:
    assert "NVRM:" in H100_DMESG
    assert parse_xid_lines(H100_DMESG) == ()


def test_only_lines_logged_during_the_run_count() -> None:
    lines = XID_LOG.splitlines()
    before = "\n".join(lines[:5])  # up to the GPU line of the Xid 79 report
    assert [e.code for e in parse_xid_lines(lines_since(before, XID_LOG))] == [79, 45, 94, 3]
    assert lines_since(XID_LOG, XID_LOG) == ""


def test_each_xid_is_a_finding_with_its_meaning_and_what_to_check() -> None:
    events = parse_xid_lines(XID_LOG)
    findings = judge_health(Health(events, True, (0,), (0,)))
    by_check = {f.check: f for f in findings}
    assert by_check["xid 79"].status is Status.FAIL
    assert "GPU has fallen off the bus" in by_check["xid 79"].detail and "riser" in by_check["xid 79"].detail
    assert by_check["xid 94"].status is Status.FAIL and "contained ECC error" in by_check["xid 94"].detail
    assert by_check["xid 13"].status is Status.WARN and "dcgmi diag" in by_check["xid 13"].detail
    assert by_check["xid 109"].status is Status.WARN and "Xid catalog" in by_check["xid 109"].detail
    assert by_check["pcie replays"].status is Status.PASS


def test_replay_counter_growth_is_a_warning_and_a_quiet_log_passes() -> None:
    (log, replays) = judge_health(Health((), True, (0,), (12,)))
    assert log.status is Status.PASS
    assert replays.status is Status.WARN and replays.gpu == 0
    assert "grew by 12 during the run (0 -> 12)" in replays.detail
    # An unreadable log is said; a counter NVML cannot read gives no finding.
    (unreadable,) = judge_health(Health((), False, (None,), (None,)))
    assert unreadable.status is Status.INFO
    assert judge_health(None) == []
    assert XidEvent("0000:01:00", 48, "").meaning.status is Status.FAIL
