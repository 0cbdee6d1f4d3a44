"""Shared pytest fixtures.

SSH fixtures (prefix `sshd_`): real OpenSSH servers on 127.0.0.1 from tests/sshd.py, each with
a throwaway host key and client key under the test's tmp_path, stopped by PID at teardown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import rotation
from sshd import Sshd, start_sshd

from gpuhost.problems import Problem

# .ci/run sets this to a file and prints its stage table from it: per test module, when its first
# test started and its last one ended (wall clock), the time its tests took in all, how many
# passed, failed and were skipped, and the failed tests' ids (what .ci/run re-runs once, and
# reports as flaky where the re-run passes).
TIMINGS_ENV = "GPUHOST_TEST_TIMINGS"
_module_spans: dict[str, list[float]] = {}
_module_outcomes: dict[str, dict[str, int]] = {}
_module_failures: dict[str, list[str]] = {}

SshdFactory = Callable[[str], Sshd]


def pytest_report_header() -> str:
    return f"extended lab set: {rotation.current().why}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist this runs in the workers and again in the controller (with the workers'
    # reports); only the controller, which sees every module, records.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    module = report.nodeid.split("::", 1)[0]
    span = _module_spans.setdefault(module, [report.start, report.stop, 0.0])
    span[0], span[1], span[2] = min(span[0], report.start), max(span[1], report.stop), span[2] + report.duration
    outcomes = _module_outcomes.setdefault(module, {"passed": 0, "failed": 0, "skipped": 0})
    # A test fails in any phase (setup, call or teardown: a lab fixture's boot fails in setup); it
    # passed only in its call phase; a skip is reported in setup (or call, for pytest.skip inside).
    if report.failed:
        outcomes["failed"] += 1
        _module_failures.setdefault(module, []).append(report.nodeid.split("@", 1)[0])
    elif report.skipped:
        outcomes["skipped"] += 1
    elif report.when == "call":
        outcomes["passed"] += 1


@pytest.fixture
def sshd_factory(tmp_path: Path) -> Iterator[SshdFactory]:
    """Start as many sshd instances as a test needs (`factory("name")`); all stop at teardown."""
    servers: list[Sshd] = []

    def start(name: str) -> Sshd:
        server = start_sshd(tmp_path / "sshd", name=name)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def sshd_server(sshd_factory: SshdFactory) -> Sshd:
    """One running sshd: `.port`, `.client_key`, `.target` (root@127.0.0.1:PORT), `.connections()`."""
    return sshd_factory("sshd")


@pytest.fixture
def sshd_known_hosts(sshd_server: Sshd, tmp_path: Path) -> Path:
    """A known_hosts file holding sshd_server's real host key for [127.0.0.1]:PORT."""
    return sshd_server.write_known_hosts(tmp_path / "known_hosts")


@pytest.fixture
def sshd_wrong_known_hosts(sshd_server: Sshd, tmp_path: Path) -> Path:
    """A known_hosts file claiming a different key for sshd_server (a 'changed host key')."""
    return sshd_server.write_wrong_known_hosts(tmp_path / "known_hosts.wrong")


# --- Every registered problem code is produced by some test ---
# Every Problem built during the session is recorded, whatever builds it (checks, planner, render,
# verify, smoke-test). Under pytest-xdist each worker records its own and hands them to the
# controller when it stops; the controller (or the single process) checks the union at the end of
# a run of the whole fast suite, and fails the session, naming each code no test produced.
PRODUCED_CODES: set[str] = set()
PRODUCED_CODES_FILE_ENV = "GPUHOST_PRODUCED_CODES_FILE"  # where a session writes its codes, if set
_WORKER_CODES_KEY = "gpuhost_problem_codes"
_build_problem = Problem.__post_init__


def _record_problem(problem: Problem) -> None:
    _build_problem(problem)  # validates the code first: an unregistered code is never recorded
    PRODUCED_CODES.add(problem.code)


Problem.__post_init__ = _record_problem  # type: ignore[method-assign]


def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist: a worker stopped; keep the codes its tests produced."""
    PRODUCED_CODES.update(getattr(node, "workeroutput", {}).get(_WORKER_CODES_KEY, ()))


def _whole_fast_suite_ran(session: pytest.Session) -> bool:
    """Every fast test module (tests/test_*.py, tests/*/test_*.py but the lab's tests/lab/) reported, and no
    -k or --deselect narrowed one down."""
    tests = Path(__file__).parent
    paths = [*tests.glob("test_*.py"), *(path for path in tests.glob("*/test_*.py") if path.parent.name != "lab")]
    modules = {f"tests/{path.relative_to(tests).as_posix()}" for path in paths}
    option = session.config.option
    return modules <= set(_module_spans) and not option.keyword and not option.deselect and session.testsfailed == 0


def pytest_sessionfinish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        session.config.workeroutput[_WORKER_CODES_KEY] = sorted(PRODUCED_CODES)  # type: ignore[attr-defined]
        return
    target = os.environ.get(TIMINGS_ENV)
    if target and _module_spans:
        spans = {
            module: {
                "start": a,
                "stop": b,
                "seconds": total,
                **_module_outcomes.get(module, {}),
                "failures": _module_failures.get(module, []),
            }
            for module, (a, b, total) in _module_spans.items()
        }
        Path(target).write_text(json.dumps(spans, indent=1, sort_keys=True) + "\n")
    codes_file = os.environ.get(PRODUCED_CODES_FILE_ENV)
    if codes_file:
        Path(codes_file).write_text("\n".join(sorted(PRODUCED_CODES)) + "\n")
    if _whole_fast_suite_ran(session):
        from test_problem_codes import unproduced

        missing = unproduced(PRODUCED_CODES)
        session.config.stash[_UNPRODUCED] = missing
        if missing:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_UNPRODUCED = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    missing = config.stash.get(_UNPRODUCED, None)
    if missing is None:
        return  # not a run of the whole fast suite: the check needs every module's problems
    if missing:
        terminalreporter.section("problem codes produced by no test", red=True)
        terminalreporter.write_line(
            f"FAILED: {len(missing)} registered problem code(s) are produced by no test: {', '.join(missing)}. "
            "Add a case (tests/fixtures/audit-cases/ for the audit and the planner) that produces each."
        )
    else:
        terminalreporter.write_line("problem codes: every registered code was produced by a test")
