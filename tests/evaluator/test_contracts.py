"""What crosses a process boundary survives its own serialisation: transitions, previews, shard state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.collective import CollectiveIndexes
from evaluator.preview import PREVIEW_SHOWN, PreviewAnswer, PreviewRequest
from evaluator.shard import Delta
from evaluator.spec import Aggregate, Condition
from evaluator.transition import KINDS, STATES, Transition, alert_id
from subscriptions.language import parse_condition
from tests.evaluator.test_shard import pane_rows
from tests.examples import examples

texts = st.text(max_size=12)
times = st.integers(0, 2**53)
finite = st.floats(allow_nan=False, allow_infinity=False)
transitions = st.builds(
    Transition, alert_id=st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    subscription_id=st.integers(1, 2**31), key=texts, state=st.sampled_from(STATES),
    value=st.none() | finite, window_start=times, window_end=times, evaluated_at=times, kind=st.sampled_from(KINDS))


@given(transitions)
def test_a_transition_reads_back_as_written(t: Transition) -> None:
    payload = t.to_json()
    assert Transition.from_json(payload) == t
    assert Transition.from_json(payload.encode()).to_json() == payload
    # the sink's bytes before the contract: the fields in order, compact
    assert payload == json.dumps(t.to_dict(), separators=(",", ":"))


@given(transitions, st.sampled_from(KINDS))
def test_to_dict_is_every_field_in_order_and_kind_only_for_a_crossing(t: Transition, kind: str) -> None:
    # to_dict is written out field by field: it must stay every field, field order included, or the sink's bytes
    # and the alert ids downstream would change
    t = t._replace(kind=kind)
    expected = t._asdict()
    if kind == "state":
        del expected["kind"]
    assert list(t.to_dict().items()) == list(expected.items())


def test_a_transition_takes_spark_row_numbers_and_refuses_what_is_not_one() -> None:
    row = {"alert_id": alert_id(3, "K", "firing", 10), "subscription_id": np.int64(3), "key": "K", "state": "firing",
           "value": np.float64(2.5), "window_start": np.int64(0), "window_end": np.int64(10),
           "evaluated_at": np.int64(10)}
    t = Transition.from_dict(row)
    assert type(t.subscription_id) is int and type(t.value) is float and t.to_json().count('"value":2.5') == 1
    with pytest.raises(ValueError, match="state"):
        Transition.from_dict({**row, "state": "clock"})
    with pytest.raises(ValueError, match="key"):
        Transition.from_dict({**row, "key": 7})
    with pytest.raises(KeyError):
        Transition.from_dict({k: v for k, v in row.items() if k != "evaluated_at"})


CONDITIONS = [
    "COUNT(*) OVER 5s > 8", "SUM(volume) OVER 10s BETWEEN 1 AND 600", "AVG(price) OVER 5s > 101",
    "MAX(price) OVER 10s >= 108", "MIN(price) OVER 5s < 92", "QUANTILE(price, 0.9) OVER 5s > 104",
    "MAX(price) - MIN(price) OVER 10s > 8%", "LAST(price) - AVG(price) OVER 5s > 2",
]


@given(st.sampled_from(CONDITIONS), st.none() | st.frozensets(texts, max_size=5),
       st.floats(0, 2e9, allow_nan=False))
def test_a_preview_request_reads_back_as_written(text: str, keys: frozenset[str] | None, at: float) -> None:
    request = PreviewRequest(parse_condition(text), keys, at)
    assert PreviewRequest.from_json(request.to_json()) == request


@given(st.integers(0, 2**31), st.none() | times, st.dictionaries(texts, finite, max_size=80), st.integers(0, 10**6))
def test_a_preview_answer_reads_back_and_lists_the_most_extreme(shard: int, at: int | None,
                                                                 matched: dict[str, float], watched: int) -> None:
    answer = PreviewAnswer.of(shard, at, matched, watched)
    assert PreviewAnswer.from_json(answer.to_json()) == answer
    assert answer.total == len(matched) and len(answer.matches) == min(len(matched), PREVIEW_SHOWN)
    if answer.matches:
        weakest = abs(answer.matches[-1][1])
        assert all(abs(v) >= weakest for _, v in answer.matches)
        assert all(abs(v) <= weakest for k, v in matched.items() if (k, v) not in answer.matches)


@given(st.integers(0, 2**31), st.none() | times, texts)
def test_a_failed_preview_answer_reads_back_with_its_reason(shard: int, at: int | None, error: str) -> None:
    answer = PreviewAnswer.failed(shard, at, error)
    assert PreviewAnswer.from_json(answer.to_json()) == answer and answer.error == error
    assert "error" not in PreviewAnswer.of(shard, at, {}, 0).to_json()  # an answer reads as it did before errors


ATTRS = ("price", "volume")
PANE = 1_000


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ABCDE"), st.integers(0, 3), st.integers(1, 5),
                          st.integers(0, 1_000), st.integers(0, 10**6)), max_size=60),
       st.sampled_from([Aggregate.COUNT, Aggregate.SUM, Aggregate.MAX, Aggregate.MIN]), st.integers(0, 2_000))
def test_indexes_restored_from_their_parts_answer_as_before(steps, aggregate, threshold) -> None:
    indexes = CollectiveIndexes(ATTRS, p=2, bucket_ms=PANE)
    pane = 0
    for key, advance, count, price, volume in steps:
        pane += advance
        sums = np.array([[price * count], [volume * count]], dtype=float)
        extremes = np.array([[price], [volume]], dtype=float)
        indexes.add_panes([key], np.array([pane * PANE]), np.array([count]), sums, extremes, extremes)
    parts = indexes.to_parts()
    restored = CollectiveIndexes.from_parts(ATTRS, parts)
    assert restored.to_parts() == parts
    condition = Condition(aggregate, None if aggregate is Aggregate.COUNT else "volume", 5 * PANE,
                          low=float(threshold))
    now = pane * PANE + PANE - 1
    assert restored.matching(condition, now) == indexes.matching(condition, now)
    with pytest.raises(ValueError, match="index parts"):
        CollectiveIndexes.from_parts(ATTRS, parts[:-1])


@given(st.lists(st.tuples(st.sampled_from("ABCD"), st.integers(0, 10**6), finite, finite), max_size=30),
       st.dictionaries(st.integers(0, 7), times, max_size=4), st.none() | times, st.none() | times,
       st.lists(st.tuples(st.integers(1, 99), st.sampled_from("ABCD"), st.sampled_from(STATES)), max_size=10),
       st.lists(st.integers(1, 99), max_size=5), st.booleans())
def test_a_shard_delta_reads_back_as_written(events, progress, evaluated_at, applied_until, changes, dropped,
                                            stale) -> None:
    delta = Delta(pane_rows(events), progress, evaluated_at, applied_until, changes, dropped, stale)
    blob = delta.to_bytes()
    back = Delta.from_bytes(blob)
    assert (back.progress, back.evaluated_at, back.applied_until, back.changes, back.dropped_subscriptions,
            back.stale) == (progress, evaluated_at, applied_until, changes, dropped, stale)
    assert back.rows.keys.tolist() == delta.rows.keys.tolist() and back.to_bytes() == blob
