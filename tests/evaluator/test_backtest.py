"""Backtests (evaluator.backtest) against the brute-force lifecycle oracle, and against themselves cut otherwise.

History arrives as raw records, partition by partition in offset order, cut into chunks at random: a chunk is
what a live micro-batch might have read. Events within the allowed delay are never late, so every chunking
yields the oracle's transitions, with the same values.
"""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.settings import Settings
from evaluator.backtest import Backtest
from evaluator.records import RecordPanes
from evaluator.shard import ShardConfig
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from ingest.model import Event
from tests.evaluator.oracle import lifecycle_oracle
from tests.evaluator.test_lifecycle import any_condition, key_filters
from tests.evaluator.test_shard import ATTRS, DELAY, HORIZON, PANE, PARTITIONS, partition_of, streams
from tests.examples import examples

SETTINGS = Settings(pane_ms=PANE, watermark_delay_ms=DELAY, max_window_ms=HORIZON, quantile_max_window_ms=5_000)
CONFIG = ShardConfig.live(SETTINGS, ATTRS, PARTITIONS)
SUM_OVER_2S = Condition(Aggregate.SUM, "volume", 2_000, low=6.0)


def raw_chunks(events: list[tuple[str, int, float, float]], cuts: list[int]) -> list[pd.DataFrame]:
    """``events`` (in arrival order) as the raw records of their partitions, cut at ``cuts``; each chunk's clock
    its newest event time (when a live batch would have read it, at the earliest)."""
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    rows = []
    for key, ts, price, volume in events:
        p = partition_of(key)
        value = Event(key=key, ts=ts, price=price, volume=volume).to_json()
        rows.append({"topic": "trades", "partition": p, "offset": offsets[p], "value": value,
                     "value_bytes": len(value), "value_sha256": None, "ts": ts})
        offsets[p] += 1
    chunks = []
    for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        if b > a:
            frame = pd.DataFrame(rows[a:b])
            chunks.append(frame.drop(columns="ts").assign(now=int(frame["ts"].max())))
    return chunks


def backtest(spec: SubscriptionSpec, chunks: list[pd.DataFrame]) -> Backtest:
    run = Backtest(spec, CONFIG, RecordPanes(SETTINGS, (0,)), start_ms=0,
                   clock_tolerance_ms=SETTINGS.clock_tolerance_ms)
    run.run(chunks)
    return run


def seen(run: Backtest) -> set[tuple]:
    return {(t.subscription_id, t.key, t.state, t.evaluated_at, t.kind) for t in run.transitions}


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), condition=any_condition, keys=key_filters, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_a_backtest_yields_the_oracles_transitions_however_history_is_cut(stream, condition, keys, cuts) -> None:
    events, batches = stream
    spec = SubscriptionSpec(1, condition, keys)
    as_batched = backtest(spec, raw_chunks(events, [sum(len(b) for b in batches[:i]) for i in range(1, len(batches))]))
    otherwise = backtest(spec, raw_chunks(events, sorted(c for c in cuts if c < len(events))))
    assert as_batched.evaluated_at == otherwise.evaluated_at
    assert seen(as_batched) == seen(otherwise)
    assert [(t.alert_id, t.value) for t in as_batched.transitions] == [(t.alert_id, t.value) for t in otherwise.transitions]
    if as_batched.evaluated_at is not None:
        assert seen(as_batched) == lifecycle_oracle(events, [spec], as_batched.evaluated_at, PANE, HORIZON)
    assert as_batched.tally.events == len(events) and as_batched.tally.dead == 0


def test_the_chart_samples_each_keys_value_at_each_chunks_last_boundary() -> None:
    """A SUM over 2 s: each key's value after each chunk is the oracle's at the boundary the chunk reached."""
    events = [(key, 10_000 + 400 * i, 1.0, float(i % 5)) for i in range(40) for key in "AD"]  # both partitions
    spec = SubscriptionSpec(1, SUM_OVER_2S, None)
    run = backtest(spec, raw_chunks(events, [20, 40, 60]))
    samples = run.samples["A"]
    assert len(samples) == 4 and [at for at, _ in samples] == sorted({at for at, _ in samples})
    for at, value in samples:
        assert value == sum(v for key, ts, _, v in events if key == "A" and at - 2_000 <= ts // PANE * PANE < at)


def test_records_the_live_query_would_refuse_are_counted_not_evaluated() -> None:
    events = [(key, 10_000 + 500 * i, 1.0, 3.0) for i in range(20) for key in "AD"]
    chunks = raw_chunks(events, [])
    bad = chunks[0].iloc[:1].assign(value=b'{"key": "A", "ts": "soon"}', offset=99)
    run = backtest(SubscriptionSpec(1, SUM_OVER_2S, None), [pd.concat([chunks[0], bad], ignore_index=True)])
    assert run.tally.records == 41 and run.tally.events == 40 and run.tally.dead == 1
    assert {t.key for t in run.transitions} == {"A", "D"}
    assert run.tally.dead_reasons == {"ts": 1}
