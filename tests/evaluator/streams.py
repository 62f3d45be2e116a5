"""The generated stream and catalog the end-to-end evaluator tests share, and how they run and judge a job.

Local mode (``tests/evaluator/spark``) and the standalone cluster (``tests/evaluator/cluster``) run
the same stream through the same query and judge it the same way: against the brute-force oracle
(``tests.evaluator.oracle``) and, after a fault, against an uninterrupted run.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.patience import deadline
from devstack.services import ManagedProcess, python_module, spawn
from evaluator.spark.sink import evaluated_through
from evaluator.spec import SubscriptionSpec
from ingest.model import Event
from ingest.publisher import EventPublisher
from subscriptions.language import parse_condition
from tests.evaluator.oracle import oracle, rank_oracle, value_of
from tests.evaluator.spark.test_job import recent_base, transitions

KEYS = [f"K{i:02d}" for i in range(20)]
BASE = recent_base()
HORIZON = 20_000
SPECS = [
    SubscriptionSpec(1, parse_condition("COUNT(*) OVER 5s > 8")),
    SubscriptionSpec(2, parse_condition("SUM(volume) OVER 10s > 600")),
    SubscriptionSpec(3, parse_condition("AVG(price) OVER 5s > 101")),
    SubscriptionSpec(4, parse_condition("MAX(price) OVER 10s >= 108")),
    SubscriptionSpec(5, parse_condition("MIN(price) OVER 5s < 92")),
    SubscriptionSpec(6, parse_condition("SUM(volume) OVER 20s BETWEEN 300 AND 900"), frozenset(KEYS[:7])),
    SubscriptionSpec(7, parse_condition("COUNT(*) OVER 20s < 25")),
    SubscriptionSpec(8, parse_condition("SUM(volume) OVER 10s > 400")),
    SubscriptionSpec(9, parse_condition("QUANTILE(price, 0.9) OVER 5s > 104")),
    SubscriptionSpec(10, parse_condition("MAX(price) - MIN(price) OVER 10s > 8%")),
    SubscriptionSpec(11, parse_condition("LAST(price) - AVG(price) OVER 5s > 2")),
    SubscriptionSpec(12, parse_condition("MEDIAN(volume) OVER 10s < 20"), frozenset(KEYS[5:])),
    SubscriptionSpec(13, parse_condition("SUM(volume) OVER 10s IN TOP 3")),
    SubscriptionSpec(14, parse_condition("AVG(price) OVER 5s IN BOTTOM 2"), frozenset(KEYS[::2])),
]


def generated_stream(seed: int = 3, n: int = 2_400) -> list[tuple[str, int, float, float]]:
    """Skewed keys, prices drifting around 100, disorder up to a second (within the allowed delay).

    Prices move in quarter ticks, which binary floating point represents exactly, so every
    sum is exact whatever the order of addition and the oracle can be compared for equality.
    """
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(KEYS))]
    prices = dict.fromkeys(KEYS, 100.0)
    events, clock = [], BASE
    for _ in range(n):
        clock += rng.randint(0, 40)
        key = rng.choices(KEYS, weights)[0]
        prices[key] = min(max(prices[key] + rng.uniform(-1.5, 1.5), 85.0), 115.0)
        events.append((key, clock - rng.randint(0, 1_000), round(prices[key] * 4) / 4, float(rng.randint(1, 60))))
    return events


def publish(settings: Settings, events: list[tuple[str, int, float, float]]) -> int:
    """The events with a heartbeat on every partition each second; returns the last boundary evaluated."""
    with EventPublisher(settings) as publisher:
        next_beat = BASE + 1_000
        for key, ts, price, volume in events:
            publisher.publish(Event(key=key, ts=ts, price=price, volume=volume))
            if ts >= next_beat + 1_000:
                publisher.heartbeat(next_beat)
                next_beat += 1_000
        end = max(ts for _, ts, *_ in events) + 12_000
        publisher.heartbeat(end)
    return (end - settings.watermark_delay_ms) // settings.pane_ms * settings.pane_ms


def evaluated_everything(settings: Settings, last: int, shards: int) -> bool:
    stats = redis.Redis.from_url(settings.redis_url, decode_responses=True).hgetall(RedisKeys(settings).evaluator_stats)
    done = evaluated_through(stats, shards)
    return done is not None and done >= last


def wait_until(predicate, timeout_s: float = 180, query=None, job: ManagedProcess | None = None) -> None:
    """Poll ``predicate``; fail early if the in-process ``query`` failed or the spawned ``job`` exited."""
    until = deadline(timeout_s)
    while not predicate():
        assert time.monotonic() < until, "the evaluator did not get there in time"
        if query is not None and query.exception():
            raise query.exception()
        if job is not None:
            assert job.process.poll() is None, f"the evaluator exited with {job.process.returncode}"
        time.sleep(0.3)


def for_run(settings: Settings, tag: str, tmp_path: Path) -> Settings:
    """Same topic, its own Redis prefix and checkpoint."""
    return settings.model_copy(update={
        "redis_prefix": f"{settings.redis_prefix}-{tag}", "checkpoint_dir": str(tmp_path / f"checkpoint-{tag}"),
        "max_window_ms": HORIZON, "source_max_records_per_trigger": 400,
    })


def alert_set(settings: Settings) -> list[tuple]:
    return [(t["subscription_id"], t["key"], t["state"], t["evaluated_at"]) for t in transitions(settings)]


def batch_id(settings: Settings) -> int:
    """The last micro-batch the sink stored (-1: none yet)."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return int(client.hget(RedisKeys(settings).evaluator_stats, "last_batch_id") or -1)


def evaluator_process(settings: Settings, log_path: Path) -> ManagedProcess:
    """``python -m evaluator.spark`` configured by ``settings``: the production entry point, unchanged."""
    return spawn("evaluator", python_module("evaluator.spark"), log_path, env=settings.to_env(), graceful=True,
                 stop_timeout_s=settings.evaluator_stop_timeout_s)


def assert_recovered(run: Settings, reference: Settings, events: list, last: int) -> None:
    """After a fault, ``run`` wrote the uninterrupted ``reference`` run's alerts (ids too), the oracle's, once each."""
    expected = alert_set(reference)
    got = alert_set(run)
    assert len(got) == len(set(got)), "a transition was written twice"
    assert set(got) == set(expected), "alerts were lost or invented across the fault"
    assert len(expected) > 100 and set(expected) == oracle(events, SPECS, last, run.pane_ms, HORIZON)
    assert {t["alert_id"] for t in transitions(run)} == {t["alert_id"] for t in transitions(reference)}


def assert_matches_oracle(run: Settings, events: list, last: int) -> None:
    """``run`` wrote exactly the oracle's transitions, once each, with exact values and window extents."""
    got = transitions(run)
    expected = oracle(events, SPECS, last, run.pane_ms, HORIZON)
    assert len(expected) > 100, "the stream should exercise every condition"
    assert {spec_id for spec_id, *_ in expected} == {s.id for s in SPECS}
    assert set(alert_set(run)) == expected
    assert len(got) == len(expected)  # no duplicates
    times: dict[tuple[int, str], list[int]] = {}
    for t in got:
        times.setdefault((t["subscription_id"], t["key"]), []).append(t["evaluated_at"])
    for (sid, key), each in times.items():  # each alert's transitions stored in the order they were evaluated
        assert each == sorted(each), f"subscription {sid}'s alerts on {key} stored out of order"
    by_id = {s.id: s for s in SPECS}
    ranked = rank_oracle(events, [s for s in SPECS if s.condition.rank is not None], last, run.pane_ms, HORIZON)
    for t in got:  # values and window extents are exact
        c = by_id[t["subscription_id"]].condition
        if c.rank is not None:  # a resolve's value is the key's value now (none without an event in the window)
            expected_rank_value = ranked[(t["subscription_id"], t["key"], t["state"], t["evaluated_at"])]
            assert t["value"] == pytest.approx(expected_rank_value) if expected_rank_value is not None \
                else t["value"] is None
            continue
        assert t["window_end"] == t["evaluated_at"] and t["window_start"] == t["evaluated_at"] - c.window_ms
        window = [e for e in events if e[0] == t["key"] and t["window_start"] <= e[1] // 1000 * 1000 < t["window_end"]]
        expected_value = value_of(c, window)
        assert (t["value"] is None and expected_value is None) or t["value"] == pytest.approx(expected_value)
