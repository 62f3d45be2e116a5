"""The query's last stage: transitions into Redis, exactly once per alert id, and each shard's clock.

Rows reach the sink in ``TRANSITIONS_SCHEMA``: the shards' transitions and rank entries
(``evaluator.rank.RankEntry``, merged into transitions by ``evaluator.spark.rank_sink``), each shard's
followed by one ``CLOCK_STATE`` row carrying the last boundary it
evaluated (:func:`clock_record`), which the sink reports in ``stats:evaluator``
once the batch's alerts are stored (:func:`evaluated_through` reads them back).
Transitions are stored as :meth:`evaluator.transition.Transition.to_json`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from operator import itemgetter
from typing import Any, cast

import numpy as np
import pandas as pd
import redis
from pyspark.sql import DataFrame
from redis.typing import EncodableT, FieldT

from core.gc_policy import apply_gc_policy
from core.redis_client import make_redis, run_script
from core.redis_eviction import check_eviction
from core.redis_outage import Outage
from core.redis_schema import (
    HISTORY_LENGTH,
    RedisKeys,
    claim_layout,
    seen_bucket,
    shard_clock_field,
    shard_clocks,
    stream_stat,
)
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.rank import RANK_STATE, RankEntry
from evaluator.spark.handoff import Handoff
from evaluator.spark.rank_sink import RankMerges
from evaluator.transition import KINDS, STATES, Transition

TRANSITIONS_SCHEMA = (
    "alert_id string, subscription_id long, key string, state string, value double, "
    "window_start long, window_end long, evaluated_at long, kind string"
)
CLOCK_STATE = "clock"  # an output row carrying a shard's last evaluated boundary, not a transition


#: The columns of ``TRANSITIONS_SCHEMA``, in order: a :class:`Transition`'s fields.
TRANSITION_COLUMNS = [field.split()[0] for field in TRANSITIONS_SCHEMA.split(", ")]
assert tuple(TRANSITION_COLUMNS) == Transition._fields, "shard_output takes a transition as its row"
_KINDS = [field.split()[1] for field in TRANSITIONS_SCHEMA.split(", ")]
_DTYPES = {"string": object, "long": np.int64, "double": np.float64}  # a double's None is NaN, as pandas had it


def clock_record(shard: int, evaluated_at: int) -> dict[str, Any]:
    """The row that carries a shard's clock to the sink (the shard id travels as ``subscription_id``)."""
    return {"alert_id": "", "subscription_id": shard, "key": "", "state": CLOCK_STATE, "value": None,
            "window_start": 0, "window_end": 0, "evaluated_at": evaluated_at, "kind": "state"}


def transition_frame(rows: Sequence[tuple]) -> pd.DataFrame:
    """Rows in ``TRANSITIONS_SCHEMA``'s columns (transitions are such rows) as a frame of its types, column by
    column: pandas' ``from_records`` inferred the types row by row, 1.8 µs a transition."""
    return pd.DataFrame({name: np.array(list(map(itemgetter(i), rows)), dtype=_DTYPES[kind])
                         for i, (name, kind) in enumerate(zip(TRANSITION_COLUMNS, _KINDS, strict=True))})


def shard_output(transitions: Sequence[Transition], shard: int, evaluated_at: int,
                 ranked: Sequence[RankEntry] = ()) -> pd.DataFrame:
    """A shard's batch output in ``TRANSITIONS_SCHEMA``: its transitions (every row with its ``kind``), its rank
    entries (evaluator/rank.py, stamped with the shard), then its clock row. Built from tuples, not a dict per
    transition (half the time at a few hundred thousand a batch): a transition is one, in the columns' order."""
    rows: list[tuple] = list(transitions)
    rows += [replace(entry, shard=shard).to_row() for entry in ranked]
    clock = clock_record(shard, evaluated_at)
    rows.append(tuple(clock[column] for column in TRANSITION_COLUMNS))
    return transition_frame(rows)


def evaluated_through(stats: dict[str, str], shards: int, stream: str = TRADES) -> int | None:
    """The last boundary every shard (of ``stream``'s query) has evaluated and stored, from the clocks the sink
    writes."""
    clocks = shard_clocks(stats, stream)
    return min(clocks) if len(clocks) == shards else None


_RECORD_TRANSITIONS = """
-- KEYS[1]: the alert stream of the partition every key below is in (one hash tag: one slot)
-- ARGV: dedupe TTL, stream max length, history length, the prefixes of the seen sets, the earlier layout's
--       dedupe marks ('' to skip them), firing hashes, counters hashes and history streams, then per transition:
--       alert id, its seen bucket, subscription id, key, state (firing, resolved, or crossing: an event,
--       counted but never kept in the firing hash), payload
local ttl, maxlen, history_length = ARGV[1], ARGV[2], ARGV[3]
local seen, mark, firing, counters, history = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local call, stream, unpack = redis.call, KEYS[1], unpack
local first, width = 9, 6
-- Adds position i to the group named name, the groups' names kept in their first-seen order.
local function append(groups, order, name, i)
  local list = groups[name]
  if list == nil then
    list = {}
    groups[name] = list
    order[#order + 1] = name
  end
  list[#list + 1] = i
end
-- Which ids are new: per seen bucket, one SMISMEMBER of the call's ids (a repeat within the call counts once),
-- and when asked one EXISTS of the earlier layout's marks of those not seen, looked at one by one only if any is
-- there. Every id not seen joins its bucket's set, marked or not.
local buckets, bucket_order, repeated = {}, {}, {}
for i = first, #ARGV, width do
  local id, bucket = ARGV[i], ARGV[i + 1]
  if repeated[id] == nil then
    repeated[id] = true
    append(buckets, bucket_order, bucket, i)
  end
end
local new = {}
for _, bucket in ipairs(bucket_order) do
  local ids, positions = {}, buckets[bucket]
  for n, i in ipairs(positions) do ids[n] = ARGV[i] end
  local known = call('SMISMEMBER', seen .. bucket, unpack(ids))
  local fresh, add = {}, {}
  for n, i in ipairs(positions) do
    if known[n] == 0 then
      fresh[#fresh + 1] = i
      add[#add + 1] = ARGV[i]
    end
  end
  if #fresh > 0 then
    call('SADD', seen .. bucket, unpack(add))
    call('EXPIRE', seen .. bucket, ttl)
    local marks = {}
    if mark ~= '' then
      for n, id in ipairs(add) do marks[n] = mark .. id end
    end
    if #marks > 0 and call('EXISTS', unpack(marks)) > 0 then
      for n, i in ipairs(fresh) do
        if call('EXISTS', marks[n]) == 0 then new[i] = true end
      end
    else
      for _, i in ipairs(fresh) do new[i] = true end
    end
  end
end
local order, entries = {}, {}
local written = 0
for i = first, #ARGV, width do
  if new[i] then
    call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'alert', ARGV[i + 5])
    append(entries, order, ARGV[i + 2], i)
    written = written + 1
  end
end
-- Per subscription, once: its history in order, its firing hash at each key's last state, its counters.
for _, sid in ipairs(order) do
  local last, keys, tally, own_history = {}, {}, {}, history .. sid
  for _, i in ipairs(entries[sid]) do
    local key, state = ARGV[i + 3], ARGV[i + 4]
    call('XADD', own_history, 'MAXLEN', '~', history_length, '*', 'alert', ARGV[i + 5])
    if last[key] == nil then keys[#keys + 1] = key end
    last[key] = i
    tally[state] = (tally[state] or 0) + 1
  end
  local set, gone = {}, {}
  for _, key in ipairs(keys) do
    local i = last[key]
    if ARGV[i + 4] == 'firing' then
      set[#set + 1] = key
      set[#set + 1] = ARGV[i + 5]
    else
      gone[#gone + 1] = key
    end
  end
  if #set > 0 then call('HSET', firing .. sid, unpack(set)) end
  if #gone > 0 then call('HDEL', firing .. sid, unpack(gone)) end
  for state, n in pairs(tally) do
    call('HINCRBY', counters .. sid, state, n)
  end
end
return written
"""

#: One transition as the script takes it: alert id, seen bucket (``seen_bucket``), subscription id, key, state,
#: payload (``Transition.to_json``).
Record = tuple[str, int, int, str, str, str]


def frame_records(frame: pd.DataFrame) -> list[Record]:
    """The transitions of an operator output frame (clock rows removed), payloads as ``Transition.to_json``."""
    return [record for part in frame_slices(frame, max(len(frame), 1)) for record in part]


def checked_kinds(frame: pd.DataFrame) -> pd.Series:
    """The frame's kinds (``state`` where it has none), once every row's state and kind are checked (ValueError).

    The frame has ``TRANSITIONS_SCHEMA``'s types, so only these need checking."""
    bad = ~frame["state"].isin(STATES)
    if bad.any():
        raise ValueError(f"transition state {frame['state'][bad].iloc[0]!r} is none of {', '.join(STATES)}")
    kinds = frame["kind"].fillna("state") if "kind" in frame else pd.Series("state", index=frame.index)
    unknown = ~kinds.isin(KINDS)
    if unknown.any():
        raise ValueError(f"transition kind {kinds[unknown].iloc[0]!r} is none of {', '.join(KINDS)}")
    return kinds


def frame_slices(frame: pd.DataFrame, size: int) -> Iterator[list[Record]]:
    """:func:`frame_records` built ``size`` rows at a time, once every row is checked (:func:`checked_kinds`).

    Column-wise, without a :class:`Transition` per row (tests/evaluator/spark/test_sink.py checks the payloads
    against ``Transition.to_json``).
    """
    kinds = checked_kinds(frame)
    for first in range(0, len(frame), size):
        yield _records(frame.iloc[first : first + size], kinds.iloc[first : first + size])


def _records(frame: pd.DataFrame, kinds: pd.Series) -> list[Record]:
    values = frame["value"].astype(object).where(frame["value"].notna(), None).tolist()
    columns = (frame["alert_id"].tolist(), frame["subscription_id"].astype("int64").tolist(), frame["key"].tolist(),
               frame["state"].tolist(), values, frame["window_start"].astype("int64").tolist(),
               frame["window_end"].astype("int64").tolist(), frame["evaluated_at"].astype("int64").tolist(),
               kinds.tolist())
    return [(aid, seen_bucket(at), sid, key, _script_state(state, kind),
             _DUMPS({"alert_id": aid, "subscription_id": sid, "key": key, "state": state,
                     "value": None if value is None else float(value), "window_start": start, "window_end": end,
                     "evaluated_at": at, **({} if kind == "state" else {"kind": kind})}))
            for aid, sid, key, state, value, start, end, at, kind in zip(*columns, strict=True)]


def record_of(t: Transition) -> Record:
    """``t`` as the script takes it (for the sink's ``write`` and the merged rank transitions)."""
    return t.alert_id, seen_bucket(t.evaluated_at), t.subscription_id, t.key, _script_state(t.state, t.kind), t.to_json()


def _script_state(state: str, kind: str) -> str:
    """What the script is told: the state, or ``crossing`` for a crossing (an event, evaluator/lifecycle.py),
    which is counted as such and never kept in the firing hash."""
    return state if kind == "state" else kind


_DUMPS = json.JSONEncoder(separators=(",", ":")).encode  # what Transition.to_json writes


class _NotSent(Exception):
    """A slice not sent because one before it failed."""


class RedisAlertSink:
    """foreachBatch: record transitions in Redis exactly once per alert id.

    A Lua script makes "seen?" and "record" atomic per transition, so a replayed micro-batch (after a
    crash between Redis and Spark's commit) adds nothing: the ids it stored are kept in a set per partition
    and ten minutes of evaluation time (``seen``, ``TOCSIN_SINK_DEDUPE_TTL_S`` after its last write), which a
    call reads and extends once per set it touches, not once per transition. Per transition it writes the
    alert stream entry; per subscription and call, its history entries, one HSET / HDEL of its firing
    hash at each key's last state, and one HINCRBY per state. It takes transitions in chunks (a script
    call blocks Redis while it runs), a slice's chunks in one pipelined round trip (:meth:`_record`),
    then the batch's stats in another. The script runs once per slot partition (``core.redis_schema``): its keys share
    the partition's hash tag, so it works on a Redis Cluster too. A batch stores up to
    ``TOCSIN_SINK_BATCH_TRANSITIONS`` itself and hands the rest over, to be stored after it in order
    (``evaluator.spark.handoff``).
    """

    STREAM_MAXLEN = 1_000_000
    CHUNK = 2_000  # transitions per script call
    SLICE = 5_000  # transitions built while Redis runs the slice before

    def __init__(self, settings: Settings, stream: str = TRADES, shard_ids: Sequence[int] = ()) -> None:
        apply_gc_policy(settings.python_gc_threshold)  # the driver: it builds every batch's transitions
        self.dedupe_ttl_s = settings.sink_dedupe_ttl_s
        # Only the first batch a process runs can be one an earlier version stored with per-alert marks (replayed
        # after a crash before Spark's commit): its calls also look at those; later batches are new to every version.
        self.earlier_marks = True
        self.stream = stream  # whose query: its clocks and batch ids are its own fields (``stream_stat``)
        self.keys = RedisKeys(settings)
        self.redis = make_redis(settings)
        # Redis away (a node lost, a failover, a restart) holds the batch until it answers, rather than failing the
        # query: every write below is safe to repeat (the script's seen sets make a replayed call add nothing).
        self.outage = Outage("sink", settings, self.redis)
        self.outage.ride_out(lambda: claim_layout(self.redis, self.keys))  # partitions nobody reads: refuse
        self.outage.ride_out(lambda: check_eviction(self.redis, "sink"))  # a node that may drop alerts: refuse
        self.script = self.redis.register_script(_RECORD_TRANSITIONS)
        self.ranks = RankMerges(self.redis, self.keys, self.outage, stream, shard_ids)
        self.batch_transitions = settings.sink_batch_transitions
        self.handoff = Handoff(self.redis, self.keys, stream, self.outage, self._store, self._report,
                               settings.sink_handoff_max_transitions)

    def write(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Record transitions given as their fields (see ``Transition.from_dict``); returns how many were new."""
        transitions = [Transition.from_dict(row) for row in rows]
        return self._record(lambda: [[record_of(t) for t in transitions]])

    def _store(self, transitions: pd.DataFrame) -> int:
        """Record a frame's transitions (the handoff's pieces are stored this way too); how many were new."""
        return self._record(lambda: frame_slices(transitions, self.SLICE))

    def _report(self, fields: Mapping[str, Any], written: int) -> None:
        """Write stats fields (a stored piece's clocks) and count the transitions stored."""
        def write() -> None:
            pipe = self.redis.pipeline(transaction=False)
            if fields:
                pipe.hset(self.keys.evaluator_stats, mapping=cast("dict[FieldT, EncodableT]", dict(fields)))
            pipe.hincrby(self.keys.evaluator_stats, "transitions", written)
            pipe.execute()
        self.outage.ride_out(write)

    def _split(self, transitions: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The transitions this batch stores itself, and those it hands over (``evaluator.spark.handoff``): those
        of subscriptions with some waiting, and those beyond ``TOCSIN_SINK_BATCH_TRANSITIONS`` of the rest."""
        waiting = self.handoff.waiting()
        later = (transitions["subscription_id"].isin(waiting).to_numpy() if waiting.size
                 else np.zeros(len(transitions), dtype=bool))
        if self.batch_transitions is not None:
            later[np.flatnonzero(~later)[self.batch_transitions:]] = True
        return transitions[~later], transitions[later]

    def _record(self, slices: Callable[[], Iterable[Sequence[Record]]]) -> int:
        """Run the scripts that record the transitions of ``slices()``, in order; how many were new.

        Each slice's calls go to Redis on the sender thread while the next slice is built, so the driver's
        Python and Redis's scripts overlap instead of taking turns. Once a slice fails, no later one is
        sent: the attempt then starts again from the first slice (for as long as Redis is away), whose
        stored transitions add nothing, so each subscription's transitions still land in order.
        """
        def attempt() -> int:
            failed = threading.Event()

            def send(records: Sequence[Record]) -> int:
                if failed.is_set():
                    raise _NotSent
                try:
                    pipe = self.redis.pipeline(transaction=False)
                    return sum(int(n) for n in pipe.execute()) if self._queue(pipe, records) else 0
                except BaseException:
                    failed.set()
                    raise

            sent = []
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-sender") as sender:  # a batch's own thread
                for records in slices():
                    if failed.is_set():
                        break
                    sent.append(sender.submit(send, records))
                return sum(future.result() for future in sent)  # the first failure is the one raised
        written = self.outage.ride_out(attempt)
        self.earlier_marks = False
        return written

    def _queue(self, pipe: redis.client.Pipeline, records: Sequence[Record]) -> int:
        """Queue the script calls that record ``records`` on ``pipe``, per partition; returns how many calls."""
        by_partition: dict[int, list[Record]] = defaultdict(list)
        for record in records:  # in order within each partition, so per subscription
            by_partition[self.keys.partition(record[2])].append(record)
        calls = 0
        for partition, own in sorted(by_partition.items()):
            k = self.keys
            prefixes = [k.seen_prefix(partition), k.mark_prefix(partition) if self.earlier_marks else "",
                        k.firing_prefix(partition), k.counters_prefix(partition), k.history_prefix(partition)]
            for first in range(0, len(own), self.CHUNK):
                args: list[EncodableT] = [self.dedupe_ttl_s, self.STREAM_MAXLEN, HISTORY_LENGTH, *prefixes]
                for record in own[first : first + self.CHUNK]:
                    args.extend(record)
                run_script(self.script, pipe, [k.alerts_stream_of(partition)], args)
                calls += 1
        return calls

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = batch.toPandas()  # runs the whole micro-batch: not the sink's own time
        started = time.perf_counter()
        self.handoff.check()  # its thread failed: fail this batch, where it can be seen
        is_clock, is_rank = frame["state"] == CLOCK_STATE, frame["state"] == RANK_STATE
        clock_of = {int(shard): int(at) for shard, at in  # a clock row carries its shard as the subscription id
                    zip(frame.loc[is_clock, "subscription_id"], frame.loc[is_clock, "evaluated_at"], strict=True)}
        clocks = {stream_stat(self.stream, shard_clock_field(shard)): at for shard, at in clock_of.items()}
        ranked, save_ranks = self.ranks.merge(frame.loc[is_rank, TRANSITION_COLUMNS], clock_of)
        transitions = frame.loc[~is_clock & ~is_rank, TRANSITION_COLUMNS]
        if ranked:
            transitions = pd.concat([transitions, transition_frame(ranked)], ignore_index=True)
        checked_kinds(transitions)  # a bad row fails the batch before any of it is stored or handed over
        now, later = self._split(transitions)
        written = self._store(now)
        # The clocks only after the alerts: a shard's clock says its alerts up to there are stored. While the
        # handoff holds any, they go with its last piece and are reported once it is stored.
        handed = self.handoff.put(later, clocks)
        save_ranks()  # only once their transitions are recorded or handed over (evaluator.spark.rank_sink)
        def stats() -> None:
            pipe = self.redis.pipeline(transaction=False)
            fields: dict[str, EncodableT] = {stream_stat(self.stream, "last_batch_id"): batch_id,
                                             stream_stat(self.stream, "last_batch_at"): time.time()}
            if not handed:
                fields.update(clocks)
            pipe.hset(self.keys.evaluator_stats, mapping=cast("dict[FieldT, EncodableT]", fields))
            pipe.hincrby(self.keys.evaluator_stats, "transitions", written)
            if len(later):
                pipe.hincrby(self.keys.evaluator_stats, "handed_over", len(later))
            pipe.hincrbyfloat(self.keys.evaluator_stats, "sink_ms_total", (time.perf_counter() - started) * 1000)
            pipe.execute()
        self.outage.ride_out(stats)
