"""The lab modules rely on pytest-xdist's loadgroup keeping each xdist_group on one worker.

If a pytest or xdist upgrade breaks that again (xdist 3.8 under pytest 9.1+ silently ignored every
group, and each fault test booted its own pair of lab hosts on whatever worker it landed on), this
fails in every run with workers, instead of CI quietly taking hours.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.xdist_group("xdist-group-check")


def test_a_grouped_test_carries_its_group_on_a_worker(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # One process (-n 0): every test shares the process, so the groups hold trivially.
        assert request.config.getoption("dist", "no") == "no"
        return
    assert request.config.option.loadgroup, "the lab modules need --dist loadgroup (pyproject's addopts)"
    assert request.node.nodeid.endswith("@xdist-group-check"), (
        f"xdist did not record this test's group ({request.node.nodeid}): the lab modules would be spread "
        "over every worker. Check the pytest and pytest-xdist versions (pyproject's test extra)."
    )
