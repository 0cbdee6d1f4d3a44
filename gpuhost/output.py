"""The one way a verb writes a file the user named (-o, --json FILE): whole or not at all.

The content goes to a temporary file in the target's directory and is renamed over the target,
so a full disk or an interrupt never leaves a half-written file, and an existing file is replaced
only by a complete one. Every failure is an InputError that names the path and the fix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from gpuhost.errors import InputError


def write_output(path: str | Path, content: str | bytes, option: str) -> None:
    """Write `content` to `path` atomically. `option` names where the path came from ('-o'); give
    the path as typed (a str): Path() drops a trailing '/', and 'out/' would become a file 'out'."""
    data = content.encode("utf-8") if isinstance(content, str) else content
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
    temporary: str | None = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
        with os.fdopen(handle, "wb") as stream:
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
