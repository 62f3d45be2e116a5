"""The suite's own layout: on pytest-xdist with ``--dist loadgroup`` (infra/test), the JVM tests share one worker.

Two causes each stopped the grouping silently, and this test failed with each: ``tests/conftest.py`` marked the
tests after pytest-xdist had read the marks (its hook now runs first), and pytest 9.2 keeps node ids where
pytest-xdist 3.8 cannot add the group (pytest is held below 9.2). The JVM suites then ran two at a time on two
cores, the CI run took twice as long and timing-bound tests failed."""

from __future__ import annotations

import pytest


@pytest.mark.jvm
def test_a_jvm_test_is_in_the_jvm_group(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on pytest-xdist with --dist loadgroup: nothing is grouped")
    assert request.node.nodeid.endswith("@jvm"), request.node.nodeid
