"""Each stream's active series, capped, so no publisher can grow the evaluator's state without bound.

A *series* is what the shards keep pane rows for: a key of ``trades``, a cell of a declared stream
(``evaluator.views``: the key with the event's dimension values and the optional attributes it
carries). A broken or hostile publisher that sends a new key, or a new dimension value, with
every event makes the shards keep a row per event for as long as the longest window, and the
parser and the shards do per-series work in every batch: state and CPU grow with the publisher's
imagination, not with the data. As Prometheus and Mimir do with their series limits, a stream
admits at most ``stream_max_series`` series *active*: with an event within the horizon
(``max_window_ms`` + ``watermark_delay_ms``, in event time) of the stream's newest events. An
event of a new series beyond the limit is refused (the evaluator dead-letters it with the reason and
counts it as ``series_refused``); the series already admitted go on untouched, and a series leaves
once it has had no event for the horizon, making room for new ones.

The registry is one sorted set per stream (member: the series, score: its newest event time), kept
by one script per parser batch, so it is atomic on a Redis Cluster too (one key).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import cast

import numpy as np
import pandas as pd
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings

#: KEYS[1]: the stream's set. ARGV: the cutoff (series whose newest event is older leave), the limit, then
#: (series, newest event time) pairs. Returns the 1-based positions of the pairs refused. ``ZADD GT``: a series'
#: newest time never moves back (a late partition's batch must not make an active series look idle).
_ADMIT = """
local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. ARGV[1])
local limit = tonumber(ARGV[2])
local members = {}
for i = 3, #ARGV, 2 do members[#members + 1] = ARGV[i] end
local seen = redis.call('ZMSCORE', key, unpack(members))
local n = redis.call('ZCARD', key)
local kept, refused = {}, {}
for i, member in ipairs(members) do
  if seen[i] or n < limit then
    if not seen[i] then n = n + 1 end
    kept[#kept + 1] = ARGV[2 + 2 * i]
    kept[#kept + 1] = member
  else
    refused[#refused + 1] = i
  end
end
if #kept > 0 then redis.call('ZADD', key, 'GT', unpack(kept)) end
return refused
"""


class SeriesLimit:
    """Admits a batch's series of one stream against its limit (one round trip per call)."""

    #: Series per script call: one call never holds Redis long (~3 µs a series), and its ``unpack`` of 2 values a
    #: series stays under Lua's stack limit (8,000).
    CHUNK = 2_000

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.keys = RedisKeys(settings)
        self.limit = settings.stream_max_series
        self.horizon_ms = settings.max_window_ms + settings.watermark_delay_ms
        self._admit = client.register_script(_ADMIT)

    def refused(self, stream: str, series: Sequence[str], newest: Sequence[int]) -> list[int]:
        """Positions in ``series`` refused: new series beyond the stream's limit. ``newest``: each series' newest
        event time in the batch; every admitted series' last-seen time moves up to it."""
        if not series:
            return []
        cutoff = max(newest) - self.horizon_ms
        out: list[int] = []
        for first in range(0, len(series), self.CHUNK):
            args: list[str | int] = [cutoff, self.limit]
            for s, ts in zip(series[first : first + self.CHUNK], newest[first : first + self.CHUNK], strict=True):
                args.extend((s, int(ts)))
            out.extend(first + int(i) - 1 for i in cast(list, self._admit(keys=[self.keys.series(stream)], args=args)))
        return out

    def refused_events(self, stream: str, series: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Which events (a mask) are of new series beyond the stream's limit, given each event's series and time:
        one registry round trip for the batch's distinct series."""
        if not len(series):
            return np.zeros(0, dtype=bool)
        codes, distinct = pd.factorize(series)
        newest = pd.Series(ts).groupby(codes, sort=True).max().to_numpy()
        return np.isin(codes, self.refused(stream, distinct.tolist(), newest.tolist()))

    def reason(self, stream: str, key: str, dimensions: Mapping[str, str], attributes: Collection[str]) -> str:
        """Why an event of a new series (``key`` with its dimension values and optional attributes) is refused."""
        what = f"key {key!r}" + (f", dimensions {dict(dimensions)}" if dimensions else "") + (
            f", attributes {sorted(attributes)}" if attributes else "")
        return (f"series: a new series ({what}) beyond the {self.limit} active series stream {stream!r} may have "
                f"(TOCSIN_STREAM_MAX_SERIES); its events are refused until series with no event for "
                f"{self.horizon_ms} ms leave")

    def active(self, stream: str) -> int:
        """Series admitted and not yet left (as of the newest batch's cutoff)."""
        return int(self.redis.zcard(self.keys.series(stream)))

    def forget(self, stream: str) -> None:
        """Drop a stream's registry (the stream is deleted: a stream declared again under its name starts empty)."""
        self.redis.delete(self.keys.series(stream))
