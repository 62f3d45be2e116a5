"""A declared stream's parser and shard operator, batch by batch, with the state store held in memory (no Spark:
what Spark adds -- the shuffle, the state store's files -- is tested in tests/evaluator/spark/test_streams.py).

The query of a stream is restarted with a new optional attribute on the same state: its windows and firing
state carry on (no second firing, no resolution) and the new attribute is aggregated from then on."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pandas as pd
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import Attribute, Dimension, StreamSchema
from evaluator.catalog import Catalog
from evaluator.spark.operator import ShardProcessor
from evaluator.spark.registry import attribute_columns, shape_of
from evaluator.spark.shard_runner import forget_copies
from evaluator.spark.stream_parse import StreamPaneParser
from evaluator.spec import Condition, SubscriptionSpec
from subscriptions.language import parse_condition
from subscriptions.service import publish_catalog
from tests.evaluator.oracle import oracle
from tests.examples import examples

HOSTS = StreamSchema(name="hosts", attributes=(Attribute(name="cpu", min=0), Attribute(name="mem", min=0)),
                     dimensions=(Dimension(name="region"),), retention_ms=60_000, partitions=1)
WITH_DISK = HOSTS.model_copy(update={"attributes": (*HOSTS.attributes, Attribute(name="disk", required=False))})
SHARDS = (0,)
T0 = 1_700_000_000_000


class _Value:
    def __init__(self) -> None:
        self.value: tuple | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple | None:
        return self.value

    def update(self, value: tuple) -> None:
        self.value = value


class _Map:
    def __init__(self) -> None:
        self.values: dict[tuple, tuple] = {}

    def getValue(self, key: tuple) -> tuple | None:
        return self.values.get(key)

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.values[key] = value

    def removeKey(self, key: tuple) -> None:
        self.values.pop(key, None)


class Handle:
    """The state of one shard, as Spark's state store keeps it between batches and across restarts."""

    def __init__(self) -> None:
        self.states: dict[str, Any] = {}

    def getValueState(self, name: str, schema: object) -> _Value:
        return self.states.setdefault(name, _Value())

    def getMapState(self, name: str, key: object, value: object) -> _Map:
        return self.states.setdefault(name, _Map())


def on_hosts(text: str, **changes: object) -> Condition:
    data = json.loads(json.dumps(parse_condition(text).to_dict()).replace('"price"', '"cpu"')
                      .replace('"volume"', '"mem"'))
    return Condition.from_dict({**data, "stream": "hosts", **changes})


def batch(settings: Settings, schema: StreamSchema, records: list[dict], beat: int | None) -> pd.DataFrame:
    """The parser's output for ``records`` (and a heartbeat at ``beat``) on the stream's one partition."""
    values = [json.dumps(r).encode() for r in records]
    if beat is not None:
        values.append(json.dumps({"kind": "heartbeat", "partition": 0, "ts": beat}).encode())
    raw = pd.DataFrame({"topic": "t", "partition": 0, "offset": range(len(values)), "value": pd.Series(values),
                        "value_bytes": pd.Series([len(v) for v in values], dtype=object),
                        "value_sha256": pd.Series([None] * len(values), dtype=object), "now": T0 + 600_000})
    parser = StreamPaneParser(settings, SHARDS, schema, attribute_columns((), schema))
    parsed = parser.parse(raw)
    return parser._frame(parsed.events(), parsed.progress).to_pandas()


def run(processor: ShardProcessor, frame: pd.DataFrame) -> list[dict]:
    out = pd.concat(list(processor.handleInputRows((0,), iter([frame]), None)), ignore_index=True)
    return [r for r in out.to_dict("records") if r["state"] != "clock"]


def test_a_stream_restarted_with_a_new_attribute_keeps_its_windows_and_firing_state(settings: Settings,
                                                                                     tmp_path: Any) -> None:
    settings = settings.model_copy(update={"checkpoint_dir": str(tmp_path / "cp"), "max_window_ms": 20_000})
    client = redis.Redis.from_url(settings.redis_url)
    busy = SubscriptionSpec(1, on_hosts("COUNT(*) OVER 5s >= 3"))
    heavy = SubscriptionSpec(2, on_hosts("SUM(volume) OVER 5s > 100"))
    disk = SubscriptionSpec(3, on_hosts("SUM(volume) OVER 5s > 10", attribute="disk"))
    trades = SubscriptionSpec(4, parse_condition("COUNT(*) OVER 5s >= 1"))  # another stream's: never here
    assert publish_catalog(client, RedisKeys(settings), Catalog(1, [busy, heavy, disk, trades]))
    forget_copies()
    handle = Handle()
    first = ShardProcessor(settings, 1, SHARDS, shape_of(HOSTS), attribute_columns((), HOSTS))
    first.init(handle)
    out = run(first, batch(settings, HOSTS, [{"key": "H1", "ts": T0 + i * 300, "cpu": 1, "mem": 40}
                                             for i in range(5)], T0 + 4_000))
    assert {(r["subscription_id"], r["key"], r["state"]) for r in out} == {(1, "H1", "firing"), (2, "H1", "firing")}

    forget_copies()  # a restarted query on another worker: the state store only
    second = ShardProcessor(settings, 1, SHARDS, shape_of(WITH_DISK),
                            attribute_columns(first.config.attributes, WITH_DISK))
    assert second.config.attributes == ("cpu", "mem", "disk")
    second.init(handle)
    out = run(second, batch(settings, WITH_DISK, [{"key": "H1", "ts": T0 + 4_000 + i * 300, "cpu": 1, "mem": 40,
                                                   "disk": 6} for i in range(5)], T0 + 8_000))
    assert [(r["subscription_id"], r["key"], r["state"], r["value"]) for r in out] == [(3, "H1", "firing", 24.0)]
    # at +5 s the window [0, 5 s) holds the 5 earlier events (no disk: 0) and 4 later ones (6 each): 24


# Equal times in different cells: LAST, CHANGE and tuple windows take the newest by (time, arrival), whichever
# cell (dimension values) an event is in; the oracle (tests/evaluator/oracle.py) reads the events in arrival order.
TIE_SPECS = [SubscriptionSpec(1, on_hosts("LAST(price) OVER 3s > 50")),
             SubscriptionSpec(2, on_hosts("CHANGE(price) OVER 3s > 0")),
             SubscriptionSpec(3, on_hosts("MIN(price) OVER LAST 2 EVENTS > 50")),
             SubscriptionSpec(4, on_hosts("LAST(price) - AVG(price) OVER 3s > 0"))]
tie_record = st.fixed_dictionaries({
    "key": st.sampled_from(["H1", "H2"]), "ts": st.sampled_from([T0, T0 + 1, T0 + 1_000, T0 + 1_001, T0 + 2_000]),
    "cpu": st.integers(0, 100)}, optional={"region": st.sampled_from(["eu", "us"])})


_VERSIONS = itertools.count(1)


@hypothesis_settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(tie_record, min_size=1, max_size=12), min_size=1, max_size=3),
       every_event=st.booleans())
def test_among_equal_times_the_newest_is_the_last_to_arrive_whatever_its_cell(
        settings: Settings, batches: list[list[dict]], every_event: bool) -> None:
    """Keys H1 and H2, with or without a region (so in up to three cells each), at five times, over 1-3 batches."""
    run_settings = settings.model_copy(update={"max_window_ms": 10_000, "watermark_delay_ms": 0,
                                               "tuple_max_events": 2 if every_event else 0,
                                               "quantile_max_window_ms": 10_000 if every_event else 0})
    specs = TIE_SPECS if every_event else [TIE_SPECS[0], TIE_SPECS[3]]  # LAST alone: each row's newest event only
    assert publish_catalog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings),
                           Catalog(next(_VERSIONS), specs))
    forget_copies()
    processor = ShardProcessor(run_settings, 1, SHARDS, shape_of(HOSTS), attribute_columns((), HOSTS))
    processor.init(Handle())
    seen = 0  # no late events (the oracle counts every event): a batch's panes are not before an earlier batch's
    for i, records in enumerate(batches):
        batches[i] = [r for r in records if r["ts"] // 1_000 * 1_000 >= seen]
        seen = max([seen, *(r["ts"] // 1_000 * 1_000 for r in records)])
    got: set[tuple] = set()
    end = T0 + 6_000
    for i, records in enumerate(batches):
        frame = batch(run_settings, HOSTS, [{**r, "mem": 1} for r in records], end if i == len(batches) - 1 else None)
        got |= {(r["subscription_id"], r["key"], r["state"], r["evaluated_at"]) for r in run(processor, frame)}
    events = [(r["key"], r["ts"], 1.0, float(r["cpu"])) for records in batches for r in records]  # cpu: 4th
    assert got == oracle(events, specs, end // 1_000 * 1_000, 1_000, 10_000), (batches, every_event)
