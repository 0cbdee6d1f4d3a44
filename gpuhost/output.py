"""The one way a verb writes a file the user named (-o, --json FILE, --prometheus FILE): whole or not at all.

The content goes to a temporary file in the target's directory and is renamed over the target,
so a full disk or an interrupt never leaves a half-written file, and an existing file is replaced
only by a complete one (a reader such as node_exporter's textfile collector sees the old file or
the new one, never part of one). Every failure is an InputError that names the path and the fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from gpuhost.errors import GpuhostError, InputError

# (option, path as typed): an output or input path of one command; None where the option was not given.
NamedPath = tuple[str, str | Path | None]


def check_output_path(path: str | Path, option: str) -> None:
    """Refuse a path that write_output could not write, before any work is done for it. Give the
    path as typed (a str): Path() drops a trailing '/', and 'out/' would become a file 'out'."""
    if isinstance(path, str) and path.endswith("/") and not Path(path).is_dir():
        raise InputError(f"{option} {path}: ends with '/', so it names a directory, and there is none. Name a file.")
    target = Path(path).expanduser()
    parent = target.parent
    if not parent.is_dir():
        what = "does not exist" if not parent.exists() else "is not a directory"
        raise InputError(f"{option} {path}: the directory {parent} {what}. Create it, or choose another path.")
    if target.is_dir():
        raise InputError(f"{option} {path}: is a directory. Name a file inside it, e.g. {target / 'out'}.")
    if target.exists() and not target.is_file():
        # A device or FIFO (/dev/full, a pipe): renaming over it would replace the node itself.
        raise InputError(f"{option} {path}: is not a regular file. Name a regular file, or leave {option} out.")
    # write_output creates a temporary file beside the target: try that very step. Permission bits
    # do not tell it all (root, a read-only mount, an immutable directory).
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as error:
        raise InputError(
            f"{option} {path}: cannot create a file in {parent}: {error.strerror or error}. Fix its permissions, "
            "or choose another path."
        ) from error
    os.close(handle)
    Path(probe).unlink()


def check_outputs(outputs: Sequence[NamedPath], inputs: Sequence[NamedPath] = ()) -> None:
    """Every file one command will write, checked before it connects to or reads anything: each one
    writable (check_output_path), none of them a file the command reads (writing the report over the
    inventory, or --json over the --replay recording), none the same file as another output (one of
    the two would be lost)."""
    checked: list[tuple[str, str | Path]] = []
    for option, path in outputs:
        if path is None:
            continue
        check_output_path(path, option)
        for other_option, other in [*((o, p) for o, p in inputs if p is not None), *checked]:
            if _same_file(path, other):
                role = "is also" if (other_option, other) in checked else "is the file of"
                raise InputError(
                    f"{option} {path}: {role} {other_option} {other}; writing it would "
                    f"{'lose one of the two' if role == 'is also' else 'overwrite what this command reads'}. "
                    "Name another file."
                )
        checked.append((option, path))


def _same_file(first: str | Path, second: str | Path) -> bool:
    a, b = Path(first).expanduser(), Path(second).expanduser()
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)  # a hard link, or the same file by another mount
    except OSError:
        return False


def write_output(path: str | Path, content: str | bytes, option: str) -> None:
    """Write `content` to `path` atomically. `option` names where the path came from ('-o')."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    check_output_path(path, option)
    target = Path(path).expanduser()
    temporary: str | None = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(handle, "wb") as stream:
            # mkstemp creates 0600; the file gets the mode a plain open() would give it (or keeps the
            # one it had), so that another user's reader (node_exporter runs as 'prometheus') can read it.
            os.fchmod(stream.fileno(), _mode_for(target))
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        Path(temporary).replace(target)
        temporary = None
    except OSError as error:
        raise InputError(
            f"{option} {path}: cannot write it: {error.strerror or error}. Free space or fix permissions, "
            "or choose another path."
        ) from error
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                Path(temporary).unlink()


def _mode_for(target: Path) -> int:
    """The permission bits of the file being replaced, else 0666 less the umask (as open() creates)."""
    with contextlib.suppress(FileNotFoundError):
        return stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0o022)  # the only way to read the umask: set it, then put it back
    os.umask(umask)
    return 0o666 & ~umask


class OutputLost(GpuhostError):
    """What a verb printed did not reach its standard output (a full disk, a closed pipe, a closed
    descriptor): the report is lost, so the command failed (exit 2), whatever it found."""


class _GuardedStream:
    """A text stream whose failed write or flush is an OutputLost naming the stream, not an OSError
    in the middle of a verb (or at exit, after the verb returned 0)."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def _lost(self, error: OSError) -> OutputLost:
        return OutputLost(f"could not write to {self._name}: {error.strerror or error}; the output is lost.")

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as error:
            raise self._lost(error) from error

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            raise self._lost(error) from error

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding ... as the stream has them
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout(stdout: TextIO | None) -> Iterator[TextIO]:
    """The standard output a verb writes to, flushed when it is done: every failed write is an
    OutputLost (exit 2). A closed one (`>&-`, which Python turns into None) is refused at once."""
    if stdout is None:
        raise OutputLost("standard output is closed: nothing could be printed. Redirect it to a file instead.")
    guarded = _GuardedStream(stdout, "standard output")
    try:
        yield guarded  # type: ignore[misc]  # a TextIO in all that the verbs use
        guarded.flush()
    except OutputLost:
        # The unwritten text stays in the stream's buffer, and the interpreter's flush at exit would
        # fail again (a second message, exit 120): what is lost is dropped instead.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        raise
