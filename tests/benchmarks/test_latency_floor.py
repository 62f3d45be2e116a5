"""The trigger-tick floor of the live latency table, against a brute-force simulation and the cases worked by hand."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.latency_floor import tick_wait_s


def test_panes_and_trigger_of_one_second_wait_up_to_two_seconds() -> None:
    """Every boundary (a whole second) is decided at the tick a second after it; an event waits its pane's rest
    (0-1 s) and that second: uniform over 1-2 s."""
    assert math.isclose(tick_wait_s(1_000, 500, 200, 1_000, 50), 1.5, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 500, 200, 1_000, 99), 1.99, abs_tol=0.002)
    assert math.isclose(tick_wait_s(1_000, 500, 200, 1_000, 100), 2.0, abs_tol=0.002)


def test_a_delay_past_the_tick_waits_for_the_next() -> None:
    """An allowed delay of 0.9 s plus heartbeats of up to 0.2 s misses the tick a second after the boundary for
    half the heartbeat phases: half the events wait 1-2 s, half 2-3 s."""
    assert math.isclose(tick_wait_s(1_000, 900, 200, 1_000, 25), 1.5, abs_tol=0.01)
    assert math.isclose(tick_wait_s(1_000, 900, 200, 1_000, 75), 2.5, abs_tol=0.01)
    assert tick_wait_s(1_000, 900, 200, 1_000, 100) > 2.99


@settings(max_examples=40, deadline=None)
@given(pane=st.sampled_from([100, 250, 500, 1_000, 2_000]), delay=st.integers(0, 2_000),
       heartbeat=st.integers(1, 1_000), trigger=st.sampled_from([500, 1_000, 2_000]), q=st.sampled_from([50, 95, 99]))
def test_the_grid_answers_as_a_simulation_does(pane: int, delay: int, heartbeat: int, trigger: int, q: int) -> None:
    rng = np.random.default_rng(pane + delay + heartbeat + trigger + q)
    t = rng.uniform(0, 1_000 * math.lcm(pane, trigger), 200_000)
    decidable = np.ceil(t / pane) * pane + delay + rng.uniform(0, heartbeat, t.size)
    simulated = (np.ceil(decidable / trigger) * trigger - t) / 1000
    wait = tick_wait_s(pane, delay, heartbeat, trigger, q)
    # compared as shares of the simulated waits, not as seconds: the waits' distribution has gaps where a quantile jumps
    assert np.mean(simulated <= wait + 0.002) >= q / 100 - 0.01
    assert np.mean(simulated < wait - 0.002) <= q / 100 + 0.01
