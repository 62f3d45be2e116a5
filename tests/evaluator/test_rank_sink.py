"""The sink's rank merges against real Redis: states kept per subscription, lists waiting for a shard behind the
others, and a batch seen twice adding nothing."""

from __future__ import annotations

import pandas as pd
import redis

from core.redis_outage import Outage
from core.redis_schema import RedisKeys, shard_clock_field, stream_stat
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.rank import Rank, RankEntry
from evaluator.spark.rank_sink import RankMerges
from evaluator.spark.sink import TRANSITION_COLUMNS


def rows(*entries: RankEntry) -> pd.DataFrame:
    return pd.DataFrame.from_records([e.to_row() for e in entries], columns=TRANSITION_COLUMNS)


def merged(merges: RankMerges, frame: pd.DataFrame, clocks: dict[int, int]) -> list[tuple]:
    transitions, save = merges.merge(frame, clocks)
    save()
    return [(t.subscription_id, t.key, t.state, t.evaluated_at) for t in transitions]


def test_lists_wait_for_the_shard_behind_then_merge_once(settings: Settings, redis_client: redis.Redis) -> None:
    keys = RedisKeys(settings)
    merges = RankMerges(redis_client, keys, Outage("test", settings, redis_client), TRADES, shard_ids=(3, 8))
    top1 = Rank(1)
    a = RankEntry(3, 5, 2_000, 0, "A", 7.0, True, top1)
    b = RankEntry(8, 5, 2_000, 0, "B", 9.0, True, top1)
    # shard 8 has not evaluated 2,000 (its stored clock says 1,000): both lists wait, in Redis
    redis_client.hset(keys.evaluator_stats, stream_stat(TRADES, shard_clock_field(8)), 1_000)
    assert merged(merges, rows(a), {3: 2_000}) == []
    assert redis_client.smembers(keys.rank_waiting(TRADES)) == {"5"}
    # the next batch brings shard 8's list and clock: 2,000 merges, B leads
    assert merged(merges, rows(b), {3: 2_000, 8: 2_000}) == [(5, "B", "firing", 2_000)]
    assert redis_client.smembers(keys.rank_waiting(TRADES)) == set()
    # that batch again (a replay after a crash before Spark's commit): nothing new
    assert merged(merges, rows(b), {3: 2_000, 8: 2_000}) == []
    # a new sink process reads the state back
    again = RankMerges(redis_client, keys, Outage("test", settings, redis_client), TRADES, shard_ids=(3, 8))
    later = RankEntry(3, 5, 3_000, 1_000, "A", 10.0, True, top1)
    assert merged(again, rows(later), {3: 3_000, 8: 3_000}) == [(5, "A", "firing", 3_000), (5, "B", "resolved", 3_000)]
    assert redis_client.ttl(keys.rank_state(5)) > 0


def test_a_batch_without_rank_entries_costs_one_read(settings: Settings, redis_client: redis.Redis) -> None:
    merges = RankMerges(redis_client, RedisKeys(settings), Outage("test", settings, redis_client), TRADES, (0,))
    transitions, save = merges.merge(rows(), {0: 5_000})
    save()
    assert transitions == []


def test_the_waiting_set_is_read_once_then_kept_by_the_sink(settings: Settings, redis_client: redis.Redis) -> None:
    """A restarted driver's sink reads which subscriptions wait; after that each batch's merge asks Redis nothing
    about them (one sink writes a stream's set), and still merges one that waits without new entries."""
    keys = RedisKeys(settings)
    merges = RankMerges(redis_client, keys, Outage("test", settings, redis_client), TRADES, shard_ids=(0, 1))
    waiting = RankEntry(0, 9, 2_000, 0, "A", 1.0, True, Rank(1))
    assert merged(merges, rows(waiting), {0: 2_000, 1: 1_000}) == []  # shard 1 behind: it waits
    redis_client.delete(keys.rank_waiting(TRADES))  # were the set read again, 9 would be forgotten
    assert merged(merges, rows(), {0: 2_000, 1: 2_000}) == [(9, "A", "firing", 2_000)]
    restarted = RankMerges(redis_client, keys, Outage("test", settings, redis_client), TRADES, shard_ids=(0, 1))
    redis_client.sadd(keys.rank_waiting(TRADES), 9)
    assert merged(restarted, rows(), {0: 3_000, 1: 3_000}) == []  # read once: 9 merged, nothing new waited
    assert redis_client.smembers(keys.rank_waiting(TRADES)) == set()
