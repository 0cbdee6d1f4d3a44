"""The spread of a timed result's repetitions: how fast it can go, and how steady it is.

Capability and stability are judged apart. A median lands on the slow half when a run
is fast for four repetitions and slow for six (seen on the H100 guest: d2h 4.87 ms four times, then
6.3-9.8 ms), which turned a healthy GPU's verdict to WARN in half the runs. So:

- the **capability** figure is the 75th percentile of the per-repetition figures towards the good
  end (the fast quarter's edge): one or two slow repetitions cannot lower it, and one lucky
  repetition cannot raise it; a result that is low in every repetition stays low;
- the **stability** figure is the width of the middle 80% of the repetitions (10th to 90th
  percentile) over the median, in percent;
- repetitions falling into two groups with a clear gap between them (each holding at least a fifth
  of them), or a stability figure over `WIDE_PCT`, make the result **unstable**, said in its own
  line, apart from the capability verdict.

Per-repetition figures come from the suite's samples (milliseconds per repetition): a rate
(GB/s, TFLOP/s, a speed-up) is `value * median_ms / sample_ms`, a latency (us) is
`value * sample_ms / median_ms`, since the suite computes `value` from the median of the same
samples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# Percentile of the per-repetition figures, towards the good end, that capability is judged on.
CAPABILITY_PERCENTILE = 75
# The 10th-90th percentile width over the median above which a result is called unstable. The
# H100 guest's ten healthy runs: copies and kernels under 1%, pinned copies under 10% but once 36%
# (h2d ramping 33 -> 54 GB/s), cuBLAS up to 16% (a slow first repetition); launch latency, a few
# microseconds, jitters by up to 77% there (one slow batch of eleven) and has its own allowance.
WIDE_PCT = 20.0
WIDE_PCT_LATENCY = 100.0
# Two groups: the largest gap between neighbouring sorted figures is at least this share of the
# median, and at least three times the widest spread inside either group.
GAP_FRACTION = 0.10
MIN_GROUP_SHARE = 0.2
MIN_SAMPLES = 5  # fewer repetitions than this are reported, not called unstable


@dataclass(frozen=True)
class Group:
    count: int
    low: float
    high: float


@dataclass(frozen=True)
class Spread:
    """The repetitions of one result, in the result's own unit."""

    unit: str
    lower_is_better: bool
    samples: int
    worst: float  # the slowest repetition (lowest rate, highest latency)
    median: float
    best: float  # the fastest repetition
    capability: float  # CAPABILITY_PERCENTILE towards the good end: what verdicts judge
    stability_pct: float  # 10th-90th percentile width over the median, %
    groups: tuple[Group, ...]  # two when the repetitions split into a fast and a slow group

    @property
    def bimodal(self) -> bool:
        return len(self.groups) == 2

    @property
    def wide(self) -> bool:
        limit = WIDE_PCT_LATENCY if self.lower_is_better else WIDE_PCT
        return self.samples >= MIN_SAMPLES and self.stability_pct > limit

    @property
    def unstable(self) -> bool:
        return self.bimodal or self.wide

    def describe_instability(self) -> str:
        """'unstable: 4 of 10 samples at 55 GB/s, 6 at 27-38 GB/s' (empty when steady)."""
        if self.bimodal:
            fast, slow = self.groups
            return (
                f"unstable: {fast.count} of {self.samples} samples at {_range(fast, self.unit)}, "
                f"{slow.count} at {_range(slow, self.unit)}"
            )
        if self.wide:
            low, high = sorted((self.worst, self.best))
            return (
                f"unstable: samples from {_number(low)} to {_number(high)} {self.unit} "
                f"(median {_number(self.median)}; the middle 80% spans {self.stability_pct:.0f}% of the median)"
            )
        return ""


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _range(group: Group, unit: str) -> str:
    low, high = _number(group.low), _number(group.high)
    return f"{low} {unit}" if low == high else f"{low}-{high} {unit}"


def percentile(values: list[float], percent: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), for 0 <= percent <= 100."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * min(max(percent, 0.0), 100.0) / 100.0
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _groups(figures: list[float], median: float, lower_is_better: bool) -> tuple[Group, ...]:
    ordered = sorted(figures)
    count = len(ordered)
    if count < MIN_SAMPLES or median <= 0:
        return ()
    gaps = [(ordered[i + 1] - ordered[i], i) for i in range(count - 1)]
    gap, at = max(gaps)
    low, high = ordered[: at + 1], ordered[at + 1 :]
    if min(len(low), len(high)) < max(2, MIN_GROUP_SHARE * count):
        return ()
    inner = max(low[-1] - low[0], high[-1] - high[0])
    if gap < GAP_FRACTION * median or gap < 3 * inner:
        return ()
    slow, fast = (high, low) if lower_is_better else (low, high)
    return (Group(len(fast), fast[0], fast[-1]), Group(len(slow), slow[0], slow[-1]))


def figures_of(value: float, median_ms: float, samples_ms: tuple[float, ...], lower_is_better: bool) -> list[float]:
    """Each repetition's figure in the result's unit (see the module's docstring)."""
    if lower_is_better:
        return [value * sample / median_ms for sample in samples_ms]
    return [value * median_ms / sample for sample in samples_ms if sample > 0]


def spread_of(figures: list[float], unit: str, lower_is_better: bool) -> Spread | None:
    """The spread of per-repetition figures; None when there are none."""
    figures = [f for f in figures if f == f]  # drop NaN
    if not figures:
        return None
    median = statistics.median(figures)
    good_end = 100 - CAPABILITY_PERCENTILE if lower_is_better else CAPABILITY_PERCENTILE
    width = percentile(figures, 90) - percentile(figures, 10)
    return Spread(
        unit=unit,
        lower_is_better=lower_is_better,
        samples=len(figures),
        worst=max(figures) if lower_is_better else min(figures),
        median=median,
        best=min(figures) if lower_is_better else max(figures),
        capability=percentile(figures, good_end),
        stability_pct=100.0 * width / median if median > 0 else 0.0,
        groups=_groups(figures, median, lower_is_better),
    )
