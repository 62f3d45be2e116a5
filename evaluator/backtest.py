"""A backtest: one subscription evaluated over a stream's history, exactly as the live query evaluates it.

The history arrives as the live query's micro-batches do: raw Kafka records in chunks (each
partition's records in offset order, every chunk's processing clock its newest record time).
Each chunk is judged and pre-aggregated by the live query's own judge
(``evaluator.records``), its progress bounded by the same clock rule (``evaluator.clock``),
and stepped through a :class:`SubstreamShard` built with the live query's ``ShardConfig``, so
windows, lateness, the collective plans and the lifecycle clauses (FOR, KEEP FIRING, DAMPEN,
hysteresis, crossings) are those of live evaluation; a rank's lists go through the live sink's merge
(``evaluator.rank``), of one shard.

Exactness. A shard's transitions depend on its events and on when its watermark passes each
boundary, never on how the events were cut into batches, as long as no event is late (older
than the watermark allows): the watermark is the minimum of every partition's progress, so an
event within the allowed delay of its partition's newest is never late whatever the chunking.
A backtest then yields exactly the live transitions (the same ids, when it runs a saved
subscription's id). Late events are judged as live judges them, against the chunk they arrive
in, so a stream that publishes beyond the allowed delay may differ at those events.

Warm-up. The subscription joins the catalog at the range's start, after the chunks before it
(the reader starts one horizon earlier) filled the windows: it is first evaluated at the next
boundary, as a subscription saved at that moment would be.

Pure: no I/O. The reader (``ingest.history``) and the job around it (``notifier.backtests``) are
the adapters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import pandas as pd

from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamSchema
from evaluator.catalog import Catalog
from evaluator.clock import bounded_progress
from evaluator.rank import RankMerge
from evaluator.records import RecordPanes, batch_clock
from evaluator.shard import BatchStats, ShardConfig
from evaluator.spec import Condition, SubscriptionSpec
from evaluator.stream_records import StreamRecordPanes
from evaluator.streams import StreamShape
from evaluator.substreams import SubstreamShard
from evaluator.transition import Transition
from ingest.model import ATTRIBUTES

#: Keys whose value a backtest samples for its chart, at most (the first seen; the counts cover every key).
SAMPLED_KEYS = 2_000


def warm_up_ms(condition: Condition, settings: Settings) -> int:
    """How much history before a range's start fills the condition's windows by its first boundary (a tuple window
    looks back as far as the longest window may)."""
    longest = max(condition.windows)
    return (longest or settings.max_window_ms) + settings.watermark_delay_ms + settings.pane_ms


@dataclass
class BacktestTally:
    """What a backtest read so far."""

    records: int = 0
    events: int = 0
    dead: int = 0  # records the live query would have dead-lettered (malformed, too far ahead)
    dead_reasons: dict[str, int] = field(default_factory=dict)  # by the reason's field ("ts", "price", …)
    late_dropped: int = 0


class Backtest:
    """One subscription over a stream's history, chunk by chunk (see the module doc)."""

    def __init__(self, spec: SubscriptionSpec, config: ShardConfig, judge: RecordPanes, *, start_ms: int,
                 clock_tolerance_ms: int, optional: frozenset[str] = frozenset(), cells: bool = False,
                 sampled_keys: int = SAMPLED_KEYS) -> None:
        """``judge``: the live query's record judge for the stream (its shard layout one shard, ``(0,)``);
        ``optional``, ``cells``: the stream's, as its live shards have them."""
        self.spec = spec
        self.judge = judge
        self.start_ms = start_ms
        self.clock_tolerance_ms = clock_tolerance_ms
        self.shard = SubstreamShard(config, optional, cells)
        self.catalog = Catalog.empty()
        self.sampled_keys = sampled_keys
        self.transitions: list[Transition] = []
        #: per key, its value at each chunk's last evaluated boundary from the start on: [(boundary, value)]
        self.samples: dict[str, list[tuple[int, float]]] = {}
        self.tally = BacktestTally()
        self.ranks = RankMerge(spec.id)  # a rank condition's (evaluator/rank.py): its one shard's lists merged

    @classmethod
    def of(cls, spec: SubscriptionSpec, settings: Settings, schema: StreamSchema, partitions: int,
           start_ms: int) -> Backtest:
        """A backtest of ``spec`` on ``schema``'s stream (its topic of ``partitions``) set up as its live query is:
        the same judge, shard configuration and layout (``evaluator.spark.job`` builds the live ones)."""
        if schema.name == TRADES:
            judge, shape, cells = RecordPanes(settings, (0,)), StreamShape(TRADES, ATTRIBUTES), False
        else:
            judge, shape, cells = StreamRecordPanes(settings, (0,), schema), StreamShape.of(schema), True
        # one subscription over history, from its first boundary: nothing to admit later (evaluator.admission)
        config = replace(ShardConfig.live(settings, judge.attributes, partitions), admission_transitions=None)
        return cls(spec, config, judge, start_ms=start_ms, clock_tolerance_ms=settings.clock_tolerance_ms,
                   optional=shape.optional, cells=cells)

    @property
    def evaluated_at(self) -> int | None:
        return self.shard.evaluated_at

    def feed(self, raw: pd.DataFrame) -> list[Transition]:
        """One chunk of raw records (``evaluator.spark.source.RAW_SCHEMA``'s columns and ``now``, its clock): the
        transitions it produced (also kept in :attr:`transitions`)."""
        parsed = self.judge.parse(raw)
        tally = self.tally
        tally.records += len(raw)
        tally.events += len(parsed.ts)
        tally.dead += len(parsed.dead)
        for letter in parsed.dead:
            reason = letter.reason.split(":", 1)[0]
            tally.dead_reasons[reason] = tally.dead_reasons.get(reason, 0) + 1
        progress, _ = bounded_progress(parsed.progress, batch_clock(raw), self.clock_tolerance_ms)
        if self.catalog.version == 0 and self._started(raw):
            self.catalog = Catalog(1, [self.spec])
        stats = BatchStats()
        transitions, _ = self.shard.step(self.judge.pane_rows(parsed), progress, self.catalog, stats)
        if self.spec.condition.rank is not None:  # one shard: every boundary it evaluated is merged
            transitions += self.ranks.merge(self.shard.take_ranked(), self.shard.evaluated_at or 0)
        tally.late_dropped += stats.dropped_events
        self.transitions += transitions
        if self.catalog.version:
            self._sample()
        return transitions

    def _started(self, raw: pd.DataFrame) -> bool:
        """Whether this chunk reaches the range's start (its records are appended at or after it)."""
        return bool(len(raw)) and batch_clock(raw) >= self.start_ms

    def _sample(self) -> None:
        at, values = self.shard.current_values(self.spec.condition, self.spec.keys)
        if at is None:
            return
        for key, value in values.items():
            series = self.samples.get(key)
            if series is None:
                if len(self.samples) >= self.sampled_keys:
                    continue
                series = self.samples[key] = []
            if not series or series[-1][0] != at:
                series.append((at, value))

    def run(self, chunks: Iterable[pd.DataFrame]) -> list[Transition]:
        """Every chunk in turn (for a caller with nothing to do between chunks: tests, benchmarks)."""
        for chunk in chunks:
            self.feed(chunk)
        return self.transitions
