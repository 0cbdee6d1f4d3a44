"""The snapshot directory: a mirror of the host's files that the audit reads, plus commands/.

Layout (fixed; tests and users rely on it):
  DIR/proc/cmdline, DIR/sys/bus/pci/devices/0000:41:00.0/class, ...   files as read on the host
  DIR/sys/bus/pci/devices/0000:41:00.0/driver                          a symlink, or a file naming its target
  DIR/sys/kernel/iommu_groups/13/devices/0000:41:00.0                  a symlink, or a file naming the device
  DIR/commands/NAME.txt                                                output of each command run
  DIR/commands/status.txt                                              'NAME EXIT-STATUS' per command
  DIR/snapshot.json                                                    host, time, gpuhost version

Everything is read through `SnapshotTree`, which never follows a path out of the directory: a
snapshot can come from a host we do not trust.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from gpuhost import __version__
from gpuhost.errors import InputError

SNAPSHOT_META = "snapshot.json"
SNAPSHOT_FORMAT = "gpuhost.snapshot/1"
# A gathered tree is a few hundred KiB; refuse anything absurd from a hostile host.
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class SnapshotMeta:
    host: str
    taken_at: str
    gpuhost_version: str
    source: str  # local, ssh://user@host:port, or where the snapshot came from

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": SNAPSHOT_FORMAT,
                "host": self.host,
                "taken_at": self.taken_at,
                "gpuhost_version": self.gpuhost_version,
                "source": self.source,
            },
            indent=2,
        )


def new_meta(host: str, source: str) -> SnapshotMeta:
    return SnapshotMeta(
        host=host,
        taken_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        gpuhost_version=__version__,
        source=source,
    )


class Tree:
    """Read-only access to a gathered tree by the host's absolute paths ('/proc/cmdline').

    Two kinds: a snapshot directory on disk, and a live host's archive held in memory.
    """

    def _read_bytes(self, host_path: str) -> bytes | None:
        raise NotImplementedError

    def link(self, host_path: str) -> str | None:
        """The target of a symlink on the host, recorded as a file naming it."""
        text = self.read(host_path)
        return None if text is None else text.strip() or None

    def list(self, host_path: str) -> list[str]:
        """Names in a captured directory, sorted; [] when it was not captured."""
        raise NotImplementedError

    def has_entry(self, host_path: str) -> bool:
        """Whether anything at all was captured at the path (a file, a directory, a link, a FIFO),
        readable or not: tells a link that is absent on the host from one recorded unreadably."""
        raise NotImplementedError

    def read(self, host_path: str) -> str | None:
        """The file's text; None when it was not captured (missing, unreadable on the host)."""
        data = self._read_bytes(host_path)
        if data is None:
            return None
        # sysfs reports 4096 bytes for every attribute; a capture made with tar (which trusts that
        # size) pads the text with NUL bytes, and no text file the audit reads contains NUL.
        return data.rstrip(b"\0").decode("utf-8", errors="replace")

    def command(self, name: str) -> str | None:
        """The output of a command the gather script ran; None when it did not run."""
        return self.read(f"/commands/{name}.txt")

    def meta(self) -> SnapshotMeta | None:
        text = self.read(f"/{SNAPSHOT_META}")
        if text is None:
            return None
        try:
            data = json.loads(text)
            return SnapshotMeta(
                host=str(data["host"]),
                taken_at=str(data["taken_at"]),
                gpuhost_version=str(data["gpuhost_version"]),
                source=str(data.get("source", "")),
            )
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested too deeply
            return None


class SnapshotTree(Tree):
    """A snapshot directory. Never follows a path out of it: a snapshot can come from anywhere."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _inside(self, host_path: str) -> Path | None:
        candidate = self.root / host_path.lstrip("/")
        try:
            resolved = candidate.resolve()
        except (OSError, RuntimeError):
            return None
        if resolved != self.root and self.root not in resolved.parents:
            return None
        return resolved

    def _read_bytes(self, host_path: str) -> bytes | None:
        path = self._inside(host_path)
        if path is None or not path.is_file():
            return None
        try:
            with path.open("rb") as handle:
                return handle.read(MAX_FILE_BYTES)
        except OSError:
            return None

    def link(self, host_path: str) -> str | None:
        """Links may also be real symlinks in a snapshot made by other means (cp -a, tar)."""
        candidate = self.root / host_path.lstrip("/")
        if candidate.is_symlink():
            return str(candidate.readlink())
        return super().link(host_path)

    def list(self, host_path: str) -> list[str]:
        candidate = self.root / host_path.lstrip("/")
        path = self._inside(host_path)
        if path is None or candidate.is_symlink() or not path.is_dir():
            return []
        return sorted(entry.name for entry in path.iterdir())

    def has_entry(self, host_path: str) -> bool:
        relative = PurePosixPath(host_path.lstrip("/"))
        if ".." in relative.parts:
            return False
        # lexists: the entry itself, never what a symlink in the snapshot points at.
        return os.path.lexists(self.root / relative)


class MemoryTree(Tree):
    """A live host's gathered archive, read in memory: nothing is written to the controller's disk."""

    def __init__(self, files: dict[str, bytes], directories: set[str]) -> None:
        self._files = files
        self._children: dict[str, set[str]] = {}
        for path in [*files, *directories]:
            parent, _, name = path.rpartition("/")
            while name:
                self._children.setdefault(parent or "/", set()).add(name)
                parent, _, name = parent.rpartition("/")

    @classmethod
    def from_archive(cls, archive: bytes) -> MemoryTree:
        files: dict[str, bytes] = {}
        directories: set[str] = set()
        for name, data in vetted_members(archive):
            if data is None:
                directories.add(f"/{name}")
            else:
                files[f"/{name}"] = data
        return cls(files, directories)

    def _read_bytes(self, host_path: str) -> bytes | None:
        return self._files.get("/" + host_path.strip("/"))

    def list(self, host_path: str) -> list[str]:
        return sorted(self._children.get("/" + host_path.strip("/") if host_path.strip("/") else "/", ()))

    def has_entry(self, host_path: str) -> bool:
        parent, _, name = ("/" + host_path.strip("/")).rpartition("/")
        return name in self._children.get(parent or "/", ())


def open_snapshot(directory: Path) -> SnapshotTree:
    """A snapshot given by the user: it must look like one, or the error says what is wrong."""
    if not directory.is_dir():
        raise InputError(f"snapshot {directory}: no such directory. Create one with `gpuhost snapshot HOST -o DIR`.")
    tree = SnapshotTree(directory)
    if tree.read("/proc/cmdline") is None and not tree.list("/sys"):
        raise InputError(
            f"snapshot {directory}: neither proc/cmdline nor sys/ is in it, so it is not a gpuhost snapshot. "
            "Create one with `gpuhost snapshot HOST -o DIR`."
        )
    return tree


def vetted_members(archive: bytes) -> Iterator[tuple[str, bytes | None]]:
    """(relative path, content) of each safe member of the gather script's tar.gz; content None
    for a directory. Links, devices and paths that would leave the tree are never yielded,
    whatever the host sent, and the sizes are capped."""
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for member in tar:
                if not (member.isfile() or member.isdir()):
                    continue
                name = os.path.normpath(member.name)
                if name == ".":
                    continue
                if name.startswith(("/", "..")) or "\0" in name:
                    raise tarfile.TarError(f"unsafe path {member.name!r}")
                if member.isdir():
                    yield name, None
                    continue
                total += member.size
                if member.size > MAX_FILE_BYTES or total > MAX_UNPACKED_BYTES:
                    raise tarfile.TarError(f"{member.name!r} makes the capture larger than allowed")
                source = tar.extractfile(member)
                yield name, b"" if source is None else source.read()
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as error:
        raise GatherFormatError(f"the captured data could not be unpacked: {error}") from error


def unpack_gathered(archive: bytes, destination: Path) -> None:
    """Write the gather script's tar.gz into `destination` as a snapshot directory.

    Members are written one by one by this function (tarfile's extraction filters need Python
    3.11.4+, and Debian 12 ships 3.11.2), and each target is checked to stay inside.
    """
    destination.mkdir(parents=True, exist_ok=True)
    root = destination.resolve()
    for name, data in vetted_members(archive):
        target = (root / name).resolve()
        if root not in target.parents:
            raise GatherFormatError(f"the captured data could not be unpacked: unsafe path {name!r}")
        try:
            if data is None:
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as error:
            # The destination was empty: a path that is both a file and a directory is the host's
            # archive contradicting itself, not a fault of the place the snapshot is written to.
            raise GatherFormatError(
                f"the captured data could not be unpacked: {name!r} clashes with another member of the archive"
            ) from error


class GatherFormatError(Exception):
    """The host's answer was not the archive the gather script writes."""


def write_meta(directory: Path, meta: SnapshotMeta) -> None:
    (directory / SNAPSHOT_META).write_text(meta.to_json() + "\n")
