"""Gathering: run gather.sh on a host through a transport and keep what it sends as a snapshot.

The only module of the facts package that uses a transport.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib import resources
from pathlib import Path

from gpuhost.facts.snapshot import GatherFormatError, MemoryTree, SnapshotTree, new_meta, unpack_gathered, write_meta
from gpuhost.transport import Transport, TransportError

GATHER_TIMEOUT_S = 180.0


def gather_script() -> bytes:
    return resources.files("gpuhost.facts").joinpath("gather.sh").read_bytes()


def gather_archive(transport: Transport, timeout: float = GATHER_TIMEOUT_S) -> bytes:
    """One command on the host: the script goes in on stdin, the tar.gz comes back on stdout."""
    result = transport.run(["sh", "-s"], stdin=gather_script(), timeout=timeout)
    if result.exit_status != 0 or not result.stdout:
        detail = result.stderr.decode(errors="replace").strip().splitlines()
        raise TransportError(
            "command",
            f"{transport.description}: the read-only gather script failed (exit {result.exit_status}"
            # paramiko's -1: no exit status came, the session closed under the script or a signal ended it
            + (
                ": it ended without an exit status, the connection closed or a signal killed it)"
                if result.exit_status == -1
                else ")"
            )
            + (f": {detail[-1]}" if detail else ""),
        )
    return result.stdout


def capture(transport: Transport, destination: Path, host: str) -> SnapshotTree:
    """Gather into `destination` (which must not exist yet) and write snapshot.json there.

    The tree is unpacked beside it first and renamed into place, so a failed capture never
    leaves a half-written snapshot behind.
    """
    archive = gather_archive(transport)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        unpack_gathered(archive, staging)
        write_meta(staging, new_meta(host, transport.description))
        staging.rename(destination)
    except (GatherFormatError, OSError):
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return SnapshotTree(destination)


def gather_tree(transport: Transport) -> MemoryTree:
    """Gather for an audit: the host's tree held in memory, nothing written to disk."""
    return MemoryTree.from_archive(gather_archive(transport))
