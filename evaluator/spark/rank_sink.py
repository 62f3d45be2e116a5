"""The sink's part of rank conditions: every shard's lists merged into transitions (``evaluator.rank``).

Each micro-batch the shards' rank entries reach the driver with their transitions; here each rank
subscription's merge state is read from Redis (``rank:<id>``, in the subscription's slot), the entries are
merged up to the boundary every shard has evaluated (the shards' clocks of this batch, or as the sink last
stored them), and the transitions go out with the batch's others. The states are written back only after
those transitions are recorded: a batch replayed after a crash in between merges from the old states again
and yields the same transitions, which the dedupe marks drop; a state already written ignores the replayed
boundaries. Subscriptions whose state holds lists waiting for a shard are kept in a set, so a later batch
merges them even if it brings them nothing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import pandas as pd
import redis

from core.redis_outage import Outage
from core.redis_schema import RedisKeys, shard_clock_field, stream_stat
from evaluator.rank import RankEntry, RankMerge, RankState
from evaluator.transition import Transition

STATE_TTL_S = 30 * 24 * 3600  # refreshed at every merge; a deleted subscription's state goes after a quiet month


class RankMerges:
    """Every rank subscription's merge of one stream's query (see the module doc)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, outage: Outage, stream: str,
                 shard_ids: Sequence[int] = ()) -> None:
        self.redis, self.keys, self.outage, self.stream = client, keys, outage, stream
        self.shard_ids = tuple(shard_ids)  # the query's shards (empty: those whose clocks this batch carries)
        # The subscriptions waiting, as this sink last wrote them: read from Redis once (a restarted driver's), then
        # kept here - one sink writes a stream's set - so a batch without ranks costs no round trip
        self._waiting: set[int] | None = None

    def merge(self, rows: pd.DataFrame, clocks: Mapping[int, int]) -> tuple[list[Transition], Callable[[], None]]:
        """The transitions of this batch's rank entries (``rows``, in the output schema) and of any waiting, and
        the write of the new states, to run once those transitions are recorded."""
        entries = [RankEntry.from_row(row) for row in rows.itertuples(index=False, name=None)]
        waiting_key = self.keys.rank_waiting(self.stream)
        if self._waiting is None:
            self._waiting = {int(s) for s in self.outage.ride_out(lambda: self.redis.smembers(waiting_key))}
        by_sid: dict[int, list[RankEntry]] = defaultdict(list)
        for entry in entries:
            by_sid[entry.subscription_id].append(entry)
        sids = sorted(by_sid.keys() | self._waiting)
        if not sids:
            return [], lambda: None
        through = self._through(clocks)
        stored = self.outage.ride_out(lambda: self._read(sids))
        transitions: list[Transition] = []
        states: dict[int, RankState] = {}
        for sid in sids:
            merge = RankMerge(sid, stored.get(sid))
            transitions += merge.merge(by_sid.get(sid, ()), through if through is not None else -1)
            states[sid] = merge.state
        return transitions, lambda: self.outage.ride_out(lambda: self._write(states, waiting_key))

    def _through(self, clocks: Mapping[int, int]) -> int | None:
        """The last boundary every shard has evaluated: this batch's clocks, a shard missing from it as stored."""
        shard_ids = self.shard_ids or tuple(clocks)
        missing = [s for s in shard_ids if s not in clocks]
        known = dict(clocks)
        if missing:
            fields = [stream_stat(self.stream, shard_clock_field(s)) for s in missing]
            values = self.outage.ride_out(lambda: self.redis.hmget(self.keys.evaluator_stats, fields))
            for shard, value in zip(missing, values, strict=True):
                if value is not None:
                    known[shard] = int(value)
        if not shard_ids or any(s not in known for s in shard_ids):
            return None
        return min(known[s] for s in shard_ids)

    def _read(self, sids: list[int]) -> dict[int, RankState]:
        pipe = self.redis.pipeline(transaction=False)
        for sid in sids:
            pipe.get(self.keys.rank_state(sid))
        return {sid: RankState.from_dict(json.loads(blob)) for sid, blob in zip(sids, pipe.execute(), strict=True)
                if blob is not None}

    def _write(self, states: Mapping[int, RankState], waiting_key: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for sid, state in states.items():
            pipe.set(self.keys.rank_state(sid), json.dumps(state.to_dict(), separators=(",", ":")), ex=STATE_TTL_S)
        held = [sid for sid, state in states.items() if state.waiting]
        done = [sid for sid, state in states.items() if not state.waiting]
        if held:
            pipe.sadd(waiting_key, *held)
        if done:
            pipe.srem(waiting_key, *done)
        pipe.execute()
        self._waiting = (self._waiting or set()) - set(done) | set(held)
