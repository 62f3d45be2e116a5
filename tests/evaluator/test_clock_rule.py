"""The clock rule (evaluator/clock.py) as pure logic: progress is held to the processing clock + tolerance."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evaluator.clock import bounded_progress


@given(st.dictionaries(st.integers(0, 15), st.integers(0, 10**13)), st.integers(0, 10**13), st.integers(0, 10_000))
def test_progress_never_passes_the_clock_and_behind_it_is_untouched(progress, now, tolerance) -> None:
    bounded, ahead = bounded_progress(progress, now, tolerance)
    assert bounded.keys() == progress.keys()
    for p, ts in progress.items():
        assert bounded[p] == min(ts, now + tolerance)
        assert (p in ahead) == (ts > now + tolerance)
        if p in ahead:
            assert ahead[p] == ts - now > tolerance
