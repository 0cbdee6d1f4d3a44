"""SSH command lines for lab hosts: key-only, host key checked against the lab's known_hosts."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def ssh_argv(
    *,
    port: int,
    key: Path,
    known_hosts: Path,
    command: Sequence[str] = (),
    tty: bool = False,
    connect_timeout: int = 10,
    ssh: str = "ssh",
) -> list[str]:
    """argv of `ssh root@127.0.0.1` on `port`; `command` is quoted word by word for the remote shell."""
    argv = [
        ssh,
        "-p",
        str(port),
        "-i",
        str(key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
        "-t" if tty else "-T",
        "--",
        "root@127.0.0.1",
    ]
    if command:
        # ssh joins its arguments into one string for the remote shell: quote each word.
        argv.append(shlex.join(command))
    return argv
