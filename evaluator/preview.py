"""The condition preview contract between the web app and the evaluator's shards.

The web app writes a :class:`PreviewRequest` into the ``previews`` hash; every shard
answers it once, at its next micro-batch, with a :class:`PreviewAnswer` pushed to
``preview:<request>``; the web app merges the answers (see ``web.conditions``).
Both sides list matches the same way, most extreme values first (:func:`most_extreme`).
A shard whose preview failed answers with the reason (``error``) instead of matches: the
request fails with it, never the shard's batch nor another request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from evaluator.rank import first_k
from evaluator.spec import Condition

PREVIEW_SHOWN = 50  # keys a preview lists (per shard, then in all), most extreme values first; totals count all


def most_extreme(matches: Iterable[tuple[str, float]], condition: Condition | None = None) -> list[tuple[str, float]]:
    """The ``PREVIEW_SHOWN`` matches of largest absolute value (ties by key); of a rank condition, its first ``k`` in
    rank order (each shard answers with its own first ``k``: the stream's are among them)."""
    if condition is not None and condition.rank is not None:
        return first_k(matches, condition.rank)
    return sorted(matches, key=lambda kv: (-abs(kv[1]), kv[0]))[:PREVIEW_SHOWN]


@dataclass(frozen=True, slots=True)
class PreviewRequest:
    condition: Condition
    keys: frozenset[str] | None  # the keys to look at; None: every key
    at: float  # when it was asked (epoch seconds): shards ignore requests nobody waits for any more

    def to_json(self) -> str:
        keys = sorted(self.keys) if self.keys is not None else None
        return json.dumps({"condition": self.condition.to_dict(), "keys": keys, "at": self.at})

    @classmethod
    def from_json(cls, payload: str | bytes) -> PreviewRequest:
        data = json.loads(payload)
        keys = data["keys"]
        return cls(Condition.from_dict(data["condition"]), frozenset(keys) if keys is not None else None,
                   float(data["at"]))


@dataclass(frozen=True, slots=True)
class PreviewAnswer:
    shard: int
    evaluated_at: int | None  # the boundary the shard answered at; None before its first evaluation
    matches: tuple[tuple[str, float], ...]  # the most extreme matches (see most_extreme)
    total: int  # every match of the shard
    watched: int  # keys the shard looked at
    error: str | None = None  # why the shard could not answer (then nothing matched, nothing was watched)

    @classmethod
    def of(cls, shard: int, evaluated_at: int | None, matched: dict[str, float], watched: int,
           condition: Condition | None = None) -> PreviewAnswer:
        """A shard's answer from everything that matched (of ``condition``, for a rank's order)."""
        return cls(shard, evaluated_at, tuple(most_extreme(matched.items(), condition)), len(matched), watched)

    @classmethod
    def failed(cls, shard: int, evaluated_at: int | None, error: str) -> PreviewAnswer:
        """A shard's answer when computing the preview raised: the reason, in words."""
        return cls(shard, evaluated_at, (), 0, 0, error)

    def to_json(self) -> str:
        data = {"shard": self.shard, "evaluated_at": self.evaluated_at, "matches": [list(m) for m in self.matches],
                "total": self.total, "watched": self.watched}
        return json.dumps(data if self.error is None else {**data, "error": self.error})

    @classmethod
    def from_json(cls, payload: str | bytes) -> PreviewAnswer:
        data = json.loads(payload)
        at, error = data["evaluated_at"], data.get("error")
        return cls(int(data["shard"]), None if at is None else int(at),
                   tuple((str(k), float(v)) for k, v in data["matches"]), int(data["total"]), int(data["watched"]),
                   None if error is None else str(error))
