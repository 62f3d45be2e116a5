"""The trigger-tick floor of the live latency table, against a brute-force simulation and the cases worked by hand."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.latency_floor import AHEAD_MS, tick_wait_s


def test_panes_and_trigger_of_one_second_wait_up_to_two_seconds() -> None:
    """Every boundary (a whole second) is decided at the tick a second after it; an event waits its pane's rest
    (0-1 s) and that second: uniform over 1-2 s."""
    assert math.isclose(tick_wait_s(1_000, 500, 200, 1_000, 50), 1.5, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 500, 200, 1_000, 99), 1.99, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 500, 200, 1_000, 100), 2.0, abs_tol=0.002)


def test_a_delay_of_a_whole_interval_races_the_tick() -> None:
    """With an allowed delay of 1 s the boundary ``b`` is decidable exactly at the tick ``b + 1 s``: a feed lagging
    behind the batch's planning waits for ``b + 2 s``; the lower bound (no lag) decides it at ``b + 1 s``. With 0.9 s
    the busy feed's lag no longer matters."""
    assert math.isclose(tick_wait_s(1_000, 1_000, 50, 1_000, 50), 2.5, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 1_000, 0, 1_000, 50), 1.5, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 900, 50, 1_000, 50), 1.5, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 900, 50, 1_000, 99), 1.99, abs_tol=0.002)


def test_a_lag_past_the_tick_waits_for_the_next() -> None:
    """An allowed delay of 0.9 s plus a lag of up to 0.2 s (a quiet feed's heartbeats) misses the tick a second
    after the boundary for half the lags: half the events wait 1-2 s, half 2-3 s."""
    assert math.isclose(tick_wait_s(1_000, 900, 200, 1_000, 25), 1.5, abs_tol=0.01)
    assert math.isclose(tick_wait_s(1_000, 900, 200, 1_000, 75), 2.5, abs_tol=0.01)
    assert tick_wait_s(1_000, 900, 200, 1_000, 100) > 2.99


def test_a_trigger_of_zero_waits_for_no_tick() -> None:
    """Batches back to back: the wait is the pane's rest and the delay, the batch under way aside."""
    assert math.isclose(tick_wait_s(250, 500, 0, 0, 99), 0.25 * 0.99 + 0.5, abs_tol=0.002)


@settings(max_examples=40, deadline=None)
@given(pane=st.sampled_from([100, 250, 500, 1_000, 2_000]), delay=st.integers(0, 2_000),
       lag=st.integers(0, 1_000), trigger=st.sampled_from([500, 1_000, 2_000]), q=st.sampled_from([50, 95, 99]))
def test_the_grid_answers_as_a_simulation_does(pane: int, delay: int, lag: int, trigger: int, q: int) -> None:
    rng = np.random.default_rng(pane + delay + lag + trigger + q)
    t = rng.uniform(0, 1_000 * math.lcm(pane, trigger), 200_000)
    decidable = np.ceil(t / pane) * pane + delay + rng.uniform(0, lag, t.size) - AHEAD_MS
    simulated = (np.ceil(decidable / trigger) * trigger - t) / 1000
    wait = tick_wait_s(pane, delay, lag, trigger, q)
    # compared as shares of the simulated waits, not as seconds: the waits' distribution has gaps where a quantile jumps
    assert np.mean(simulated <= wait + 0.002) >= q / 100 - 0.01
    assert np.mean(simulated < wait - 0.002) <= q / 100 + 0.01
