"""Naive evaluation: every subscription against every key it applies to.

This is the baseline (and oracle) the collective indexes are measured against:
cost is O(subscriptions × keys) per evaluation. It produces edge-triggered
transitions — ``firing`` when a (subscription, key) enters its condition,
``resolved`` when it leaves — each with a deterministic id, so replaying a
micro-batch reproduces the same ids and downstream de-duplication holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from evaluator.panes import PaneStore, WindowAggregate
from evaluator.spec import Aggregate, Condition, SubscriptionSpec

State = Literal["firing", "resolved"]


@dataclass(frozen=True, slots=True)
class Transition:
    alert_id: str
    subscription_id: int
    key: str
    state: State
    value: float | None
    window_start: int
    window_end: int
    evaluated_at: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def alert_id(subscription_id: int, key: str, state: State, evaluated_at: int) -> str:
    """Deterministic id of a transition: the same evaluation always yields the same id."""
    digest = hashlib.sha256(f"{subscription_id}|{key}|{state}|{evaluated_at}".encode()).hexdigest()
    return digest[:32]


def aggregate_value(agg: WindowAggregate, condition: Condition, attributes: Sequence[str]) -> float | None:
    """The value of ``condition``'s aggregate over a window, or None where it has none."""
    if condition.aggregate is Aggregate.COUNT:
        return float(agg.count)
    a = attributes.index(condition.attribute)  # type: ignore[arg-type]
    if condition.aggregate is Aggregate.SUM:
        return float(agg.sums[a])
    if agg.count == 0:
        return None
    if condition.aggregate is Aggregate.AVG:
        return float(agg.sums[a]) / agg.count
    if condition.aggregate is Aggregate.MIN:
        return float(agg.mins[a])
    return float(agg.maxs[a])


def evaluate_key(
    key: str,
    store: PaneStore,
    subscriptions: Iterable[SubscriptionSpec],
    firing: set[int],
    evaluated_at: int,
    attributes: Sequence[str],
) -> tuple[list[Transition], set[int]]:
    """Evaluate every applicable subscription for one key at time ``evaluated_at``.

    Windows are ``[evaluated_at - window_ms, evaluated_at)``. ``firing`` is the set of
    subscriptions currently firing for the key; the new set is returned. Firing
    entries of subscriptions that no longer exist are dropped without a transition.
    """
    transitions: list[Transition] = []
    now_firing: set[int] = set()
    for spec in subscriptions:
        if not spec.applies_to(key):
            continue
        start = evaluated_at - spec.condition.window_ms
        value = aggregate_value(store.window(start, evaluated_at), spec.condition, attributes)
        matched = spec.condition.holds(value)
        was = spec.id in firing
        if matched:
            now_firing.add(spec.id)
        if matched != was:
            state: State = "firing" if matched else "resolved"
            transitions.append(
                Transition(
                    alert_id=alert_id(spec.id, key, state, evaluated_at),
                    subscription_id=spec.id,
                    key=key,
                    state=state,
                    value=value,
                    window_start=start,
                    window_end=evaluated_at,
                    evaluated_at=evaluated_at,
                )
            )
    return transitions, now_firing
