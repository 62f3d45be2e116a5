"""The condition language users write subscriptions in.

    SUM(volume) OVER 5m > 2e6
    COUNT(*) OVER 30s >= 100
    AVG(price) OVER 1h BETWEEN 10 AND 20
    MAX(price) OVER 90s < 5

Parsing is a small hand-written tokenizer + recursive descent so every error can
say what was expected and where (column numbers start at 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evaluator.spec import Aggregate, Condition
from ingest.model import ATTRIBUTES

UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<duration>\d+(?:\.\d+)?(?:ms|s|m|h|d)\b)
      | (?P<number>[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>>=|<=|>|<|\(|\)|\*)
    )""",
    re.VERBOSE,
)


class ConditionError(ValueError):
    """A condition that does not parse or validate; ``column`` points at the problem."""

    def __init__(self, message: str, column: int | None = None) -> None:
        self.column = column
        super().__init__(f"{message} (at column {column})" if column is not None else message)


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    column: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            column = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise ConditionError(f"unexpected character {text[column - 1]!r}", column)
        kind = match.lastgroup or ""
        tokens.append(_Token(kind, match.group(kind), match.start(kind) + 1))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def column(self) -> int:
        token = self.peek()
        return token.column if token else len(self.text) + 1

    def take(self, kind: str, text: str | None = None, expected: str | None = None) -> _Token:
        token = self.peek()
        if token is None or token.kind != kind or (text is not None and token.text.upper() != text):
            found = f"{token.text!r}" if token else "end of input"
            raise ConditionError(f"expected {expected or text or kind}, found {found}", self.column())
        self.i += 1
        return token

    def number(self) -> float:
        token = self.take("number", expected="a number")
        return float(token.text.replace("_", ""))

    def parse(self) -> Condition:
        names = ", ".join(a.value for a in Aggregate)
        agg_token = self.take("word", expected=f"an aggregate ({names})")
        try:
            aggregate = Aggregate(agg_token.text.upper())
        except ValueError:
            raise ConditionError(f"unknown aggregate {agg_token.text!r}; use one of {names}", agg_token.column) from None
        self.take("op", "(")
        attribute: str | None = None
        token = self.peek()
        if aggregate is Aggregate.COUNT and token is not None and token.text in {"*", ")"}:
            if token.text == "*":
                self.i += 1
        else:
            attr_token = self.take("word", expected=f"an attribute ({', '.join(ATTRIBUTES)})")
            attribute = attr_token.text.lower()
            if attribute not in ATTRIBUTES:
                raise ConditionError(
                    f"unknown attribute {attr_token.text!r}; events carry {', '.join(ATTRIBUTES)}", attr_token.column
                )
        self.take("op", ")")
        self.take("word", "OVER")
        window_token = self.take("duration", expected="a window such as 30s, 5m or 1h")
        window_ms = _duration_ms(window_token)
        op = self.peek()
        if op is not None and op.kind == "word" and op.text.upper() == "BETWEEN":
            self.i += 1
            low = self.number()
            self.take("word", "AND")
            high = self.number()
            if low > high:
                raise ConditionError(f"empty range: {low:g} is above {high:g}", op.column)
            condition = Condition(aggregate, attribute, window_ms, low, high, True, True)
        else:
            comparator = self.take("op", expected="a comparison (>, >=, <, <=) or BETWEEN").text
            if comparator not in {">", ">=", "<", "<="}:
                raise ConditionError(f"expected a comparison, found {comparator!r}", op.column if op else None)
            value = self.number()
            inclusive = comparator.endswith("=")
            if comparator.startswith(">"):
                condition = Condition(aggregate, attribute, window_ms, low=value, low_inclusive=inclusive)
            else:
                condition = Condition(aggregate, attribute, window_ms, high=value, high_inclusive=inclusive)
        if self.peek() is not None:
            raise ConditionError(f"unexpected {self.peek().text!r} after the condition", self.column())  # type: ignore[union-attr]
        return condition


def _duration_ms(token: _Token) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", token.text)
    assert match is not None
    ms = float(match.group(1)) * UNITS_MS[match.group(2)]
    if ms <= 0 or ms != int(ms):
        raise ConditionError(f"window {token.text} is not a positive whole number of milliseconds", token.column)
    return int(ms)


def parse_condition(text: str) -> Condition:
    """Parse a condition, raising :class:`ConditionError` with a column on failure."""
    if not text or not text.strip():
        raise ConditionError("the condition is empty")
    return _Parser(text).parse()


def check_window(condition: Condition, pane_ms: int, max_window_ms: int) -> None:
    """Windows are whole numbers of panes and no longer than the evaluator keeps history."""
    if condition.window_ms % pane_ms:
        raise ConditionError(f"the window must be a multiple of {format_duration(pane_ms)}")
    if condition.window_ms > max_window_ms:
        raise ConditionError(f"the window may be at most {format_duration(max_window_ms)}")


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % UNITS_MS[unit] == 0:
            return f"{ms // UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def _number(value: float) -> str:
    """Shortest text that parses back to exactly ``value``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def format_condition(condition: Condition) -> str:
    """Canonical text of a condition (parses back to an equal condition)."""
    target = condition.attribute if condition.attribute else "*"
    head = f"{condition.aggregate.value}({target}) OVER {format_duration(condition.window_ms)}"
    if condition.low is not None and condition.high is not None:
        return f"{head} BETWEEN {_number(condition.low)} AND {_number(condition.high)}"
    if condition.low is not None:
        return f"{head} {'>=' if condition.low_inclusive else '>'} {_number(condition.low)}"
    return f"{head} {'<=' if condition.high_inclusive else '<'} {_number(condition.high)}"


_AGGREGATE_WORDS = {"COUNT": "number of events", "SUM": "sum of {a}", "AVG": "average {a}",
                    "MIN": "lowest {a}", "MAX": "highest {a}"}


def explain(condition: Condition) -> str:
    """The condition in plain words, for the subscription form."""
    what = _AGGREGATE_WORDS[condition.aggregate.value].format(a=condition.attribute)
    if condition.low is not None and condition.high is not None:
        test = f"is between {_number(condition.low)} and {_number(condition.high)}"
    elif condition.low is not None:
        test = f"is {'at least' if condition.low_inclusive else 'above'} {_number(condition.low)}"
    else:
        test = f"is {'at most' if condition.high_inclusive else 'below'} {_number(condition.high)}"  # type: ignore[arg-type]
    return f"fires for each key whose {what} over the last {format_duration(condition.window_ms)} {test}"
