"""A brute-force oracle for alert transitions, computed from raw events."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from evaluator.comparators import Range
from evaluator.expr import expr_from_json
from evaluator.rank import first_k
from evaluator.spec import Aggregate, BinOp, Condition, Expr, Num, SubscriptionSpec, Term

Event = tuple[str, int, float, float]  # key, ts, price, volume


def _quantile(window: list[Event], series: list[float], q: float | None) -> float | None:
    """The smallest value with at least q of the values at or below it."""
    ordered = sorted(series)
    return next((v for v in ordered if sum(x <= v for x in ordered) >= round((q or 0) * len(ordered), 9)), None)


def _last(window: list[Event], series: list[float], q: float | None) -> float | None:
    """The newest event's value; among equal times, the last to arrive."""
    if not window:
        return None
    newest = max(range(len(window)), key=lambda i: (window[i][1], i))
    return series[newest]


def _ordered(window: list[Event]) -> list[int]:
    """Indexes of the window's events by time, among equal times in arrival order."""
    return sorted(range(len(window)), key=lambda i: (window[i][1], i))


def _change(window: list[Event], series: list[float], q: float | None) -> float | None:
    """Newest value minus oldest."""
    if not window:
        return None
    order = _ordered(window)
    return series[order[-1]] - series[order[0]]


def _pct_change(window: list[Event], series: list[float], q: float | None) -> float | None:
    """Newest minus oldest, in percent of the oldest's magnitude; none when the oldest is 0."""
    if not window:
        return None
    order = _ordered(window)
    first, last = series[order[0]], series[order[-1]]
    if first == 0:
        return None
    value = 100.0 * (last - first) / abs(first)
    return value if math.isfinite(value) else None


def _stddev(window: list[Event], series: list[float], q: float | None) -> float | None:
    """sqrt(mean of squared deviations from the mean), the sums correctly rounded."""
    if not series:
        return None
    mean = _mean(series)
    value = math.sqrt(math.fsum([(x - mean) * (x - mean) for x in series]) / len(series))
    return value if math.isfinite(value) else None


def _mean(series: list[float]) -> float:
    """The correctly rounded sum over the count, kept within the values (equal values: exactly that value)."""
    return min(max(math.fsum(series) / len(series), min(series)), max(series))


def _zscore(window: list[Event], series: list[float], q: float | None) -> float | None:
    """(newest - mean) / standard deviation; none when the deviation is 0."""
    deviation, newest = _stddev(window, series, q), _last(window, series, q)
    if not deviation or newest is None:
        return None
    # newest minus the mean as (n * newest - sum) / n, with the sum correctly rounded (test_spread checks it exact)
    value = math.fsum([*([newest] * len(series)), *(-x for x in series)]) / len(series) / deviation
    return value if math.isfinite(value) else None


#: Each aggregate by its definition, independently of evaluator/aggregates.py (a test checks both name the same
#: aggregates): ``(window events in arrival order, the attribute's values, param) -> value``; None: no value.
DEFINITIONS: dict[str, Callable[[list[Event], list[float], float | None], float | None]] = {
    "COUNT": lambda window, series, q: float(len(window)),
    "SUM": lambda window, series, q: math.fsum(series),
    "AVG": lambda window, series, q: math.fsum(series) / len(series) if series else None,
    "MIN": lambda window, series, q: min(series) if series else None,
    "MAX": lambda window, series, q: max(series) if series else None,
    "QUANTILE": _quantile,
    "LAST": _last,
    "CHANGE": _change,
    "PCT_CHANGE": _pct_change,
    "RATE": lambda window, series, q: None,  # per second of the window's length: see WINDOWED
    "STDDEV": _stddev,
    "ZSCORE": _zscore,
}

#: Aggregates whose value also depends on the window's length (ms): ``(window, series, param, window_ms)``.
WINDOWED: dict[str, Callable[[list[Event], list[float], float | None, int], float | None]] = {
    "RATE": lambda window, series, q, window_ms: (None if (change := _change(window, series, q)) is None
                                                  else change / (window_ms / 1000)),
}


def term_of(term: Term | Any, window: list[Event], window_ms: int = 0) -> float | None:
    """One aggregate of a window of events, given in arrival order, by its definition.

    SUM and AVG are ``math.fsum`` of the raw values (correctly rounded), never a difference of
    running sums as the evaluator's structures keep them: their precision is what is tested.
    """
    term = expr_from_json(term)
    assert isinstance(term, Term)
    series = [e[2] if term.attribute == "price" else e[3] for e in window]
    if term.aggregate in WINDOWED:
        return WINDOWED[term.aggregate](window, series, term.param, window_ms)
    return DEFINITIONS[term.aggregate](window, series, term.param)


def expr_of(expr: Expr, window: list[Event], window_ms: int = 0,
            at: tuple[int, int] | None = None) -> float | None:
    """``at``: (boundary, pane) of ``window``, for terms over windows of their own (the subset of ``window`` in
    theirs: ``window`` is the condition's, the longest)."""
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Term):
        if expr.window_ms is None:
            return term_of(expr, window, window_ms)
        if at is None:
            raise ValueError("a term over its own window needs the window's boundary and pane")
        b, pane_ms = at
        return term_of(expr, [e for e in window if b - expr.window_ms <= e[1] // pane_ms * pane_ms < b],
                       expr.window_ms)
    assert isinstance(expr, BinOp)
    left, right = expr_of(expr.left, window, window_ms, at), expr_of(expr.right, window, window_ms, at)
    if left is None or right is None or (expr.op == "/" and right == 0):
        return None
    value = {"+": left + right, "-": left - right, "*": left * right}.get(expr.op) if expr.op != "/" else left / right
    return value if math.isfinite(value) else None  # type: ignore[arg-type]  # every op gives a value


def value_of(c: Condition, window: list[Event], at: tuple[int, int] | None = None) -> float | None:
    """``c``'s value over a key's ``window`` (its events in the condition's window); ``at``: (boundary, pane) of
    the window, needed when terms have windows of their own."""
    if c.aggregate is not Aggregate.EXPR:
        return term_of(c.terms[0], window, c.window_ms)
    value = expr_of(c.expression, window, c.window_ms, at)  # type: ignore[arg-type]  # EXPR conditions have one
    if value is None or c.percent_of is None:
        return value
    last = term_of(Term("LAST", c.percent_of), window)
    return 100.0 * value / last if last else None


def window_of(c: Condition, key_events: list[Event], b: int, pane_ms: int, horizon_ms: int) -> list[Event]:
    """A key's window at boundary ``b``, from its events in arrival order: those whose pane lies in
    ``[b - T, b)``; for a tuple window, the ``n`` newest (by time, then arrival) of those in ``[b - horizon, b)``."""
    if c.events is None:
        return [e for e in key_events if b - c.window_ms <= e[1] // pane_ms * pane_ms < b]
    recent = [e for e in key_events if b - horizon_ms <= e[1] // pane_ms * pane_ms < b]
    return [recent[i] for i in _ordered(recent)][-c.events:]


def rank_oracle(events: list[Event], specs: list[SubscriptionSpec], last_boundary: int, pane_ms: int,
                horizon_ms: int) -> dict[tuple[int, str, str, int], float | None]:
    """(subscription, key, state, boundary) -> value of every transition of rank subscriptions: at every pane
    boundary from the first pane with data, every key with an event in the window ranked by its value (ties by
    key), a listed key firing when it enters the first k and resolving when it leaves them."""
    first = min(ts for _, ts, *_ in events) // pane_ms * pane_ms + pane_ms
    by_key: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e[0]].append(e)
    members: dict[int, dict[str, float]] = {spec.id: {} for spec in specs}
    out: dict[tuple[int, str, str, int], float | None] = {}
    for b in range(first, last_boundary + 1, pane_ms):
        for spec in specs:
            c = spec.condition
            assert c.rank is not None
            values = {}
            for key, own in by_key.items():
                window = window_of(c, own, b, pane_ms, horizon_ms)
                value = value_of(c, window, (b, pane_ms)) if window else None
                if value is not None:
                    values[key] = value
            now = dict(first_k(values.items(), c.rank))
            for key in now.keys() - members[spec.id].keys():
                if spec.keys is None or key in spec.keys:
                    out[(spec.id, key, "firing", b)] = now[key]
            for key in members[spec.id].keys() - now.keys():
                if spec.keys is None or key in spec.keys:
                    out[(spec.id, key, "resolved", b)] = values.get(key)
            members[spec.id] = now
    return out


def oracle(events: list[Event], specs: list[SubscriptionSpec], last_boundary: int, pane_ms: int,
           horizon_ms: int) -> set[tuple[int, str, str, int]]:
    """(subscription, key, state, boundary) of every transition, evaluating every pane boundary from the
    first pane with data: a key is watched while it has an event in the horizon; a key the subscription
    lists, always. Rank subscriptions: :func:`rank_oracle`'s."""
    ranked = [spec for spec in specs if spec.condition.rank is not None]
    if ranked:
        others = [spec for spec in specs if spec.condition.rank is None]
        return set(rank_oracle(events, ranked, last_boundary, pane_ms, horizon_ms)) | \
            (oracle(events, others, last_boundary, pane_ms, horizon_ms) if others else set())
    first = min(ts for _, ts, *_ in events) // pane_ms * pane_ms + pane_ms
    all_keys = {e[0] for e in events}
    by_key: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e[0]].append(e)
    firing: dict[int, set[str]] = defaultdict(set)
    out = set()
    for b in range(first, last_boundary + 1, pane_ms):
        known = {k for k, ts, *_ in events if b - horizon_ms <= ts // pane_ms * pane_ms < b}
        for spec in specs:
            c = spec.condition
            matched = set()
            for key in known & all_keys if spec.keys is None else spec.keys:
                window = window_of(c, by_key[key], b, pane_ms, horizon_ms)
                if c.holds(value_of(c, window, (b, pane_ms))):
                    matched.add(key)
            out |= {(spec.id, k, "firing", b) for k in matched - firing[spec.id]}
            out |= {(spec.id, k, "resolved", b) for k in firing[spec.id] - matched}
            firing[spec.id] = matched
    return out


def _up(ms: int, pane_ms: int) -> int:
    return -(-ms // pane_ms) * pane_ms


def _members(specs: list[SubscriptionSpec]) -> list[SubscriptionSpec]:
    """The subscriptions and, for a RESOLVE range or a two-way crossing's lower side, a second member (id -s)."""
    members: list[SubscriptionSpec] = []
    for spec in specs:
        members.append(spec)
        c, life = spec.condition, spec.condition.lifecycle
        hold = None if life is None else Range(high=c.low) if life.crossing == "either" else life.resolve
        if hold is not None:
            members.append(SubscriptionSpec(-spec.id, replace(c, low=hold.low, high=hold.high, ranges=(),
                low_inclusive=hold.low_inclusive, high_inclusive=hold.high_inclusive, lifecycle=None), spec.keys))
    return members


def _kind(life: Any) -> str | None:
    return None if life is None else "crossing" if life.crossing is not None else "state"


def lifecycle_oracle(events: list[Event], specs: list[SubscriptionSpec] | list[tuple[list[SubscriptionSpec], int | None]],
                     last_boundary: int, pane_ms: int, horizon_ms: int) -> set[tuple[int, str, str, int, str]]:
    """(subscription, key, state, boundary, kind) of every transition users see, by the lifecycle rules applied
    to the brute-force raw truth, every pair at every boundary (docs/conditions.md):

    * plain: an edge of the raw truth (a key is watched while it has an event in the horizon; a listed key,
      always: as in :func:`oracle`);
    * FOR d: pending from the boundary it became true, firing at the first boundary at least d later if true at
      every boundary in between;
    * while firing, "false" means out of the RESOLVE hold range (or the condition false without one); it resolves
      once false for KEEP FIRING FOR and at least DAMPEN after it fired; true again before that: firing on;
    * a crossing: each rise of the side's raw truth (either side for CROSSES x), at most one per DAMPEN.

    ``specs`` is the catalog, or the catalogs in turn each with the last boundary it was in force for (None:
    none, it was replaced before any): removed subscriptions and members are forgotten as each applies; one whose
    clauses changed keeps what users saw (firing or not), its timers counted from the recorded instants with the
    new durations, and turning into a crossing resolves its firing keys.
    """
    steps = [(specs, last_boundary)] if not specs or isinstance(specs[0], SubscriptionSpec) else specs
    first = min(ts for _, ts, *_ in events) // pane_ms * pane_ms + pane_ms
    all_keys = {e[0] for e in events}
    by_key: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e[0]].append(e)
    held: dict[int, set[str]] = defaultdict(set)  # raw truth per member at the previous boundary
    state: dict[tuple[int, str], dict[str, Any]] = {}
    applied: dict[int, Any] = {}  # the clauses each subscription's state follows
    out: set[tuple[int, str, str, int, str]] = set()
    b = first
    for catalog, until in steps:
        members = _members(list(catalog))  # type: ignore[arg-type]  # a catalog
        ids = {m.id for m in members}
        for gone in [i for i in held if i not in ids]:
            del held[gone]
        for pair in [p for p in state if p[0] not in ids]:
            del state[pair]
        for sid in [s for s in applied if s not in ids]:
            del applied[sid]
        while until is not None and b <= min(until, last_boundary):
            known = {k for k, ts, *_ in events if b - horizon_ms <= ts // pane_ms * pane_ms < b}
            before = {i: set(keys) for i, keys in held.items()}
            for m in members:
                c = m.condition
                watched = known & all_keys if m.keys is None else m.keys  # as in oracle()
                held[m.id] = {key for key in watched
                              if c.holds(value_of(c, window_of(c, by_key[key], b, pane_ms, horizon_ms), (b, pane_ms)))}
            for spec in catalog:
                out |= _lifecycle_step(spec, b, held, before, state, applied, pane_ms)  # type: ignore[arg-type]
            b += pane_ms
    return out


def _lifecycle_step(spec: SubscriptionSpec, b: int, now: dict[int, set[str]], before: dict[int, set[str]],
                    state: dict[tuple[int, str], dict[str, Any]], applied: dict[int, Any],
                    pane_ms: int) -> set[tuple[int, str, str, int, str]]:
    sid, life = spec.id, spec.condition.lifecycle
    old = applied.get(sid)
    applied[sid] = life
    empty: set[str] = set()
    keys = (now.get(sid, empty) | before.get(sid, empty) | now.get(-sid, empty) | before.get(-sid, empty)
            | {k for s, k in state if s == sid})
    out = set()
    for key in sorted(keys):
        true, was = key in now.get(sid, empty), key in before.get(sid, empty)
        st = state.setdefault((sid, key), {"phase": None})
        shown = was if old is None else old.crossing is None and st["phase"] in ("firing", "keep")
        if _kind(old) != _kind(life):
            st.clear()
            st["phase"] = "firing" if shown and _kind(life) == "state" else None
            st["fired"] = None
        if life is None:
            if true != shown:
                out.add((sid, key, "firing" if true else "resolved", b, "state"))
            st["phase"] = None
            continue
        if life.crossing is not None:
            if shown:
                out.add((sid, key, "resolved", b, "state"))
            rise = (true and not was) or (life.crossing == "either" and key in now.get(-sid, empty)
                                          and key not in before.get(-sid, empty))
            last = st.get("last")
            if rise and (last is None or b >= last + _up(life.dampen_ms, pane_ms)):
                out.add((sid, key, "firing", b, "crossing"))
                st["last"] = b
            continue
        holds = key in now.get(-sid, empty) if life.resolve is not None else true
        phase = st["phase"]
        if phase in (None, "pending"):
            if not true:
                st["phase"] = None
                continue
            if phase is None:
                st["since"] = b
            if b >= st["since"] + _up(life.for_ms, pane_ms):
                out.add((sid, key, "firing", b, "state"))
                st.update(phase="firing", fired=b)
            else:
                st["phase"] = "pending"
            continue
        if holds:
            st["phase"] = "firing"
            continue
        if phase == "firing":
            st.update(phase="keep", fell=b)
        due = st["fell"] + _up(life.keep_firing_ms, pane_ms)
        if st["fired"] is not None:
            due = max(due, st["fired"] + _up(life.dampen_ms, pane_ms))
        if b >= due:
            out.add((sid, key, "resolved", b, "state"))
            st["phase"] = None
    return out
