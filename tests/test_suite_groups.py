"""The suite's own layout: on pytest-xdist with ``--dist loadgroup`` (infra/test), the JVM tests share one worker.

pytest 9.2 changed how node ids are held and pytest-xdist 3.8's ``loadgroup`` silently stopped grouping: the JVM
suites then ran two at a time on two cores, the CI run took twice as long and timing-bound tests failed."""

from __future__ import annotations

import pytest


@pytest.mark.jvm
def test_a_jvm_test_is_in_the_jvm_group(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on pytest-xdist with --dist loadgroup: nothing is grouped")
    assert request.node.nodeid.endswith("@jvm"), request.node.nodeid
