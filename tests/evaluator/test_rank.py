"""Rank conditions (evaluator/rank.py): shards' lists merged equal a brute-force ranking of every key, however the
keys are spread over shards, whenever a shard restarts, and when the sink sees a batch twice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.catalog import Catalog
from evaluator.preview import PreviewAnswer, most_extreme
from evaluator.rank import EMPTY_KEY, Rank, RankBook, RankEntry, RankMerge, RankState
from evaluator.shard import Delta, ShardEvaluator
from evaluator.spec import Aggregate, Condition, SubscriptionSpec
from evaluator.transition import Transition
from tests.evaluator.oracle import Event, rank_oracle
from tests.evaluator.test_shard import CONFIG, DELAY, HORIZON, KEYS, PANE, pane_rows, progress_of, streams
from tests.examples import examples

MAX_MINUS_MIN = ("-", ("agg", "MAX", "price", None), ("agg", "MIN", "price", None))


def _condition(kind: object, attribute: str, window: int, rank: Rank) -> Condition:
    if kind == "EXPR":
        return Condition(Aggregate.EXPR, None, window, expression=MAX_MINUS_MIN, rank=rank)
    return Condition(Aggregate(kind), None if kind == "COUNT" else attribute, window, rank=rank)


ranks = st.builds(Rank, st.integers(1, len(KEYS)), st.booleans())
rank_conditions = st.builds(_condition, st.sampled_from(["COUNT", "SUM", "MAX", "MIN", "AVG", "LAST", "CHANGE", "EXPR"]),
                            st.sampled_from(["price", "volume"]), st.sampled_from([1_000, 2_000, 5_000]), ranks)
rank_catalogs = st.lists(st.tuples(rank_conditions, st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS),
                                                                                          min_size=1))),
                         min_size=1, max_size=4).map(
    lambda items: [SubscriptionSpec(i + 1, c, keys) for i, (c, keys) in enumerate(items)])


class Sink:
    """What the sink does with rank entries: per subscription, its merge state round-tripped through its JSON."""

    def __init__(self) -> None:
        self.states: dict[int, dict] = {}
        self.transitions: list[Transition] = []

    def take(self, entries: list[RankEntry], through: int, sids: list[int]) -> None:
        for sid in sids:
            stored = self.states.get(sid)
            merge = RankMerge(sid, RankState.from_dict(stored) if stored is not None else None)
            self.transitions += merge.merge([e for e in entries if e.subscription_id == sid], through)
            self.states[sid] = merge.state.to_dict()


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), specs=rank_catalogs, shards=st.integers(1, 3), data=st.data())
def test_merged_ranks_equal_the_oracle_however_keys_are_spread_and_shards_restart(stream, specs, shards, data) -> None:
    events, batches = stream
    home = {key: data.draw(st.integers(0, shards - 1), label=f"shard of {key}") for key in KEYS}
    restarts = data.draw(st.sets(st.tuples(st.integers(0, len(batches)), st.integers(0, shards - 1))), label="restarts")
    replayed = data.draw(st.sets(st.integers(0, len(batches))), label="batches the sink sees twice")
    snapshots_at = data.draw(st.sets(st.integers(0, len(batches))), label="snapshots")
    copies, saved = [], []
    for s in range(shards):
        copy = ShardEvaluator(CONFIG)
        copy.owns = lambda key, s=s: home[key] == s
        copies.append(copy)
        saved.append((copy.snapshot(), []))  # as the operator keeps state: a snapshot and the deltas after it
    catalog = Catalog(1, tuple(specs))
    sink = Sink()
    for i, batch in enumerate(batches):
        entries = []
        for s in range(shards):
            if (i, s) in restarts:  # another copy, from the state: its snapshot with the deltas replayed
                owns = copies[s].owns
                copies[s] = ShardEvaluator.from_snapshot(CONFIG, saved[s][0])
                copies[s].owns = owns
                for blob in saved[s][1]:
                    copies[s].replay(Delta.from_bytes(blob))
            own = [e for e in batch if home[e[0]] == s]
            _, delta = copies[s].step(pane_rows(own), progress_of(batch), catalog)
            saved[s] = (copies[s].snapshot(), []) if i in snapshots_at else (saved[s][0], [*saved[s][1], delta.to_bytes()])
            entries += [replace(e, shard=s) for e in copies[s].take_ranked()]
        clocks = [c.evaluated_at for c in copies]
        if None in clocks:
            assert not entries or shards == 1
            continue
        for _ in range(2 if i in replayed else 1):
            sink.take(entries, min(clocks), [spec.id for spec in specs])  # type: ignore[type-var]  # no None left
    through = min(c.evaluated_at or 0 for c in copies)
    if through == 0:
        return
    expected = rank_oracle(events, specs, through, PANE, HORIZON)
    got = {(t.subscription_id, t.key, t.state, t.evaluated_at): t.value for t in sink.transitions}
    assert len(got) == len(sink.transitions)  # nothing twice
    assert got.keys() == expected.keys()
    for at, value in expected.items():
        assert (got[at] == pytest.approx(value, rel=1e-9, abs=1e-9)) if value is not None else got[at] is None, \
            (at, got[at], value, specs)


def test_a_book_moves_only_the_keys_given() -> None:
    book = RankBook(top=True)
    book.update([("A", 5.0), ("B", 7.0), ("C", 5.0)])
    assert book.first(2) == [("B", 7.0), ("A", 5.0)]  # ties by key
    book.update([("B", None), ("C", 9.0)])
    assert book.first(5) == [("C", 9.0), ("A", 5.0)]
    bottom = RankBook(top=False)
    bottom.update([("A", 5.0), ("B", -1.0)])
    assert bottom.first(1) == [("B", -1.0)]


def test_a_merge_waits_for_every_shard_and_ignores_a_replayed_boundary() -> None:
    top2 = Rank(2)
    merge = RankMerge(7)
    early = [RankEntry(0, 7, 2_000, 0, "A", 3.0, True, top2), RankEntry(1, 7, 2_000, 0, "B", 5.0, True, top2)]
    assert merge.merge(early, through=1_000) == []  # a shard has not evaluated 2,000 yet: they wait
    fired = merge.merge([], through=2_000)
    assert [(t.key, t.state, t.evaluated_at) for t in fired] == [("A", "firing", 2_000), ("B", "firing", 2_000)]
    assert merge.merge(early, through=2_000) == []  # the batch again: nothing
    later = [RankEntry(0, 7, 3_000, 1_000, "C", 9.0, True, top2)]  # shard 0's list is now C alone; B stays
    moved = merge.merge(later, through=3_000)
    assert [(t.key, t.state, t.value) for t in moved] == [("C", "firing", 9.0), ("A", "resolved", None)]
    gone = merge.merge([RankEntry(1, 7, 4_000, 2_000, EMPTY_KEY, 0.0, False, top2)], through=4_000)
    assert [(t.key, t.state) for t in gone] == [("B", "resolved")]
    again = RankMerge(7, RankState.from_dict(merge.state.to_dict()))
    assert again.state == merge.state


def test_an_unlisted_key_ranks_but_does_not_alert() -> None:
    merge = RankMerge(1)
    out = merge.merge([RankEntry(0, 1, 1_000, 0, "A", 9.0, False, Rank(1)),
                       RankEntry(0, 1, 1_000, 0, "B", 1.0, True, Rank(1))], through=1_000)
    assert out == []  # A holds the one place; B, listed, is not in it


def test_a_rank_entry_crosses_the_output_schema() -> None:
    entry = RankEntry(3, 12, 60_000, 0, "AAPL", 1.5e6, True, Rank(10, top=False))
    assert RankEntry.from_row(entry.to_row()) == entry
    with pytest.raises(ValueError, match="not a rank entry"):
        RankEntry.from_row(("3", 12, "AAPL", "firing", 1.0, 0, 1, 1, "state"))


def test_an_edited_rank_takes_effect_at_the_next_boundary_though_no_list_changed() -> None:
    """k from 1 to 2 over two shards of one key each: neither's first k changes, but each sends its list again
    with the new k, so the second key fires (the merge kept cutting at the old k until some list changed)."""
    shards = [ShardEvaluator(CONFIG), ShardEvaluator(CONFIG)]
    shards[0].owns, shards[1].owns = (lambda key: key == "A"), (lambda key: key == "B")
    merge = RankMerge(1)

    def step(events: list[Event], clock: int, catalog: Catalog) -> list[tuple[str, str]]:
        entries = []
        for s, shard in enumerate(shards):
            shard.step(pane_rows([e for e in events if shard.owns(e[0])]), {0: clock, 1: clock}, catalog)
            entries += [replace(e, shard=s) for e in shard.take_ranked()]
        through = min(shard.evaluated_at or 0 for shard in shards)
        return [(t.key, t.state) for t in merge.merge(entries, through)]

    top1 = Catalog(1, (SubscriptionSpec(1, Condition(Aggregate.SUM, "volume", 5_000, rank=Rank(1))),))
    top2 = Catalog(2, (SubscriptionSpec(1, Condition(Aggregate.SUM, "volume", 5_000, rank=Rank(2))),))
    events = [(key, 10_000 + 100 * i, 1.0, volume) for i in range(3) for key, volume in (("A", 5.0), ("B", 3.0))]
    assert step(events, 10_200, top1) + step([], 14_000, top1) == [("A", "firing")]
    assert step([], 14_500, top2) + step([], 15_000, top2) == [("B", "firing")]


def test_a_rank_preview_is_the_first_k_of_every_shards_answer() -> None:
    """Each shard answers with its own first k; the web app's merge of the answers is the stream's first k."""
    condition = Condition(Aggregate.SUM, "volume", 5_000, rank=Rank(2))
    volumes = {"A": 5.0, "B": 9.0, "C": 7.0, "D": 1.0}
    events = [(key, 10_000 + 100 * i, 1.0, volume) for i in range(3) for key, volume in volumes.items()]
    answers = []
    for s, owned in enumerate(("AB", "CD")):
        shard = ShardEvaluator(CONFIG)
        shard.owns = lambda key, owned=owned: key in owned
        shard.step(pane_rows([e for e in events if e[0] in owned]), {0: 14_000, 1: 14_000}, Catalog.empty())
        answers.append(PreviewAnswer.of(s, *shard.preview(condition), condition))
    assert [a.matches for a in answers] == [(("B", 27.0), ("A", 15.0)), (("C", 21.0), ("D", 3.0))]
    assert most_extreme((m for a in answers for m in a.matches), condition) == [("B", 27.0), ("C", 21.0)]
    bottom = Condition(Aggregate.SUM, "volume", 5_000, rank=Rank(1, top=False))
    assert most_extreme([("B", 27.0), ("D", 3.0)], bottom) == [("D", 3.0)]


@st.composite
def late_streams(draw):
    """Events whose times run up to three allowed delays behind their partition's newest: some late (merged into
    the windows still to come), some too late (dropped), split into batches."""
    n = draw(st.integers(1, 60))
    events, clock = [], 10_000
    for _ in range(n):
        clock += draw(st.integers(0, 700))
        events.append((draw(st.sampled_from(KEYS)), clock - draw(st.integers(0, 3 * DELAY)),
                       float(draw(st.integers(1, 20))), float(draw(st.integers(0, 10)))))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True) if b > a]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=late_streams(), specs=rank_catalogs, data=st.data())
def test_with_late_events_the_merged_first_k_are_every_keys_ranking_from_scratch(batches, specs, data) -> None:
    """After every batch that passed a boundary, each subscription's first k as merged from two shards' books equal a
    ranking of every key from scratch (the preview's: every key's value computed and sorted) by one shard holding all
    of them, fed the same batches: late events moved the books as they moved the windows."""
    home = {key: data.draw(st.integers(0, 1), label=f"shard of {key}") for key in KEYS}
    shards = [ShardEvaluator(CONFIG), ShardEvaluator(CONFIG)]
    for s, shard in enumerate(shards):
        shard.owns = lambda key, s=s: home[key] == s
    whole = ShardEvaluator(CONFIG)
    catalog = Catalog(1, tuple(specs))
    merges = {spec.id: RankMerge(spec.id) for spec in specs}
    before: int | None = None
    for batch in batches:
        progress = progress_of(batch)
        entries = []
        for s, shard in enumerate(shards):
            shard.step(pane_rows([e for e in batch if home[e[0]] == s]), progress, catalog)
            entries += [replace(e, shard=s) for e in shard.take_ranked()]
        whole.step(pane_rows(batch), progress, Catalog.empty())
        at = shards[0].evaluated_at
        assert at == shards[1].evaluated_at == whole.evaluated_at
        if at is None or at == before:
            # No boundary passed: a late event of this batch is in the windows the preview reads now, and counts in
            # the alerts from the next boundary on (as in every later window that covers it)
            continue
        before = at
        for spec in specs:
            merges[spec.id].merge([e for e in entries if e.subscription_id == spec.id], at)
            _, scratch, _ = whole.preview(spec.condition)
            assert merges[spec.id].state.members.keys() == scratch.keys(), (spec, at)
