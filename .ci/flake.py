"""Which failed lab modules CI runs once more, and whether there is time for it.

A lab module boots emulated hosts under QEMU on a shared 2-core machine; when one fails, CI runs
that whole module once more, alone (its tests are steps on hosts its fixtures boot, so a single
failed step cannot be re-run by itself). The stage table then reports the module as FLAKY (failed,
then passed) or FAILED (failed twice): never a silent retry. A failure outside tests/lab/ is
never re-run: the fast tests are deterministic, and one that fails is a bug.

    python .ci/flake.py TIMINGS_JSON CI_START_EPOCH   ->  the modules to re-run, one per line
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# CI's hard limit is 90 minutes (5,400 s); a re-run must end well before it, and a lab module can
# take longer alone than its first run's span when that span began on a warm cache: half again.
CI_LIMIT_SECONDS = 5400
SAFETY_SECONDS = 300
RERUN_FACTOR = 1.5


def modules_to_rerun(timings: dict[str, dict[str, object]], elapsed: float) -> tuple[list[str], str]:
    """The failed modules to run again, and why (or why not), for CI's log."""
    failed = {module: span for module, span in timings.items() if int(str(span.get("failed", 0))) > 0}
    if not failed:
        return [], "no module recorded a failure (pytest failed outside the tests: no re-run)"
    fast = sorted(module for module in failed if not module.startswith("tests/lab/"))
    if fast:
        return [], f"a fast test failed ({', '.join(fast)}): no re-run"
    needed = sum(float(str(span["stop"])) - float(str(span["start"])) for span in failed.values()) * RERUN_FACTOR
    if elapsed + needed > CI_LIMIT_SECONDS - SAFETY_SECONDS:
        return [], (
            f"no time to re-run {', '.join(sorted(failed))}: {elapsed:.0f} s spent, about {needed:.0f} s needed, "
            f"limit {CI_LIMIT_SECONDS} s"
        )
    return sorted(failed), f"re-running {', '.join(sorted(failed))} once, alone (about {needed:.0f} s)"


def main(timings_file: str, started: str) -> None:
    try:
        timings = json.loads(Path(timings_file).read_text() or "{}")
    except (OSError, ValueError):
        timings = {}
    modules, why = modules_to_rerun(timings, time.time() - int(started))
    print(f"ci: {why}", file=sys.stderr)
    # Nothing at all when nothing is re-run: an empty line would reach .ci/run as one empty
    # argument, and `pytest ""` runs every test again (it did, in CI, after a fast test failed).
    for module in modules:
        print(module)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
