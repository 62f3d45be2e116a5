"""What a condition computes per key: window aggregates combined by arithmetic, as a small typed tree.

``Term(aggregate, attribute, param)`` is one window aggregate (``SUM(volume)``,
``QUANTILE(price, 0.95)``), ``Num`` a constant, ``BinOp`` one of ``+ - * /``. The tree
crosses process boundaries (catalog snapshots in Redis, Spark workers) as JSON; its wire
form is the nested arrays it had when it was a tuple, so old snapshots still read:
``["agg", aggregate, attribute | null, param | null]``, ``["num", value]``, ``[op, left, right]``.

A term may carry its own window (``Term.window_ms``): a key compared with its own baseline,
``(SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3``. Its wire form then has the window
as a fifth element; a term without one is over the condition's window and reads as before.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OPERATORS = ("+", "-", "*", "/")


@dataclass(frozen=True, slots=True)
class Term:
    """One aggregate of the window: its name in :data:`evaluator.aggregates.AGGREGATES`."""

    aggregate: str
    attribute: str | None = None
    param: float | None = None  # the aggregate's extra argument (QUANTILE's fraction)
    window_ms: int | None = None  # its own time window; None: the condition's

    def to_json(self) -> list[Any]:
        wire = ["agg", self.aggregate, self.attribute, self.param]
        return wire if self.window_ms is None else [*wire, self.window_ms]

    def over(self, window_ms: int) -> int:
        """The window this term is over, in a condition over ``window_ms``."""
        return window_ms if self.window_ms is None else self.window_ms


@dataclass(frozen=True, slots=True)
class Num:
    value: float

    def to_json(self) -> list[Any]:
        return ["num", self.value]


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"unknown operator {self.op!r}")

    def to_json(self) -> list[Any]:
        return [self.op, self.left.to_json(), self.right.to_json()]


Expr = Term | Num | BinOp
EXPR_TYPES = (Term, Num, BinOp)  # for isinstance (faster than the union)


def expr_from_json(data: Any) -> Expr:
    """The tree of its wire form (lists, or the tuples it once was); an ``Expr`` is returned as it is."""
    if isinstance(data, EXPR_TYPES):
        return data
    if not isinstance(data, (list, tuple)) or not data:
        raise ValueError(f"not an expression: {data!r}")
    kind = data[0]
    if kind == "agg":
        _, aggregate, attribute, param, *window = data
        if len(window) > 1:
            raise ValueError(f"not an aggregate: {data!r}")
        return Term(aggregate, attribute, None if param is None else float(param),
                    int(window[0]) if window and window[0] is not None else None)
    if kind == "num":
        return Num(float(data[1]))
    op, left, right = data
    return BinOp(op, expr_from_json(left), expr_from_json(right))


def expr_terms(expr: Expr | list[Any] | tuple[Any, ...]) -> list[Term]:
    """The aggregate terms of an expression (or of its wire form), left to right."""
    node = expr_from_json(expr)
    if isinstance(node, Term):
        return [node]
    if isinstance(node, Num):
        return []
    return expr_terms(node.left) + expr_terms(node.right)


def term_windows(expr: Expr) -> set[int]:
    """The windows the terms of ``expr`` carry (empty: every term is over the condition's window)."""
    return {t.window_ms for t in expr_terms(expr) if t.window_ms is not None}


def with_window(expr: Expr, window_ms: int | None) -> Expr:
    """``expr`` with every term's own window set to ``window_ms`` where it has none (None: every window cleared)."""
    if isinstance(expr, Term):
        if window_ms is None:
            return Term(expr.aggregate, expr.attribute, expr.param)
        return expr if expr.window_ms is not None else Term(expr.aggregate, expr.attribute, expr.param, window_ms)
    if isinstance(expr, Num):
        return expr
    return BinOp(expr.op, with_window(expr.left, window_ms), with_window(expr.right, window_ms))


#: The expression operators, for numbers and NumPy arrays alike (``evaluator.incremental`` combines columns).
ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}


def combine(op: str, left: float, right: float) -> float | None:
    """``left op right``; None where it has no finite value (division by zero, overflow)."""
    if op == "/" and right == 0:
        return None
    value = ARITHMETIC[op](left, right)
    return value if math.isfinite(value) else None
