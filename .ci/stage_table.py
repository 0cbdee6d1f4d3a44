"""Print CI's stage table: setup, lint, the tests' wall time, and each test module's share.

Reads the stage file .ci/run writes (`NAME EPOCH-SECONDS` per finished stage, `start` first) and the
per-module timings tests/conftest.py writes (GPUHOST_TEST_TIMINGS). Each lab module gets its
wall-clock span (the two lab groups overlap: they run side by side); the fast modules are summed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(stage_file: str, timings_file: str) -> None:
    marks = [line.split() for line in Path(stage_file).read_text().splitlines() if line.strip()]
    begin = int(marks[0][1])
    rows = [("stage", "seconds", "wall clock from the start of CI")]
    previous = begin
    for name, when in marks[1:]:
        rows.append((name, str(int(when) - previous), f"{previous - begin}-{int(when) - begin} s"))
        previous = int(when)
    try:
        modules = json.loads(Path(timings_file).read_text() or "{}")
    except (OSError, ValueError):
        modules = {}
    lab = {name: span for name, span in modules.items() if name.startswith("tests/lab/")}
    for name, span in sorted(lab.items(), key=lambda item: item[1]["start"]):
        wall = span["stop"] - span["start"]
        rows.append(
            (
                f"  {name.removeprefix('tests/lab/')}",
                f"{wall:.0f}",
                f"{span['start'] - begin:.0f}-{span['stop'] - begin:.0f} s",
            )
        )
    rest = [span for name, span in modules.items() if name not in lab]
    if rest:
        total = sum(span["seconds"] for span in rest)
        first, last = min(span["start"] for span in rest), max(span["stop"] for span in rest)
        rows.append(
            (
                f"  the rest ({len(rest)} modules, summed)",
                f"{total:.0f}",
                f"between {first - begin:.0f} and {last - begin:.0f} s",
            )
        )
    rows.append(("total", str(previous - begin), ""))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    print("\nci: stage table")
    for row in rows:
        print(f"  {row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
