"""The evaluator's Spark Structured Streaming query.

    Kafka (Python data source)
      -> parse + validate + pre-aggregate per (key, pane)   [mapInPandas, per Kafka partition]
      -> event-time watermark (heartbeats included)
      -> stateful evaluation keyed by key                   [applyInPandasWithState, RocksDB]
      -> transitions to Redis                               [foreachBatch, idempotent]

Because Kafka partitions by key, one input partition holds all of a key's events
in a micro-batch, so the per-partition pre-aggregation is complete and the
shuffle carries one row per (key, pane) instead of one per event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import pandas as pd
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from evaluator.naive import evaluate_key
from evaluator.panes import PaneStore
from evaluator.spark.catalog_source import CatalogSource
from infra.redis_schema import RedisKeys
from infra.settings import Settings
from ingest.model import ATTRIBUTES, DeadLetter, Heartbeat, parse_event

#: Heartbeats travel as rows of this key (not a valid event key) so they move the watermark.
#: They must reach the stateful operator: Spark pushes a filter on other columns below the
#: watermark operator, which would hide them from it.
HEARTBEAT_KEY = ""

STAT_FIELDS = ("count", *(f"{stat}_{a}" for a in ATTRIBUTES for stat in ("sum", "min", "max")))

PANES_SCHEMA = (
    "key string, pane_start long, event_time timestamp, count long, "
    + ", ".join(f"{f} double" for f in STAT_FIELDS[1:])
)
TRANSITIONS_SCHEMA = (
    "alert_id string, subscription_id long, key string, state string, value double, "
    "window_start long, window_end long, evaluated_at long"
)
STATE_SCHEMA = "panes binary, firing binary, evaluated_at long"


@lru_cache(maxsize=4)
def _dead_letter_producer(bootstrap: str):  # noqa: ANN202 - one producer per worker process
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, acks="all")


class PaneParser:
    """mapInPandas: raw Kafka rows -> pane aggregates and heartbeats; rejects to the dead-letter topic.

    Dead letters are at-least-once: a retried task may send one twice, never zero times.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        pane_ms = self.settings.pane_ms
        for raw in frames:
            events: list[tuple] = []
            heartbeats: list[int] = []
            dead: list[DeadLetter] = []
            for topic, partition, offset, value in zip(raw["topic"], raw["partition"], raw["offset"], raw["value"]):
                source = f"{topic}[{partition}]@{offset}"
                if value is None:
                    dead.append(DeadLetter(reason="record: empty value", raw="", source=source))
                    continue
                if b'"heartbeat"' in value:
                    try:
                        heartbeats.append(Heartbeat.model_validate_json(value).ts)
                        continue
                    except ValueError:
                        pass  # not a heartbeat after all: validate it as an event
                parsed = parse_event(value, source=source)
                if isinstance(parsed, DeadLetter):
                    dead.append(parsed)
                else:
                    events.append((parsed.key, parsed.ts, *(getattr(parsed, a) for a in ATTRIBUTES)))
            if dead:
                producer = _dead_letter_producer(self.settings.kafka_bootstrap)
                for letter in dead:
                    producer.send(self.settings.dead_letter_topic, value=letter.to_json())
                producer.flush()
            yield _pane_frame(events, heartbeats, pane_ms)


def _pane_frame(events: list[tuple], heartbeats: list[int], pane_ms: int) -> pd.DataFrame:
    columns = ["key", "pane_start", "event_time", *STAT_FIELDS]
    parts: list[pd.DataFrame] = []
    if events:
        df = pd.DataFrame.from_records(events, columns=["key", "ts", *ATTRIBUTES])
        df["pane_start"] = (df["ts"] // pane_ms) * pane_ms
        spec: dict[str, tuple[str, str]] = {"count": ("ts", "size"), "max_ts": ("ts", "max")}
        for a in ATTRIBUTES:
            spec.update({f"sum_{a}": (a, "sum"), f"min_{a}": (a, "min"), f"max_{a}": (a, "max")})
        panes = df.groupby(["key", "pane_start"], sort=False).agg(**spec).reset_index()
        panes["event_time"] = pd.to_datetime(panes.pop("max_ts"), unit="ms", utc=True)
        parts.append(panes)
    if heartbeats:
        hb = pd.DataFrame(
            {
                "key": [HEARTBEAT_KEY],
                "pane_start": [0],
                "event_time": pd.to_datetime([max(heartbeats)], unit="ms", utc=True),
                "count": [0],
                **{f: [0.0] for f in STAT_FIELDS[1:]},
            }
        )
        parts.append(hb)
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    frame = pd.concat(parts, ignore_index=True)[columns]
    frame["count"] = frame["count"].astype("int64")
    return frame


class KeyEvaluator:
    """applyInPandasWithState: per key, keep panes and the firing set; evaluate at each pane boundary.

    The evaluation time is the watermark rounded down to a pane boundary, so every
    window evaluated is complete up to the allowed disorder. Event-time timeouts
    re-evaluate keys that receive nothing, so their windows drain and alerts resolve.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._catalog: CatalogSource | None = None

    def __getstate__(self) -> dict:
        return {"settings": self.settings, "_catalog": None}

    def catalog(self) -> CatalogSource:
        if self._catalog is None:
            self._catalog = CatalogSource(self.settings)
        return self._catalog

    def __call__(self, key: tuple, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        (k,) = key
        if k == HEARTBEAT_KEY:
            return
        pane_ms, horizon = self.settings.pane_ms, self.settings.max_window_ms
        if state.exists:
            blob, firing_blob, evaluated_at = state.get
            store = PaneStore.from_bytes(bytes(blob))
            firing = set(np.frombuffer(bytes(firing_blob), dtype=np.int64).tolist())
        else:
            store, firing, evaluated_at = PaneStore(len(ATTRIBUTES)), set(), 0
        watermark = max(int(state.getCurrentWatermarkMs()), 0)
        tau = (watermark // pane_ms) * pane_ms

        late = 0
        if not state.hasTimedOut:
            for pdf in frames:
                too_old = pdf["pane_start"].to_numpy() < max(evaluated_at, tau) - horizon
                late += int(pdf["count"].to_numpy()[too_old].sum())
                pdf = pdf[~too_old]
                store.merge(
                    pdf["pane_start"].to_numpy(),
                    pdf["count"].to_numpy(),
                    np.vstack([pdf[f"sum_{a}"].to_numpy() for a in ATTRIBUTES]),
                    np.vstack([pdf[f"min_{a}"].to_numpy() for a in ATTRIBUTES]),
                    np.vstack([pdf[f"max_{a}"].to_numpy() for a in ATTRIBUTES]),
                )
        if late:
            self.catalog().redis.hincrby(RedisKeys(self.settings).evaluator_stats, "late_events_dropped", late)

        transitions = []
        if tau > evaluated_at:
            store.expire(tau - horizon)
            transitions, firing = evaluate_key(k, store, self.catalog().current().for_key(k), firing, tau, ATTRIBUTES)
            evaluated_at = tau

        if len(store) == 0 and not firing:
            state.remove()
        else:
            state.update((store.to_bytes(), np.array(sorted(firing), dtype=np.int64).tobytes(), evaluated_at))
            state.setTimeoutTimestamp(max(tau, evaluated_at) + pane_ms)
        if transitions:
            yield pd.DataFrame.from_records([t.to_dict() for t in transitions])


_RECORD_TRANSITION = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[4]) then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'alert', ARGV[1])
  if ARGV[2] == 'firing' then
    redis.call('HSET', KEYS[3], ARGV[3], ARGV[1])
  else
    redis.call('HDEL', KEYS[3], ARGV[3])
  end
  redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
  return 1
end
return 0
"""


class RedisAlertSink:
    """foreachBatch: record transitions in Redis exactly once per alert id.

    One Lua script per transition makes "seen?" and "record" atomic, so a replayed
    micro-batch (after a crash between Redis and Spark's commit) adds nothing.
    """

    DEDUPE_TTL_S = 7 * 24 * 3600
    STREAM_MAXLEN = 1_000_000

    def __init__(self, settings: Settings) -> None:
        self.keys = RedisKeys(settings)
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.script = self.redis.register_script(_RECORD_TRANSITION)

    def write(self, transitions: list[dict]) -> int:
        pipe = self.redis.pipeline(transaction=False)
        for t in transitions:
            payload = json.dumps(t, separators=(",", ":"))
            self.script(
                keys=[
                    self.keys.alert_mark(t["alert_id"]),
                    self.keys.alerts_stream,
                    self.keys.firing(t["subscription_id"]),
                    self.keys.counters(t["subscription_id"]),
                ],
                args=[payload, t["state"], t["key"], self.DEDUPE_TTL_S, self.STREAM_MAXLEN],
                client=pipe,
            )
        return sum(int(x) for x in pipe.execute())

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = [r.asDict() for r in batch.collect()]
        for row in rows:
            value = row["value"]
            row["value"] = None if value is None or np.isnan(value) else float(value)
        written = self.write(rows) if rows else 0
        self.redis.hset(self.keys.evaluator_stats, mapping={"last_batch_id": batch_id})
        self.redis.hincrby(self.keys.evaluator_stats, "transitions", written)


def build_query(spark: SparkSession, settings: Settings) -> StreamingQuery:
    reader = (
        spark.readStream.format("tocsin_kafka")
        .option("bootstrap", settings.kafka_bootstrap)
        .option("topic", settings.events_topic)
        .option("requestTimeoutMs", str(settings.kafka_request_timeout_ms))
    )
    if settings.source_max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(settings.source_max_records_per_trigger))
    panes = (
        reader.load()
        .select("topic", "partition", "offset", "value")
        .mapInPandas(PaneParser(settings), PANES_SCHEMA)
        .withWatermark("event_time", f"{settings.watermark_delay_ms} milliseconds")
    )
    transitions = panes.groupBy("key").applyInPandasWithState(
        KeyEvaluator(settings),
        TRANSITIONS_SCHEMA,
        STATE_SCHEMA,
        "append",
        GroupStateTimeout.EventTimeTimeout,
    )
    return (
        transitions.writeStream.foreachBatch(RedisAlertSink(settings))
        .option("checkpointLocation", str(settings.checkpoint_path))
        .trigger(processingTime=settings.trigger_interval)
        .queryName("tocsin-evaluator")
        .start()
    )
