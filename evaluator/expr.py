"""What a condition computes per key: window aggregates combined by arithmetic, as a small typed tree.

``Term(aggregate, attribute, param)`` is one window aggregate (``SUM(volume)``,
``QUANTILE(price, 0.95)``), ``Num`` a constant, ``BinOp`` one of ``+ - * /``. The tree
crosses process boundaries (catalog snapshots in Redis, Spark workers) as JSON; its wire
form is the nested arrays it had when it was a tuple, so old snapshots still read:
``["agg", aggregate, attribute | null, param | null]``, ``["num", value]``, ``[op, left, right]``.
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

    def to_json(self) -> list[Any]:
        return ["agg", self.aggregate, self.attribute, self.param]


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
        _, aggregate, attribute, param = data
        return Term(aggregate, attribute, None if param is None else float(param))
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
