"""The evaluator sink alone: µs per transition from a micro-batch's frame into Redis.

    python benchmarks/sink.py            # prints one table
    python benchmarks/sink.py --quick    # smoke run

A Redis server of its own (every transition stored by its batch: ``TOCSIN_SINK_BATCH_TRANSITIONS`` unset, so
no handoff); each row hands ``RedisAlertSink`` a frame shaped as the operator's output
(``TRANSITIONS_SCHEMA`` rows plus one clock row per shard) through a stand-in for Spark's DataFrame
whose ``toPandas`` returns it, so the time is the sink's own: building the payloads and its Redis
round trips; *CPU* counts this process and the Redis server, which other jobs on the machine do not
inflate. Each batch is written twice: *new* is the first write, *replay* the same batch again (a
micro-batch replayed after a crash: it must write nothing). Numbers are printed, never asserted.

*Of which Redis* is the server's own CPU per transition: Redis runs scripts on one core, so one
Redis node cannot store alerts faster than its inverse (*Redis's ceiling*), however many cores the
evaluator has: the floor of any workload whose transitions per event are known (issue 33's key
churn and first evaluation). *Of which its writes*: the part spent in the commands the script calls
(``INFO commandstats``: the seen set's check and update, the two stream entries, the firing hash and
counters), which no rewrite of the script removes while each alert is stored as it is; the rest is the
script itself. *Redis bytes kept per transition*: the growth of ``used_memory``, what each stored alert
costs the node until its id leaves the seen set (``TOCSIN_SINK_DEDUPE_TTL_S``, 7 days) and the capped
streams trim it.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import pandas as pd
import redis
from pyspark.sql import DataFrame

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, table
from core import cli
from core.redis_schema import RedisKeys
from core.settings import Settings
from devstack.services import free_port, start_redis
from evaluator.spark.sink import RedisAlertSink, clock_record
from evaluator.transition import State, alert_id


class Frame:
    """What ``foreachBatch`` hands the sink, already computed."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def toPandas(self) -> pd.DataFrame:  # noqa: N802 - Spark's name
        return self.frame.copy()


def batch_frame(transitions: int, subscriptions: int, keys: int, batch: int, seed: int = 1) -> pd.DataFrame:
    """``transitions`` distinct (subscription, key) transitions, two thirds firing, and two shards' clocks."""
    rng = random.Random(seed * 1_000 + batch)
    evaluated_at = 1_700_000_000_000 + batch * 1_000
    rows = []
    for _ in range(transitions):
        sid, key = rng.randint(1, subscriptions), f"S{rng.randrange(keys):05d}"
        state: State = "firing" if rng.random() < 2 / 3 else "resolved"
        rows.append({"alert_id": alert_id(sid, key, state, evaluated_at), "subscription_id": sid, "key": key,
                     "state": state, "value": round(rng.uniform(1, 1_000), 2) if state == "firing" else None,
                     "window_start": evaluated_at - 60_000, "window_end": evaluated_at,
                     "evaluated_at": evaluated_at})
    rows += [clock_record(shard, evaluated_at) for shard in range(2)]
    return pd.DataFrame.from_records(rows)


def run(settings: Settings, transitions: int, subscriptions: int, batches: int) -> list[object]:
    sink = RedisAlertSink(settings)
    frames = [batch_frame(transitions, subscriptions, 5_000, b) for b in range(batches)]
    client = redis.Redis.from_url(settings.redis_url)
    new_s = replay_s = new_cpu = redis_cpu = 0.0
    memory, writes_us = used_memory(client), 0
    for b, frame in enumerate(frames):
        started, cpu, server, writes = time.perf_counter(), time.process_time(), redis_cpu_s(client), writes_usec(client)
        sink(cast("DataFrame", Frame(frame)), b)
        new_s += time.perf_counter() - started
        redis_cpu += redis_cpu_s(client) - server
        writes_us += writes_usec(client) - writes
        new_cpu += time.process_time() - cpu
        started = time.perf_counter()
        sink(cast("DataFrame", Frame(frame)), b)
        replay_s += time.perf_counter() - started
    stored = client.xlen(RedisKeys(settings).alerts_stream)
    n = transitions * batches
    return [f"{transitions:,}", f"{subscriptions:,}", batches, new_s * 1e6 / n, (new_cpu + redis_cpu) * 1e6 / n,
            redis_cpu * 1e6 / n, writes_us / n, f"{1 / (redis_cpu / n):,.0f}",
            (used_memory(client) - memory) / n,
            replay_s * 1e6 / n, new_s * 1e3 / batches, f"{stored:,}"]


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis server used so far: what other jobs on the machine do not inflate."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def writes_usec(client: redis.Redis) -> int:
    """Microseconds Redis spent in the commands its scripts called (``INFO commandstats``, scripts and
    bookkeeping left out): what storing the alerts costs however the script is written."""
    return sum(stat["usec"] for name, stat in client.info("commandstats").items()
               if name.removeprefix("cmdstat_") in WRITES)


WRITES = ("smismember", "sadd", "expire", "exists", "xadd", "hset", "hdel", "hincrby")  # the sink script's commands


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.sink")
    parser.add_argument("--quick", action="store_true")
    add_markdown_option(parser)
    args = parser.parse_args()
    shapes = [(100, 10_000, 5), (2_000, 10_000, 5), (20_000, 10_000, 3), (20_000, 1_000, 3),
              (200_000, 100_000, 2)]
    if args.quick:
        shapes = [(50, 100, 2)]
    work = Path(tempfile.mkdtemp(prefix="tocsin-bench-sink-"))
    port = free_port()
    server = start_redis(port, work / "redis", work / "redis.log")
    rows = []
    try:
        for i, (transitions, subscriptions, batches) in enumerate(shapes):
            settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_prefix=f"bench-sink-{i}",
                                sink_batch_transitions=None)  # every transition stored by its batch: no handoff
            rows.append(run(settings, transitions, subscriptions, batches))
    finally:
        server.stop()
    table("Sink: µs per transition from the batch's frame into Redis (new = first write, replay = the same "
          "batch again, which writes nothing)",
          ["transitions/batch", "subscriptions", "batches", "µs/transition new", "CPU µs/transition new",
           "of which Redis", "of which its writes", "Redis's ceiling, transitions/s", "Redis bytes kept per transition",
           "µs/transition replay", "ms per batch", "alerts stored"], rows)


if __name__ == "__main__":
    with markdown_run():
        main()
