"""The evaluator's view of streams (``evaluator.streams``): the registry decoder, and each stream's share of the
catalog, followed change by change, against a rebuild from the whole catalog (the brute-force oracle)."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.streams import Attribute, Dimension, StreamSchema
from evaluator.catalog import Catalog, CatalogChange
from evaluator.spark.registry import decode_registry, shape_of
from evaluator.spec import SubscriptionSpec
from evaluator.streams import StreamCatalogs, StreamShape, refusal
from ingest.model import ATTRIBUTES
from subscriptions.language import parse_condition
from tests.examples import examples

SCHEMA = StreamSchema(name="hosts", attributes=(Attribute(name="price"), Attribute(name="volume", required=False)),
                      dimensions=(Dimension(name="region"),), retention_ms=60_000, partitions=1)
HOSTS = shape_of(SCHEMA)


def test_decode_registry_keeps_what_it_can_read() -> None:
    raw = {b"hosts": SCHEMA.model_dump_json().encode(), b"broken": b"{", b"other": SCHEMA.model_dump_json().encode()}
    schemas, problems = decode_registry(raw)
    assert schemas == {"hosts": SCHEMA}
    assert set(problems) == {"broken", "other"} and "names the stream 'hosts'" in problems["other"]


def test_refusal_names_what_the_stream_lacks() -> None:
    on_hosts = {"stream": "hosts"}
    for text in ("SUM(volume) OVER 5s > 1", "COUNT(*) OVER 5s > 1", "AVG(price) OVER 5s > 1",
                 "MAX(volume) OVER 5s > 1"):  # an optional attribute's aggregates are over the events carrying it
        assert refusal(dataclasses.replace(parse_condition(text), **on_hosts), HOSTS) is None
    filtered = dataclasses.replace(parse_condition("LAST(volume) OVER 5s > 1"), where=(("region", ("eu",)),),
                                   key_prefix="web-", **on_hosts)
    assert refusal(filtered, HOSTS) is None  # views (evaluator.views)
    assert refusal(dataclasses.replace(filtered, where=(("zone", ("a",)),)), HOSTS) == (
        "stream 'hosts' has no dimension 'zone'")
    assert refusal(dataclasses.replace(filtered, attribute="cpu"), HOSTS) == "stream 'hosts' has no attribute 'cpu'"
    trades = StreamShape("trades", ATTRIBUTES)  # what the trades query evaluates (evaluator.spark.operator)
    assert refusal(parse_condition("SUM(volume) OVER 5s > 1"), trades) is None
    assert refusal(dataclasses.replace(parse_condition("SUM(volume) OVER 5s > 1"), attribute="vwap"), trades) == (
        "stream 'trades' has no attribute 'vwap'")


CONDITIONS = [parse_condition(text) for text in ("COUNT(*) OVER 5s > 1", "SUM(volume) OVER 5s > 1",
                                                  "MAX(volume) OVER 5s > 1", "AVG(price) OVER 5s > 1")]
CONDITIONS.append(dataclasses.replace(CONDITIONS[2], where=(("zone", ("a",)),)))  # hosts has no dimension zone


@st.composite
def spec(draw: st.DrawFn) -> SubscriptionSpec:
    condition = dataclasses.replace(draw(st.sampled_from(CONDITIONS)), stream=draw(st.sampled_from(["trades", "hosts"])))
    return SubscriptionSpec(draw(st.integers(1, 8)), condition)


def test_a_refusal_is_forgotten_once_the_subscription_moves_to_a_stream_that_evaluates_it() -> None:
    """Found by hypothesis in CI: the refusal was recorded by hosts' share after trades' share had admitted the
    moved subscription, and stayed, so stats listed an evaluated subscription as not evaluated."""
    shares, whole = StreamCatalogs(keep=5), Catalog.empty()
    for stream in ("trades", "hosts"):
        shares.share(whole, stream, HOSTS if stream == "hosts" else None)
    refused = dataclasses.replace(CONDITIONS[-1], stream="hosts")
    whole = whole.applied(CatalogChange(1, (SubscriptionSpec(1, refused),), ()), keep=5)
    whole = whole.applied(CatalogChange(2, (SubscriptionSpec(1, CONDITIONS[0]),), ()), keep=5)
    for stream in ("trades", "hosts"):  # both shares catch up over both changes: trades' first
        shares.share(whole, stream, HOSTS if stream == "hosts" else None)
    assert shares.refused == {}


@given(st.lists(st.tuples(st.lists(spec(), max_size=3), st.lists(st.integers(1, 8), max_size=2)), max_size=12),
       st.integers(0, 12))
@hypothesis_settings(max_examples=examples(150), deadline=None)
def test_a_stream_share_follows_the_whole_catalog(changes: list, read_every: int) -> None:
    whole = Catalog.empty()
    shares = StreamCatalogs(keep=5)
    for step, (upserts, removals) in enumerate(changes, 1):
        whole = whole.applied(CatalogChange(whole.version + 1, tuple({s.id: s for s in upserts}.values()),
                                            tuple(removals)), keep=5)
        if read_every and step % read_every:
            continue
        for stream, schema in (("trades", None), ("hosts", HOSTS)):
            share = shares.share(whole, stream, schema)
            expected = {s.id: s for s in whole.subscriptions if s.condition.stream == stream
                        and refusal(s.condition, schema) is None}
            assert share.version == whole.version
            assert {s.id: s for s in share.subscriptions} == expected
        assert shares.refused == {s.id: refusal(s.condition, HOSTS) for s in whole.subscriptions
                                  if s.condition.stream == "hosts" and refusal(s.condition, HOSTS) is not None}
