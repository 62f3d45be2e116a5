"""The query's last stage: transitions into Redis, exactly once per alert id, and each shard's clock.

Rows reach the sink in ``TRANSITIONS_SCHEMA``: the shards' transitions, each
followed by one ``CLOCK_STATE`` row per shard carrying the last boundary it
evaluated (:func:`clock_record`), which the sink reports in ``stats:evaluator``
once the batch's alerts are stored (:func:`evaluated_through` reads them back).
Transitions are stored as :meth:`evaluator.transition.Transition.to_json`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import redis
from pyspark.sql import DataFrame
from redis.typing import EncodableT, FieldT

from core.redis_schema import HISTORY_LENGTH, RedisKeys, shard_clock_field, shard_clocks
from core.settings import Settings
from evaluator.transition import Transition

TRANSITIONS_SCHEMA = (
    "alert_id string, subscription_id long, key string, state string, value double, "
    "window_start long, window_end long, evaluated_at long, kind string"
)
CLOCK_STATE = "clock"  # an output row carrying a shard's last evaluated boundary, not a transition


def clock_record(shard: int, evaluated_at: int) -> dict[str, Any]:
    """The row that carries a shard's clock to the sink (the shard id travels as ``subscription_id``)."""
    return {"alert_id": "", "subscription_id": shard, "key": "", "state": CLOCK_STATE, "value": None,
            "window_start": 0, "window_end": 0, "evaluated_at": evaluated_at, "kind": "state"}


def evaluated_through(stats: dict[str, str], shards: int) -> int | None:
    """The last boundary every shard has evaluated and stored, from the clocks the sink writes."""
    clocks = shard_clocks(stats)
    return min(clocks) if len(clocks) == shards else None


_RECORD_TRANSITIONS = """
-- KEYS: the alert stream, then per transition its dedupe mark, firing hash, counters hash and history stream
-- ARGV: dedupe TTL, stream max length, history length, then per transition its payload, state and key
local written = 0
for i = 0, (#ARGV - 3) / 3 - 1 do
  local mark, firing, counters, history = KEYS[2 + 4 * i], KEYS[3 + 4 * i], KEYS[4 + 4 * i], KEYS[5 + 4 * i]
  local payload, state, key = ARGV[4 + 3 * i], ARGV[5 + 3 * i], ARGV[6 + 3 * i]
  if redis.call('SET', mark, '1', 'NX', 'EX', ARGV[1]) then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'alert', payload)
    redis.call('XADD', history, 'MAXLEN', '~', ARGV[3], '*', 'alert', payload)
    if state == 'firing' then
      redis.call('HSET', firing, key, payload)
    else
      redis.call('HDEL', firing, key)
    end
    redis.call('HINCRBY', counters, state, 1)
    written = written + 1
  end
end
return written
"""


class RedisAlertSink:
    """foreachBatch: record transitions in Redis exactly once per alert id.

    A Lua script makes "seen?" and "record" atomic per transition, so a replayed
    micro-batch (after a crash between Redis and Spark's commit) adds nothing; it
    takes transitions in chunks, one round trip per chunk. (Its keys span hash
    slots: this needs a single Redis, not Redis Cluster.)
    """

    DEDUPE_TTL_S = 7 * 24 * 3600
    STREAM_MAXLEN = 1_000_000
    CHUNK = 2_000

    def __init__(self, settings: Settings) -> None:
        self.keys = RedisKeys(settings)
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.script = self.redis.register_script(_RECORD_TRANSITIONS)

    def write(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Record transitions given as their fields (see ``Transition.from_dict``); returns how many were new."""
        transitions = [Transition.from_dict(row) for row in rows]
        written = 0
        for first in range(0, len(transitions), self.CHUNK):
            keys: list[str] = [self.keys.alerts_stream]
            args: list[str | int] = [self.DEDUPE_TTL_S, self.STREAM_MAXLEN, HISTORY_LENGTH]
            for t in transitions[first : first + self.CHUNK]:
                sid = t.subscription_id
                keys += [self.keys.alert_mark(t.alert_id), self.keys.firing(sid), self.keys.counters(sid),
                         self.keys.history(sid)]
                # a crossing (an event, evaluator/lifecycle.py) is not kept as firing: the script's other branch
                args += [t.to_json(), t.state if t.kind == "state" else t.kind, t.key]
            written += int(self.script(keys=keys, args=args))
        return written

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = batch.toPandas()  # runs the whole micro-batch: not the sink's own time
        started = time.perf_counter()
        is_clock = frame["state"] == CLOCK_STATE
        clocks: dict[FieldT, EncodableT] = {shard_clock_field(sid): int(at) for sid, at in
                  zip(frame.loc[is_clock, "subscription_id"], frame.loc[is_clock, "evaluated_at"], strict=True)}
        rows = frame[~is_clock].astype(object).where(frame[~is_clock].notna(), None).to_dict("records")
        written = self.write(rows) if rows else 0
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.evaluator_stats, mapping={"last_batch_id": batch_id, "last_batch_at": time.time(), **clocks})
        pipe.hincrby(self.keys.evaluator_stats, "transitions", written)
        pipe.hincrbyfloat(self.keys.evaluator_stats, "sink_ms_total", (time.perf_counter() - started) * 1000)
        pipe.execute()


