"""Shared pytest fixtures.

SSH fixtures (prefix `sshd_`): real OpenSSH servers on 127.0.0.1 from tests/sshd.py, each with
a throwaway host key and client key under the test's tmp_path, stopped by PID at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sshd import Sshd, start_sshd

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
