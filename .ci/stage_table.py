"""Print CI's stage table: setup, lint, the tests' wall time, and each test module's share.

Reads the stage file .ci/run writes (`NAME EPOCH-SECONDS` per finished stage, `start` first) and the
per-module timings tests/conftest.py writes (GPUHOST_TEST_TIMINGS): each lab module gets its
wall-clock span (the two lab groups overlap: they run side by side) and its outcome; the fast modules
are summed. Where CI re-ran failed lab modules (.ci/flake.py), a third file holds the re-run's
timings: each such module is reported FLAKY (failed, then passed) or FAILED (failed both times).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROTATION_FILE = Path(__file__).resolve().parents[1] / "tests" / "lab" / "rotation.py"


def _rotation() -> ModuleType:
    """tests/lab/rotation.py, loaded by path: which module of the extended lab set this commit ran."""
    spec = importlib.util.spec_from_file_location("gpuhost_lab_rotation", ROTATION_FILE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _read(path: str | None) -> dict[str, dict[str, Any]]:
    if not path:
        return {}
    try:
        loaded: dict[str, dict[str, Any]] = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return loaded


def outcome(span: dict[str, Any]) -> str:
    counts = [f"{span.get(key, 0)} {key}" for key in ("failed", "passed", "skipped") if span.get(key, 0)]
    return ", ".join(counts) or "no test ran"


def rerun_verdict(first: dict[str, Any], again: dict[str, Any] | None) -> str:
    """How a module that failed in the first run came out of its re-run."""
    if again is None:
        return "FAILED (not re-run)"
    if again.get("failed", 0) or not again.get("passed", 0):
        return f"FAILED twice (re-run: {outcome(again)})"
    return f"FLAKY: failed ({', '.join(first.get('failures', [])) or outcome(first)}), then passed on its re-run"


def flaky_modules(first: dict[str, dict[str, Any]], again: dict[str, dict[str, Any]]) -> list[str]:
    return [
        m for m, span in first.items() if span.get("failed") and rerun_verdict(span, again.get(m)).startswith("FLAKY")
    ]


def main(stage_file: str, timings_file: str, rerun_file: str | None = None) -> None:
    marks = [line.split() for line in Path(stage_file).read_text().splitlines() if line.strip()]
    begin = int(marks[0][1])
    rows = [("stage", "seconds", "wall clock from the start of CI", "outcome")]
    previous = begin
    for name, when in marks[1:]:
        rows.append((name, str(int(when) - previous), f"{previous - begin}-{int(when) - begin} s", ""))
        previous = int(when)
    modules = _read(timings_file)
    again = _read(rerun_file)
    lab = {name: span for name, span in modules.items() if name.startswith("tests/lab/")}
    rotation = _rotation()
    for name, span in sorted(lab.items(), key=lambda item: item[1]["start"]):
        wall = span["stop"] - span["start"]
        short = name.removeprefix("tests/lab/")
        rows.append(
            (
                f"  {short} (extended)" if short in rotation.EXTENDED else f"  {short}",
                f"{wall:.0f}",
                f"{span['start'] - begin:.0f}-{span['stop'] - begin:.0f} s",
                rerun_verdict(span, again.get(name)) if span.get("failed") else outcome(span),
            )
        )
    for name, span in sorted(again.items(), key=lambda item: item[1]["start"]):
        rows.append(
            (
                f"  re-run: {name.removeprefix('tests/lab/')}",
                f"{span['stop'] - span['start']:.0f}",
                f"{span['start'] - begin:.0f}-{span['stop'] - begin:.0f} s",
                outcome(span),
            )
        )
    rest = [span for name, span in modules.items() if name not in lab]
    if rest:
        total = sum(span["seconds"] for span in rest)
        first, last = min(span["start"] for span in rest), max(span["stop"] for span in rest)
        failed = sum(span.get("failed", 0) for span in rest)
        rows.append(
            (
                f"  the rest ({len(rest)} modules, summed)",
                f"{total:.0f}",
                f"between {first - begin:.0f} and {last - begin:.0f} s",
                f"{failed} failed" if failed else "",
            )
        )
    rows.append(("total", str(previous - begin), "", ""))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    print("\nci: stage table")
    print(f"  extended lab set: {rotation.current().why}")
    for row in rows:
        print(f"  {row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}".rstrip())
    for name in flaky_modules(modules, again):
        print(f"ci: FLAKY: {name} failed, then passed on its re-run: {', '.join(modules[name].get('failures', []))}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
