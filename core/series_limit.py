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
once it has had no event for the horizon (and up to a sixteenth of it more, below), making room for new ones.

The evaluator's parsers check every batch's series, and one script call per series and batch was most
of a parse task's time (~12 µs a series). A worker therefore remembers the series it had admitted
and what it reported of them (``remember_s``): a series is reported again only when its newest event
is more than a sixteenth of the horizon past what was reported, or ``remember_s`` of wall time has
passed (so a registry emptied behind the worker's back is filled again that soon). The registry's
time of a series may thus be up to that sixteenth behind its newest event, so series leave only a
sixteenth of the horizon after it, for everyone: an active series is never dropped for a report not
yet made.

Records published over HTTP come with a publisher token, and several collectors often share a
stream: one token may keep at most ``publish_token_series_share`` of the stream's limit active, so a
broken or hostile collector fills its own share, not the stream, and the other tokens' new series
are still admitted (the records Kafka producers write directly carry no token: the stream's limit
alone applies to them).

The registry is one sorted set per stream (member: the series, score: its newest event time), and
one per publisher token and stream, kept by one script per batch, so it is atomic on a Redis
Cluster too (the token's set carries the stream's set as its hash tag).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from enum import IntEnum
from typing import cast

import numpy as np
import redis

from core.redis_schema import RedisKeys
from core.settings import Settings

#: KEYS[1]: the stream's set; KEYS[2], if given: the publisher token's set in this stream. ARGV: the cutoff (series
#: whose newest event is older leave), the stream's limit, the token's limit, the token set's expiry (ms, wall time:
#: a token that stops publishing leaves no key behind), then (series, newest event time) pairs. Returns the 1-based
#: positions of the pairs refused: positive beyond the stream's limit, negative beyond the token's. ``ZADD GT``: a
#: series' newest time never moves back (a late partition's batch must not make an active series look idle).
_ADMIT = """
local key, mine = KEYS[1], KEYS[2]
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. ARGV[1])
local limit, own_limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local members = {}
for i = 5, #ARGV, 2 do members[#members + 1] = ARGV[i] end
local seen = redis.call('ZMSCORE', key, unpack(members))
local n = redis.call('ZCARD', key)
local own, m = {}, 0
if mine then
  redis.call('ZREMRANGEBYSCORE', mine, '-inf', '(' .. ARGV[1])
  own = redis.call('ZMSCORE', mine, unpack(members))
  m = redis.call('ZCARD', mine)
end
local kept, refused = {}, {}
for i, member in ipairs(members) do
  if not (seen[i] or n < limit) then
    refused[#refused + 1] = i
  elseif mine and not (own[i] or m < own_limit) then
    refused[#refused + 1] = -i
  else
    if not seen[i] then n = n + 1 end
    if mine and not own[i] then m = m + 1 end
    kept[#kept + 1] = ARGV[4 + 2 * i]
    kept[#kept + 1] = member
  end
end
if #kept > 0 then
  redis.call('ZADD', key, 'GT', unpack(kept))
  if mine then redis.call('ZADD', mine, 'GT', unpack(kept)) end
end
if mine then redis.call('PEXPIRE', mine, ARGV[4]) end
return refused
"""


#: The share of the horizon a remembered series' registry time may lag its newest event (and so the horizon's
#: extension before a series leaves): 1/16.
REPORT_SLACK_DIVISOR = 16


class Refusal(IntEnum):
    """Why an event's series is refused (0: it is not)."""

    STREAM = 1  # a new series beyond the stream's limit
    TOKEN = 2  # a series new to its publisher token beyond the token's share


class SeriesLimit:
    """Admits a batch's series of one stream against its limit (one round trip per call)."""

    #: Series per script call: one call never holds Redis long (~3 µs a series), and its ``unpack`` of 2 values a
    #: series stays under Lua's stack limit (8,000).
    CHUNK = 2_000

    def __init__(self, client: redis.Redis, settings: Settings, remember_s: float = 0.0) -> None:
        """``remember_s`` > 0: :meth:`event_refusals` without a token skips the series this object admitted and
        reported recently enough (the evaluator's workers; module docstring)."""
        self.redis = client
        self.keys = RedisKeys(settings)
        self.limit = settings.stream_max_series
        self.share = settings.publish_token_series_share
        self.token_limit = max(1, int(self.limit * self.share))
        self.horizon_ms = settings.max_window_ms + settings.watermark_delay_ms
        self.slack_ms = self.horizon_ms // REPORT_SLACK_DIVISOR
        self.leave_after_ms = self.horizon_ms + self.slack_ms  # without an event: the series leaves
        self.remember_s = remember_s
        self._reported: dict[str, dict[str, tuple[int, float]]] = {}  # stream -> series -> (newest sent, when)
        self._admit = client.register_script(_ADMIT)

    def refusals(self, stream: str, series: Sequence[str], newest: Sequence[int], token: int | None = None
                 ) -> dict[int, Refusal]:
        """The positions in ``series`` refused, and why: new series beyond the stream's limit, or (published with
        publisher ``token``) series new to the token beyond its share. ``newest``: each series' newest event time in
        the batch; every admitted series' last-seen time moves up to it."""
        if not series:
            return {}
        keys = [self.keys.series(stream)]
        if token is not None and self.share < 1:
            keys.append(self.keys.token_series(stream, token))
        cutoff = max(newest) - self.leave_after_ms
        out: dict[int, Refusal] = {}
        for first in range(0, len(series), self.CHUNK):
            args: list[str | int] = [cutoff, self.limit, self.token_limit, self.horizon_ms]
            for s, ts in zip(series[first : first + self.CHUNK], newest[first : first + self.CHUNK], strict=True):
                args.extend((s, int(ts)))
            for i in cast(list, self._admit(keys=keys, args=args)):
                out[first + abs(int(i)) - 1] = Refusal.STREAM if int(i) > 0 else Refusal.TOKEN
        return out

    def refused(self, stream: str, series: Sequence[str], newest: Sequence[int], token: int | None = None
                ) -> list[int]:
        """Positions in ``series`` refused, for either reason (:meth:`refusals`)."""
        return sorted(self.refusals(stream, series, newest, token))

    def event_refusals(self, stream: str, series: np.ndarray, ts: np.ndarray, token: int | None = None
                       ) -> np.ndarray:
        """Per event, 0 or the :class:`Refusal` of its series, given each event's series and time: one registry
        round trip for the batch's distinct series (those not remembered, with ``remember_s`` and no token)."""
        if not len(series):
            return np.zeros(0, dtype=np.int8)
        import pandas as pd  # here, not at the top: a notifier worker imports this module and never calls this

        codes, distinct = pd.factorize(series)
        newest = pd.Series(ts).groupby(codes, sort=True).max().to_numpy()
        names, times = list(distinct), newest.tolist()
        remembering = token is None and self.remember_s > 0
        asked = self._unreported(stream, names, times) if remembering else list(range(len(names)))
        names, times = [names[i] for i in asked], [times[i] for i in asked]
        refusals = self.refusals(stream, names, times, token)
        why = np.zeros(len(distinct), dtype=np.int8)
        for position, refusal in refusals.items():
            why[asked[position]] = refusal
        if remembering:
            self._remember(stream, names, times, refusals)
        return why[codes]

    def refused_events(self, stream: str, series: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Which events (a mask) are of new series beyond the stream's limit (records with no publisher token)."""
        return self.event_refusals(stream, series, ts) != 0

    def _unreported(self, stream: str, names: list[str], times: list[int]) -> list[int]:
        """Positions of the series to report: not admitted by this object lately, or newer than it reported by more
        than the slack."""
        memo = self._reported.get(stream, {})
        since = time.monotonic() - self.remember_s
        out = []
        for i, (name, newest) in enumerate(zip(names, times, strict=True)):
            sent = memo.get(name)
            if sent is None or sent[1] < since or newest > sent[0] + self.slack_ms:
                out.append(i)
        return out

    def _remember(self, stream: str, names: list[str], times: list[int], refused: Mapping[int, Refusal]) -> None:
        memo = self._reported.setdefault(stream, {})
        if len(memo) > 2 * self.limit:  # series that left are never asked about again: bounded
            memo.clear()
        now = time.monotonic()
        for i, (name, newest) in enumerate(zip(names, times, strict=True)):
            if i not in refused:
                memo[name] = (newest, now)

    def reason(self, stream: str, key: str, dimensions: Mapping[str, str], attributes: Collection[str],
               why: Refusal = Refusal.STREAM) -> str:
        """Why an event of a new series (``key`` with its dimension values and optional attributes) is refused."""
        what = f"key {key!r}" + (f", dimensions {dict(dimensions)}" if dimensions else "") + (
            f", attributes {sorted(attributes)}" if attributes else "")
        if why == Refusal.TOKEN:
            return (f"series: a series ({what}) new to this publisher token beyond the {self.token_limit} active "
                    f"series one token may have in stream {stream!r} (TOCSIN_PUBLISH_TOKEN_SERIES_SHARE of "
                    f"TOCSIN_STREAM_MAX_SERIES); its events are refused until this token's series with no event for "
                    f"{self.leave_after_ms} ms leave")
        return (f"series: a new series ({what}) beyond the {self.limit} active series stream {stream!r} may have "
                f"(TOCSIN_STREAM_MAX_SERIES); its events are refused until series with no event for "
                f"{self.leave_after_ms} ms leave")

    def active(self, stream: str) -> int:
        """Series admitted and not yet left (as of the newest batch's cutoff)."""
        return int(self.redis.zcard(self.keys.series(stream)))

    def forget(self, stream: str) -> None:
        """Drop a stream's registry and its tokens' (the stream is deleted: a stream declared again under its name
        starts empty)."""
        self.redis.delete(self.keys.series(stream))
        self._reported.pop(stream, None)
        for name in self.redis.scan_iter(match=self.keys.token_series(stream, "*"), count=1_000):
            self.redis.delete(name)
