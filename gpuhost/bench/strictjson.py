"""One reader for the JSON files the smoke-test takes (--replay, --baseline, --gpu-table) and for
the suite's own output: JSON as our writers produce it, nothing Python's json module also accepts.

Python's json reads NaN, Infinity and -Infinity (which no JSON writer of gpuhost produces: the suite
writes null for a value it could not measure), numbers past a float's range as inf, integers of any
size (then float() of one overflows), and raises RecursionError on deep nesting. Each of those, and
a file that is not UTF-8, is a StrictJsonError here, so a broken or hostile file is refused by name
instead of being judged (a NaN compares false with every threshold) or ending in a traceback.
"""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path
from typing import Any

from gpuhost.errors import InputError

# The largest integer any of our documents holds is a byte count or a seed: 64 bits.
MAX_DIGITS = 20
# A full run's --json is well under 1 MiB; a file past this is not one (and /dev/zero never ends).
MAX_FILE_BYTES = 64 << 20


class StrictJsonError(ValueError):
    """The text is not JSON as gpuhost writes it; the message says what and where."""


def _constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not a number JSON allows (the suite writes null for a value it lacks)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJsonError(f"the number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise StrictJsonError(f"the integer {text[:20]}... has {len(text.lstrip('-'))} digits (at most {MAX_DIGITS})")
    return int(text)


def strict_loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise StrictJsonError("it is nested too deeply") from None
    except json.JSONDecodeError as error:
        raise StrictJsonError(str(error)) from error


def read_json_file(path: Path, what: str) -> Any:
    """The document in `path`; any reason it cannot be read or is not strict JSON is an InputError
    that names `what` (e.g. 'the baseline') and the file."""
    try:
        # A device or FIFO is no recording: /dev/zero would be read until memory ran out, and
        # opening a FIFO blocks until someone writes to it. Stat first: that opens nothing.
        if not stat.S_ISREG(path.stat().st_mode):
            raise InputError(f"{what} {path} is not a regular file: pass the --json file gpuhost wrote")
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise InputError(f"cannot read {what} {path}: {error.strerror}") from error
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{what} {path} is larger than {MAX_FILE_BYTES >> 20} MiB: pass the --json file gpuhost wrote")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): "
            "pass the --json file gpuhost wrote"
        ) from None
    try:
        return strict_loads(text)
    except StrictJsonError as error:
        raise InputError(f"{what} {path} is not valid JSON: {error}") from None
