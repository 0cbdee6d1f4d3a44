"""Shared pytest fixtures.

SSH fixtures (prefix `sshd_`): real OpenSSH servers on 127.0.0.1 from tests/sshd.py, each with
a throwaway host key and client key under the test's tmp_path, stopped by PID at teardown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sshd import Sshd, start_sshd

# .ci/run sets this to a file and prints its stage table from it: per test module, when its first
# test started and its last one ended (wall clock), and the time its tests took in all.
TIMINGS_ENV = "GPUHOST_TEST_TIMINGS"
_module_spans: dict[str, list[float]] = {}

SshdFactory = Callable[[str], Sshd]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist this runs in the workers and again in the controller (with the workers'
    # reports); only the controller, which sees every module, records.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    module = report.nodeid.split("::", 1)[0]
    span = _module_spans.setdefault(module, [report.start, report.stop, 0.0])
    span[0], span[1], span[2] = min(span[0], report.start), max(span[1], report.stop), span[2] + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(TIMINGS_ENV)
    if target and not os.environ.get("PYTEST_XDIST_WORKER") and _module_spans:
        spans = {module: {"start": a, "stop": b, "seconds": total} for module, (a, b, total) in _module_spans.items()}
        Path(target).write_text(json.dumps(spans, indent=1, sort_keys=True) + "\n")


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
