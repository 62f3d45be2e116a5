"""A synthetic stock market that looks like the real thing to the evaluator.

- thousands of symbols whose popularity follows a Zipf law (a few names trade
  constantly, the long tail rarely);
- a U-shaped intraday activity curve (busy at the open and the close);
- log-normal trade sizes and geometric-random-walk prices;
- bounded disorder: an event's time may lag its emission by up to
  ``max_disorder_ms``, so downstream watermarks are exercised.

Generation is deterministic for a given seed and start time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ingest.model import Event

TRADING_DAY_MS = 6 * 3600 * 1000 + 30 * 60 * 1000


def symbol_names(count: int) -> list[str]:
    """Stable ticker-like names: ``S0000``, ``S0001``, ... (the first few are famous ones)."""
    famous = ["AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "AMD", "NFLX", "INTC"]
    names = famous[:count]
    names += [f"S{i:04d}" for i in range(len(names), count)]
    return names


def intraday_activity(ms_into_day: np.ndarray | float, day_ms: int = TRADING_DAY_MS) -> np.ndarray | float:
    """Relative trading intensity, mean 1 over the day: high at open and close, low at noon."""
    phase = (np.asarray(ms_into_day, dtype=float) % day_ms) / day_ms
    u = (2.0 * phase - 1.0) ** 2  # 1 at the edges, 0 at noon
    return (0.4 + 1.8 * u) / (0.4 + 1.8 / 3.0)


@dataclass
class MarketGenerator:
    symbols: int = 2000
    rate: float = 2000.0  # mean events per second over the trading day
    seed: int = 7
    start_ms: int = 0
    max_disorder_ms: int = 500
    zipf_s: float = 1.1
    day_ms: int = TRADING_DAY_MS
    names: list[str] = field(init=False)
    _rng: np.random.Generator = field(init=False, repr=False)
    _weights: np.ndarray = field(init=False, repr=False)
    _prices: np.ndarray = field(init=False, repr=False)
    _clock_ms: int = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.names = symbol_names(self.symbols)
        ranks = np.arange(1, self.symbols + 1, dtype=float)
        weights = ranks ** -self.zipf_s
        self._weights = weights / weights.sum()
        self._prices = np.round(self._rng.lognormal(mean=math.log(50), sigma=1.0, size=self.symbols), 2)
        self._clock_ms = self.start_ms

    @property
    def clock_ms(self) -> int:
        """Event time up to which the generator has emitted."""
        return self._clock_ms

    @property
    def low_watermark_ms(self) -> int:
        """No event emitted later will have an event time before this."""
        return max(self._clock_ms - self.max_disorder_ms, 0)

    def advance(self, duration_ms: int) -> list[Event]:
        """Emit the events of the next ``duration_ms``, in emission (not event-time) order."""
        start, end = self._clock_ms, self._clock_ms + duration_ms
        self._clock_ms = end
        intensity = float(intraday_activity(start - self.start_ms, self.day_ms))
        count = int(self._rng.poisson(self.rate * intensity * duration_ms / 1000.0))
        if count == 0:
            return []
        emitted = np.sort(self._rng.integers(start, end, size=count))
        lag = self._rng.integers(0, self.max_disorder_ms + 1, size=count) if self.max_disorder_ms else 0
        event_ts = np.maximum(emitted - lag, 0)
        which = self._rng.choice(self.symbols, size=count, p=self._weights)
        sizes = np.maximum(np.round(self._rng.lognormal(mean=math.log(200), sigma=1.2, size=count)), 1)
        moves = np.exp(self._rng.normal(0.0, 0.0008, size=count))
        events: list[Event] = []
        for i in range(count):
            s = int(which[i])
            self._prices[s] = max(round(float(self._prices[s] * moves[i]), 4), 0.01)
            events.append(
                Event(key=self.names[s], ts=int(event_ts[i]), price=float(self._prices[s]), volume=float(sizes[i]))
            )
        return events

    def stream(self, step_ms: int = 100) -> Iterator[list[Event]]:
        """Endless slices of ``step_ms`` of market activity."""
        while True:
            yield self.advance(step_ms)
