"""Shared pytest fixtures.

SSH fixtures (prefix `sshd_`): real OpenSSH servers on 127.0.0.1 from tests/sshd.py, each with
a throwaway host key and client key under the test's tmp_path, stopped by PID at teardown.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sshd import Sshd, start_sshd

from gpuhost.problems import Problem

SshdFactory = Callable[[str], Sshd]


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


# --- Every registered problem code is produced by some test (tests/test_problem_codes.py) ---
# Every Problem built during the session is recorded here, whatever builds it (checks, planner,
# render, verify, smoke-test); the test that reads this runs last.
PRODUCED_CODES: set[str] = set()
PRODUCED_CODES_FILE_ENV = "GPUHOST_PRODUCED_CODES_FILE"  # where a child session writes its codes
CODES_TEST_MODULE = "test_problem_codes.py"

_build_problem = Problem.__post_init__


def _record_problem(problem: Problem) -> None:
    _build_problem(problem)  # validates the code first: an unregistered code is never recorded
    PRODUCED_CODES.add(problem.code)


Problem.__post_init__ = _record_problem  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The code-coverage test runs after every other test, and knows whether the whole suite ran."""
    last = [item for item in items if item.path.name == CODES_TEST_MODULE]
    items[:] = [item for item in items if item.path.name != CODES_TEST_MODULE] + last
    suite = {path.name for path in Path(__file__).parent.glob("test_*.py")}
    collected = {item.path.name for item in items if item.path.parent == Path(__file__).parent}
    config.stash[WHOLE_SUITE] = collected == suite and not config.option.keyword and not config.option.deselect


WHOLE_SUITE = pytest.StashKey[bool]()


@pytest.fixture
def produced_codes(request: pytest.FixtureRequest) -> tuple[frozenset[str], bool]:
    """The codes of every Problem built so far this session, and whether the whole fast suite ran."""
    return frozenset(PRODUCED_CODES), request.config.stash.get(WHOLE_SUITE, False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(PRODUCED_CODES_FILE_ENV)
    if target:
        Path(target).write_text("\n".join(sorted(PRODUCED_CODES)) + "\n")
