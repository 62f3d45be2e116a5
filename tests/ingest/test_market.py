from __future__ import annotations

from collections import Counter

import numpy as np

from ingest.market import MarketGenerator, intraday_activity


def test_deterministic_for_a_seed() -> None:
    a = MarketGenerator(symbols=50, rate=1000, seed=3, start_ms=10_000).advance(2_000)
    b = MarketGenerator(symbols=50, rate=1000, seed=3, start_ms=10_000).advance(2_000)
    assert a == b and len(a) > 0


def test_disorder_is_bounded_and_watermark_is_safe() -> None:
    market = MarketGenerator(symbols=20, rate=2000, seed=1, start_ms=1_000_000, max_disorder_ms=300)
    events = []
    for _ in range(20):
        watermark = market.low_watermark_ms
        batch = market.advance(100)
        assert all(e.ts >= watermark for e in batch), "an event came after the heartbeat promised none would"
        events += batch
    running_max = np.maximum.accumulate([e.ts for e in events])
    lateness = running_max - np.array([e.ts for e in events])
    assert lateness.max() <= 300
    assert lateness.max() > 0, "the generator should produce some disorder"


def test_popularity_is_skewed_and_activity_u_shaped() -> None:
    market = MarketGenerator(symbols=200, rate=20_000, seed=2, start_ms=0)
    counts = Counter(e.key for e in market.advance(1_000))
    top = sum(n for _, n in counts.most_common(10))
    assert top > 0.3 * sum(counts.values()), "the ten most popular symbols should dominate (Zipf)"
    day = 6.5 * 3600 * 1000
    assert intraday_activity(0.0, int(day)) > 2 * intraday_activity(day / 2, int(day))
    assert abs(np.mean(intraday_activity(np.linspace(0, day, 10_001), int(day))) - 1.0) < 0.01
    assert all(e.volume >= 1 and e.price > 0 for e in market.advance(500))
