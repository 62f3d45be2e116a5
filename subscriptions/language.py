"""The condition language users write subscriptions in.

    SUM(volume) OVER 5m > 2e6
    COUNT(*) OVER 30s >= 100
    AVG(price) OVER 1h BETWEEN 10 AND 20
    QUANTILE(volume, 0.95) OVER 15m > 5000
    MAX(price) - MIN(price) OVER 30m > 3%
    SUM(volume) OVER 5m > 2e6 FOR 2m KEEP FIRING FOR 5m
    SUM(volume) OVER 5m > 2e6 RESOLVE BELOW 1.5e6 DAMPEN 10m
    LAST(price) OVER 1m CROSSES ABOVE 100
    CHANGE(price) OVER 5m < -3%
    AVG(price) OVER LAST 100 EVENTS > 10
    NO DATA FOR 5m
    SUM(volume) OVER 5m > 2e6 WHERE exchange IN ('XNAS', 'XNYS') AND key STARTS WITH 'AA'
    (SUM(volume) OVER 5m) / (SUM(volume) OVER 1h) * 12 > 3
    SUM(volume) OVER 5m IN TOP 10
    CHANGE(price) OVER 1h IN BOTTOM 5 WHERE key STARTS WITH 'AA'

Grammar (case-insensitive words)::

    condition  := (expr [OVER window] (comparison | crossing) clause* | expr [OVER duration] rank
                   | NO DATA FOR duration) [WHERE filters]
    rank       := IN (TOP | BOTTOM) integer
    window     := duration | LAST integer EVENTS
    expr       := term (('+' | '-') term)*
    term       := factor (('*' | '/') factor)*
    factor     := number | '-' factor | aggregate | '(' expr [OVER duration] ')'
    aggregate  := NAME '(' ['*'] ')' | NAME '(' attribute [',' number] ')'
    comparison := a comparator's syntax, each {} a threshold: '>' threshold | BETWEEN threshold AND threshold | ...
    threshold  := ['-' | '+'] number ['%']
    crossing   := CROSSES (ABOVE | BELOW)? threshold
    clause     := FOR duration | KEEP FIRING FOR duration | RESOLVE (BELOW | ABOVE) threshold | DAMPEN duration
    filters    := filter (AND filter)*
    filter     := dimension ('=' string | IN '(' string (',' string)* ')')
                | key ('=' string | IN '(' string (',' string)* ')' | STARTS WITH string)
    string     := "'" characters "'"        (a quote inside is doubled: 'O''Hare')

A parenthesised part of the expression may name its own window, ``(SUM(volume) OVER 1h)``: a key compared
with its own baseline. The trailing ``OVER window`` is then the window of the terms that name none, and may be
left out when every term names one. Terms all over one window are that condition written plainly; over several,
every term keeps its own window and the condition's is the longest (``Condition._check_term_windows``).

A rank (evaluator/rank.py) fires when a key enters the first ``k`` keys of the view by the value (the highest for
TOP, the lowest for BOTTOM; keys with no event in the window are not ranked) and resolves when it leaves them.

The clauses (each at most once, in any order) are the alert's lifecycle, see
evaluator/lifecycle.py: a pending period, keep-firing, a separate resolve threshold
(hysteresis) and damping; a crossing is an event that takes DAMPEN only.

Attributes and dimensions are those of the subscription's stream (``core.streams.StreamSchema``; the
built-in ``trades`` stream when none is given). ``WHERE`` narrows the stream to a substream: each
dimension filter keeps the events whose dimension is one of its values (``Condition.where``), and
``key STARTS WITH`` the keys with that prefix (``Condition.key_prefix``). ``key IN (...)`` (or
``key = '...'``) is no part of the condition: it is a list of keys, returned beside it
(:class:`Filtered`), which a subscription intersects with its ``keys`` (:func:`combine_keys`), so the
canonical text never holds it. ``key`` may also be written as the stream's key field (``host``).

The aggregates (their names, arguments and aliases) are those declared in
evaluator/aggregates.py, the comparisons those in evaluator/comparators.py.

A percentage compares the expression with that share of the last value of the
one attribute it uses ("high minus low above 3% of the last price"), except for
``CHANGE(x)`` alone, where it is the change relative to the window's first value
(``PCT_CHANGE(x)``, TradingView's "moving up %"); CHANGE inside a larger expression
with a percentage is refused, so neither reading is ever guessed.

Parsing is a small hand-written tokenizer + recursive descent so every error can
say what was expected and where (column numbers start at 1).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import cast

from core.stream_names import TRADES
from core.streams import KEY_CHARS, KEY_MAX, WIRE_KEY, StreamSchema
from evaluator.aggregates import AGGREGATES, SPELLINGS, EventAggregate, format_term, number_text
from evaluator.comparators import COMPARATORS, CROSSINGS, Comparator, Crossing, Range, comparator_of, crossing_of
from evaluator.expr import term_windows, with_window
from evaluator.lifecycle import Lifecycle, contains
from evaluator.rank import MAX_RANK, Rank
from evaluator.spec import Aggregate, BinOp, Condition, Expr, Num, Term, expr_terms
from ingest.model import ATTRIBUTES

_CHANGES = ("CHANGE", "PCT_CHANGE")  # with a %, CHANGE(x) alone means PCT_CHANGE(x); never inside an expression
UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# Symbols: the comparators' (longest first, so ">=" is one token) and the expressions'.
_SYMBOLS = sorted({t for c in COMPARATORS for t in c.tokens if t != "{}" and not t.isalpha()}
                  | {"(", ")", "*", "+", "-", "/", ",", "%", "="}, key=len, reverse=True)
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<duration>\d+(?:\.\d+)?(?:ms|s|m|h|d)\b)
      | (?P<number>(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<string>'(?:[^']|'')*')
      | (?P<op>"""
    + "|".join(re.escape(symbol) for symbol in _SYMBOLS)
    + ")\n    )",
    re.VERBOSE,
)
_COMPARISONS = ", ".join(c.syntax.replace("{}", "x") for c in COMPARATORS)


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
            if text[column - 1] == "'":
                raise ConditionError("unterminated string: end it with ' (a quote inside is doubled: 'O''Hare')",
                                     column)
            if text[column - 1] == '"':
                raise ConditionError("strings are in single quotes, as in 'XNAS'", column)
            raise ConditionError(f"unexpected character {text[column - 1]!r}", column)
        kind = match.lastgroup or ""
        tokens.append(_Token(kind, match.group(kind), match.start(kind) + 1))
        pos = match.end()
    return tokens


MAX_NESTING = 32  # parentheses and unary signs within each other
#: Different windows one condition's parts may name. Each length is a running aggregate per key that every pane
#: entering the shard updates: a baseline needs two, and the bound keeps one subscription from adding a dozen.
MAX_PART_WINDOWS = 4
_KEY = re.compile(f"{KEY_CHARS}+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class StreamFields:
    """What a condition on a stream may name: its attributes and dimensions (looked up exactly, else ignoring
    case when that is unambiguous) and its key field, another name for ``key``."""

    name: str
    attributes: tuple[str, ...]
    dimensions: tuple[str, ...] = ()
    key_field: str = WIRE_KEY
    dimension_max: dict[str, int] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, schema: StreamSchema) -> StreamFields:
        return cls(schema.name, schema.attribute_names, schema.dimension_names, schema.key_field,
                   {d.name: d.max_length for d in schema.dimensions})

    any_name: bool = False  # every name is an attribute or dimension: a check of the syntax alone

    def attribute(self, text: str) -> str | None:
        return text if self.any_name else _lookup(text, self.attributes)

    def dimension(self, text: str) -> str | None:
        return text if self.any_name else _lookup(text, self.dimensions)

    def is_key(self, text: str) -> bool:
        """``key`` or the key field as spelt, else in any case unless a dimension is spelt so."""
        if text in (WIRE_KEY, self.key_field):
            return True
        return self.dimension(text) is None and text.lower() in (WIRE_KEY, self.key_field.lower())

    def dimension_list(self) -> str:
        return ", ".join(self.dimensions) if self.dimensions else "none"


def _lookup(text: str, names: Iterable[str]) -> str | None:
    names = tuple(names)
    if text in names:
        return text
    folded = [name for name in names if name.lower() == text.lower()]
    return folded[0] if len(folded) == 1 else None


#: Conditions name the built-in stream unless told otherwise (its attributes as ``ingest.model`` declares them).
TRADES_FIELDS = StreamFields(TRADES, ATTRIBUTES)
#: Any stream: for checking a condition's syntax before its stream's schema is at hand (request bodies).
ANY_FIELDS = StreamFields("*", (), any_name=True)


def stream_fields(stream: StreamSchema | StreamFields | None) -> StreamFields:
    if stream is None:
        return TRADES_FIELDS
    return stream if isinstance(stream, StreamFields) else StreamFields.of(stream)


@dataclass(frozen=True)
class Filtered:
    """A parsed condition and the keys its ``key IN (...)`` lists (None: it lists none)."""

    condition: Condition
    keys: frozenset[str] | None = None


class _Parser:
    def __init__(self, text: str, fields: StreamFields = TRADES_FIELDS) -> None:
        self.text = text
        self.fields = fields
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0
        self.term_columns: list[tuple[Term, int]] = []  # each aggregate parsed, with its column

    def peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def at(self, *texts: str) -> bool:
        token = self.peek()
        return token is not None and token.kind in ("op", "word") and token.text.upper() in texts

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

    # -- expressions ------------------------------------------------------------------

    def expr(self) -> Expr:
        node = self.term()
        while self.at("+", "-"):
            op = self.take("op").text
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.factor()
        while self.at("*", "/"):
            op = self.take("op").text
            node = BinOp(op, node, self.factor())
        return node

    def factor(self) -> Expr:
        """Nesting is bounded, so deep parentheses or signs are a ConditionError, not a RecursionError."""
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise ConditionError(f"parentheses and signs nest at most {MAX_NESTING} deep", self.column())
            return self._factor()
        finally:
            self.depth -= 1

    def _factor(self) -> Expr:
        token = self.peek()
        if token is not None and token.kind == "number":
            return Num(self.number())
        if self.at("-"):
            self.i += 1
            inner = self.factor()
            return Num(-inner.value) if isinstance(inner, Num) else BinOp("*", Num(-1.0), inner)
        if self.at("("):
            self.i += 1
            node = self.expr()
            if self.at("OVER"):  # a window of its own for this part: a key against its own baseline
                over = self.take("word")
                token = self.take("duration", expected="a duration such as 5m or 1h: a part's own window is a time "
                                                       "window")
                if not expr_terms(node):
                    raise ConditionError("a window needs an aggregate to be over, as in (SUM(volume) OVER 1h)",
                                         over.column)
                node = with_window(node, _duration_ms(token))
                self.take("op", ")", expected="')': a window inside parentheses ends them, as in (SUM(volume) OVER "
                                              "1h)")
            else:
                self.take("op", ")")
            return node
        return self.aggregate()

    def aggregate(self) -> Term:
        column = self.column()
        term = self._aggregate()
        self.term_columns.append((term, column))
        return term

    def _aggregate(self) -> Term:
        names = ", ".join(SPELLINGS)
        token = self.take("word", expected=f"an aggregate ({names})")
        spelling = SPELLINGS.get(token.text.upper())
        if spelling is None:
            raise ConditionError(f"unknown aggregate {token.text!r}; use one of {names}", token.column)
        aggregate, param = spelling
        self.take("op", "(")
        if not aggregate.takes_attribute:
            if self.at("*"):
                self.i += 1
            self.take("op", ")")
            return Term(aggregate.name)
        attribute = self.attribute()
        if aggregate.param is not None and param is None:
            self.take("op", ",", expected=aggregate.param.expected)
            column = self.column()
            param = self.number()
            if not aggregate.param.valid(param):
                raise ConditionError(aggregate.param.invalid.format(value=param), column)
        self.take("op", ")")
        return Term(aggregate.name, attribute, param)

    def attribute(self) -> str:
        names = ", ".join(self.fields.attributes)
        token = self.take("word", expected=f"an attribute ({names})")
        attribute = self.fields.attribute(token.text)
        if attribute is None:
            where = "events carry" if self.fields.name == TRADES else f"stream {self.fields.name} has"
            raise ConditionError(f"unknown attribute {token.text!r}; {where} {names}", token.column)
        return attribute

    def threshold(self) -> tuple[float, bool]:
        negative = self.at("-")
        if negative or self.at("+"):
            self.i += 1
        value = self.number()
        percent = self.at("%")
        if percent:
            self.i += 1
        return (-value if negative else value), percent

    # -- the condition -------------------------------------------------------------------

    def parse(self) -> Filtered:
        condition = self.no_data() if self.at("NO") else self.value_condition()
        filters = self.filters()
        token = self.peek()
        if token is not None:
            if self.at(*_CLAUSES, "CROSSES") and filters.given:
                raise ConditionError(f"WHERE comes last: write {token.text.upper()} before it", token.column)
            raise ConditionError(f"unexpected {token.text!r} after the condition", token.column)
        condition = replace(condition, stream=self.fields.name, where=filters.where, key_prefix=filters.prefix)
        return Filtered(condition, filters.keys)

    def value_condition(self) -> Condition:
        start = self.column()
        expression = self.expr()
        terms = expr_terms(expression)
        if not terms:
            raise ConditionError("the condition needs an aggregate such as SUM(volume)", start)
        own = [t.window_ms for t in terms if t.window_ms is not None]
        if len(own) == len(terms) and not self.at("OVER"):  # every part names its window: no trailing OVER
            window_ms, events = max(own), None
        else:
            over = self.column()
            self.take("word", "OVER", expected="OVER and a window for the parts with none of their own, as in "
                                               "(SUM(volume) OVER 5m) / SUM(volume) OVER 1h" if term_windows(expression)
                      else "OVER and a window, as in OVER 5m or OVER LAST 100 EVENTS")
            window_ms, events = self.window()
            if events is not None and term_windows(expression):
                raise ConditionError("a tuple window (LAST n EVENTS) is the whole condition's: no part may have a "
                                     "time window of its own", over)
        expression, window_ms = _one_form(expression, window_ms)
        if len(term_windows(expression)) > MAX_PART_WINDOWS:
            raise ConditionError(f"a condition's parts may be over at most {MAX_PART_WINDOWS} different windows: the "
                                 "evaluator keeps each window length per key", start)
        column = self.column()
        if self.at("IN"):
            return self.rank(expression, window_ms, events, column)
        crossing = self.crossing()
        if crossing is None:
            comparator, thresholds, percents = self.comparison()
        else:
            threshold, percent = self.threshold()
            comparator, thresholds, percents = COMPARATORS[0], [threshold], [percent]  # its raw truth: one side
        clauses = self.clauses()
        if len(set(percents)) > 1:
            raise ConditionError("give both ends of the range as percentages, or neither", column)
        if any(a > b for a, b in itertools.pairwise(thresholds)):
            raise ConditionError(f"empty range: {thresholds[0]:g} is above {thresholds[-1]:g}", column)
        ranges = comparator.ranges(*thresholds) if crossing is None else (crossing.side(thresholds[0]),)
        lifecycle = self.lifecycle(clauses, crossing, ranges, bool(percents and percents[0]))
        if percents and percents[0] and any(t.aggregate in _CHANGES for t in expr_terms(expression)):
            if not (isinstance(expression, Term) and expression.aggregate == "CHANGE"):
                raise ConditionError("a percentage of CHANGE is relative to the window's first value: write "
                                     "CHANGE(x) alone before the comparison, or use PCT_CHANGE(x) without %", start)
            return Condition(Aggregate.PCT_CHANGE, expression.attribute, window_ms, ranges=ranges, events=events,
                             lifecycle=lifecycle)
        if percents and percents[0]:
            attributes = {term.attribute for term in expr_terms(expression) if term.attribute}
            if len(attributes) != 1:
                raise ConditionError("a percentage compares with the last value of one attribute: use it with an "
                                     "expression over exactly one attribute, like MAX(price) - MIN(price)", start)
            return Condition(Aggregate.EXPR, None, window_ms, expression=expression,
                             percent_of=attributes.pop(), ranges=ranges, events=events, lifecycle=lifecycle)
        if isinstance(expression, Term):
            return Condition(Aggregate(expression.aggregate), expression.attribute, window_ms, q=expression.param,
                             ranges=ranges, events=events, lifecycle=lifecycle)
        return Condition(Aggregate.EXPR, None, window_ms, expression=expression, ranges=ranges, events=events,
                         lifecycle=lifecycle)

    def rank(self, expression: Expr, window_ms: int, events: int | None, column: int) -> Condition:
        """``IN TOP k`` or ``IN BOTTOM k`` after the value: a rank condition (no thresholds, no clauses)."""
        self.i += 1
        direction = self.peek()
        if direction is None or direction.text.upper() not in ("TOP", "BOTTOM"):
            raise ConditionError("expected TOP or BOTTOM after IN, as in IN TOP 10", self.column())
        self.i += 1
        token = self.take("number", expected="how many keys, as in IN TOP 10")
        digits = token.text.replace("_", "")
        if not digits.isdigit() or not 1 <= int(digits) <= MAX_RANK:
            raise ConditionError(f"a rank is within the first 1 to {MAX_RANK} keys, not {token.text}", token.column)
        if events is not None:
            raise ConditionError("a rank is over a time window (OVER 5m), not over LAST n EVENTS", column)
        if self.at(*_CLAUSES, "CROSSES"):
            word = self.peek().text.upper()  # type: ignore[union-attr]  # at() saw it
            raise ConditionError(f"a rank condition takes no {word}: it fires when the key enters the first "
                                 f"{digits} and resolves when it leaves them", self.column())
        rank = Rank(int(digits), direction.text.upper() == "TOP")
        if isinstance(expression, Term):
            return Condition(Aggregate(expression.aggregate), expression.attribute, window_ms, q=expression.param,
                             rank=rank)
        return Condition(Aggregate.EXPR, None, window_ms, expression=expression, rank=rank)

    def window(self) -> tuple[int, int | None]:
        """After OVER: a duration (``window_ms``, None), or ``LAST n EVENTS`` (0, n) with aggregates that allow it."""
        if not self.at("LAST"):
            token = self.take("duration", expected="a window such as 30s, 5m or 1h, or LAST 100 EVENTS")
            return _duration_ms(token), None
        self.i += 1
        token = self.take("number", expected="a number of events, as in LAST 100 EVENTS")
        digits = token.text.replace("_", "")
        if not digits.isdigit() or int(digits) < 1:
            raise ConditionError(f"a tuple window holds a whole number of events, at least 1, not {token.text}",
                                 token.column)
        events = int(digits)
        self.take("word", "EVENTS", expected="EVENTS, as in LAST 100 EVENTS")
        for term, column in self.term_columns:
            if not AGGREGATES[term.aggregate].tuple_windows:
                raise ConditionError(f"{term.aggregate} is over a time window only (OVER 5m), not over LAST n "
                                     "EVENTS", column)
        return 0, events

    def no_data(self) -> Condition:
        """``NO DATA FOR duration``: COUNT(*) OVER duration <= 0, for every key watched (listed, or seen)."""
        self.i += 1
        self.take("word", "DATA", expected="DATA, as in NO DATA FOR 5m")
        self.take("word", "FOR", expected="FOR and a duration, as in NO DATA FOR 5m")
        token = self.take("duration", expected="a duration such as 30s, 5m or 1h, as in NO DATA FOR 5m")
        window_ms = _duration_ms(token)
        return Condition(Aggregate.COUNT, None, window_ms, high=0.0, high_inclusive=True, no_data=True)

    def comparison(self) -> tuple[Comparator, list[float], list[bool]]:
        """One of the comparators' syntaxes: which, its thresholds, and which of them are percentages."""
        token = self.peek()
        candidates = [c for c in COMPARATORS if token is not None and token.kind in ("op", "word")
                      and token.text.upper() == c.tokens[0]]
        if not candidates:
            found = f"{token.text!r}" if token else "end of input"
            raise ConditionError(f"expected a comparison ({_COMPARISONS}), found {found}", self.column())
        first_error: ConditionError | None = None
        start = self.i
        for comparator in sorted(candidates, key=lambda c: -len(c.tokens)):
            self.i = start
            try:
                return self._comparison(comparator)
            except ConditionError as error:
                first_error = first_error or error
        raise first_error  # type: ignore[misc]  # candidates is not empty, so some comparator raised

    def _comparison(self, comparator: Comparator) -> tuple[Comparator, list[float], list[bool]]:
        thresholds, percents = [], []
        for word in comparator.tokens:
            if word == "{}":
                value, percent = self.threshold()
                thresholds.append(value)
                percents.append(percent)
            else:
                self.take("word" if word.isalpha() else "op", word)
        return comparator, thresholds, percents


    # -- the substream: WHERE ------------------------------------------------------------------

    def filters(self) -> _Filters:
        """``WHERE filter (AND filter)*``: dimension filters, a key list and a key prefix (none without WHERE)."""
        if not self.at("WHERE"):
            return _Filters()
        self.i += 1
        where: dict[str, tuple[str, ...]] = {}
        keys: tuple[tuple[str, int], ...] | None = None
        prefix: tuple[str, int] | None = None
        dimensions = self.fields.dimension_list()
        while True:
            token = self.take("word", expected=f"a dimension ({dimensions}) or key, as in WHERE key IN ('A', 'B')")
            if self.fields.is_key(token.text) or (self.fields.any_name and self.at("STARTS")):  # any key field
                if self.at("STARTS"):
                    self.i += 1
                    self.take("word", "WITH", expected="WITH, as in key STARTS WITH 'AA'")
                    if prefix is not None:
                        raise ConditionError("key STARTS WITH is given twice", token.column)
                    prefix = self.key_text(prefix=True)
                else:
                    if keys is not None:
                        raise ConditionError("key is filtered twice: list its keys once, as in key IN ('A', 'B')",
                                             token.column)
                    keys = self.values(token.text, self.key_text)
            else:
                dimension = self.fields.dimension(token.text)
                if dimension is None:
                    raise ConditionError(f"unknown dimension {token.text!r}; stream {self.fields.name} has "
                                         f"dimensions: {dimensions} (and key)", token.column)
                if dimension in where:
                    raise ConditionError(f"dimension {dimension} is filtered twice: list its values once, as in "
                                         f"{dimension} IN ('a', 'b')", token.column)
                literal = functools.partial(self.dimension_text, self.fields.dimension_max.get(dimension))
                where[dimension] = tuple(v for v, _ in self.values(dimension, literal))
            if not self.at("AND"):
                break
            self.i += 1
        if prefix is not None and keys is not None:
            for key, column in keys:
                if not key.startswith(prefix[0]):
                    raise ConditionError(f"key {key!r} does not start with {prefix[0]!r}: it would never be watched",
                                         column)
        return _Filters(tuple(where.items()), prefix[0] if prefix else None,
                        frozenset(k for k, _ in keys) if keys is not None else None, True)

    def values(self, name: str, literal: Callable[[], tuple[str, int]]) -> tuple[tuple[str, int], ...]:
        """``= 'v'`` or ``IN ('a', 'b', ...)``: the values with their columns."""
        if self.at("="):
            self.i += 1
            return (literal(),)
        if not self.at("IN"):
            seen = f"{self.peek().text!r}" if self.peek() else "end of input"  # type: ignore[union-attr]
            raise ConditionError(f"expected = or IN after {name}, found {seen}", self.column())
        self.i += 1
        self.take("op", "(", expected=f"( and a list of strings, as in {name} IN ('a', 'b')")
        if self.at(")"):
            raise ConditionError(f"IN needs at least one value, as in {name} IN ('a')", self.column())
        found = [literal()]
        while self.at(","):
            self.i += 1
            found.append(literal())
        self.take("op", ")", expected=") or ',' and another string")
        return tuple(found)

    def string(self) -> tuple[str, int]:
        """A string literal's value (quotes removed, doubled quotes undone) and its column."""
        token = self.take("string", expected="a string in single quotes, as in 'XNAS'")
        value = token.text[1:-1].replace("''", "'")
        if _CONTROL.search(value):
            raise ConditionError("a string may not hold control characters (tabs, line breaks...)", token.column)
        return value, token.column

    def dimension_text(self, limit: int | None) -> tuple[str, int]:
        value, column = self.string()
        if limit is not None and len(value) > limit:
            raise ConditionError(f"the value is longer than the dimension's {limit} characters: no event carries it",
                                 column)
        return value, column

    def key_text(self, prefix: bool = False) -> tuple[str, int]:
        value, column = self.string()
        if not value:
            raise ConditionError("a key prefix is not empty" if prefix else "a key is not empty", column)
        if len(value) > KEY_MAX or not _KEY.fullmatch(value):
            raise ConditionError(f"{value!r} is no key: keys are 1 to {KEY_MAX} of A-Z a-z 0-9 . _ : - /", column)
        return value, column

    # -- the lifecycle -------------------------------------------------------------------------

    def crossing(self) -> Crossing | None:
        """``CROSSES [ABOVE | BELOW]``, up to its threshold (None: the condition is not a crossing)."""
        if not self.at("CROSSES"):
            return None
        self.i += 1
        for direction in ("ABOVE", "BELOW"):
            if self.at(direction):
                self.i += 1
                return crossing_of(direction.lower())
        return crossing_of("either")

    def clauses(self) -> dict[str, tuple[int, object]]:
        """The lifecycle clauses: name -> (column, duration ms or (side, threshold, percent))."""
        found: dict[str, tuple[int, object]] = {}
        while self.at(*_CLAUSES):
            column = self.column()
            word = self.take(self.peek().kind, expected="a clause").text.upper()  # type: ignore[union-attr]  # at() saw it
            if word == "KEEP":
                self.take("word", "FIRING", expected="FIRING FOR and a duration, as in KEEP FIRING FOR 5m")
                self.take("word", "FOR", expected="FOR and a duration, as in KEEP FIRING FOR 5m")
            name = _CLAUSES[word]
            if name in found:
                raise ConditionError(f"{_CLAUSE_SYNTAX[name]} is given twice", column)
            if name == "resolve":
                if not self.at("BELOW", "ABOVE"):
                    found_text = f"{self.peek().text!r}" if self.peek() else "end of input"  # type: ignore[union-attr]
                    raise ConditionError(f"expected BELOW or ABOVE after RESOLVE, found {found_text}", self.column())
                side = self.take("word").text.upper()
                value, percent = self.threshold()
                found[name] = (column, (side, value, percent))
            else:
                token = self.take("duration", expected=f"a duration such as 30s, 5m or 1h after {_CLAUSE_SYNTAX[name]}")
                match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", token.text)
                ms = float(match.group(1)) * UNITS_MS[match.group(2)] if match else 0.0
                if ms <= 0 or ms != int(ms):
                    raise ConditionError(f"{_CLAUSE_SYNTAX[name]} {token.text} is not a positive whole number of "
                                         "milliseconds", token.column)
                found[name] = (column, int(ms))
        return found

    def lifecycle(self, clauses: dict[str, tuple[int, object]], crossing: Crossing | None,
                  ranges: tuple[Range, ...], percent: bool) -> Lifecycle | None:
        """The clauses as a :class:`Lifecycle`, checked: what a crossing takes, and the resolve range."""
        if crossing is not None:
            for name in ("for", "keep", "resolve"):
                if name in clauses:
                    raise ConditionError(f"a crossing is an event: it takes DAMPEN, not {_CLAUSE_SYNTAX[name]}",
                                         clauses[name][0])
        resolve = None
        if "resolve" in clauses:
            column, clause = clauses["resolve"]
            side, value, pct = cast(tuple[str, float, bool], clause)
            if pct != percent:
                raise ConditionError("give the resolve threshold as a percentage exactly when the condition's "
                                     "thresholds are", column)
            resolve = Range(low=value, low_inclusive=True) if side == "BELOW" else Range(high=value, high_inclusive=True)
            if not all(contains(resolve, r) for r in ranges):
                bounded = all((r.low if side == "BELOW" else r.high) is not None for r in ranges)
                fix = (f"the resolve threshold must be {'at or below' if side == 'BELOW' else 'at or above'} the "
                       "firing range") if bounded else \
                    f"use RESOLVE {'ABOVE' if side == 'BELOW' else 'BELOW'} for a condition with no " \
                    f"{'lower' if side == 'BELOW' else 'upper'} bound"
                raise ConditionError(f"RESOLVE {side} {number_text(value)} would resolve values the condition fires "
                                     f"for: {fix}", column)

        def ms(name: str) -> int:
            return int(clauses[name][1]) if name in clauses else 0  # type: ignore[call-overload]  # a duration

        life = Lifecycle(ms("for"), ms("keep"), ms("dampen"), resolve, crossing.direction if crossing else None)
        return None if life.trivial else life


@dataclass(frozen=True)
class _Filters:
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    prefix: str | None = None
    keys: frozenset[str] | None = None
    given: bool = False  # WHERE was written


_CLAUSES = {"FOR": "for", "KEEP": "keep", "RESOLVE": "resolve", "DAMPEN": "dampen"}
_CLAUSE_SYNTAX = {"for": "FOR", "keep": "KEEP FIRING FOR", "resolve": "RESOLVE", "dampen": "DAMPEN"}


def _duration_ms(token: _Token) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", token.text)
    assert match is not None
    ms = float(match.group(1)) * UNITS_MS[match.group(2)]
    if ms <= 0 or ms != int(ms):
        raise ConditionError(f"window {token.text} is not a positive whole number of milliseconds", token.column)
    return int(ms)


def parse_filtered(text: str, stream: StreamSchema | StreamFields | None = None) -> Filtered:
    """Parse a condition on ``stream`` (``trades`` when None) and the keys its ``key IN`` lists, raising
    :class:`ConditionError` with a column on failure."""
    if not text or not text.strip():
        raise ConditionError("the condition is empty")
    return _Parser(text, stream_fields(stream)).parse()


def parse_condition(text: str, stream: StreamSchema | StreamFields | None = None) -> Condition:
    """Parse a condition on ``stream`` (``trades`` when None). A ``key IN`` list is refused: it restricts a
    subscription's keys, which only :func:`parse_filtered` returns (never dropped unseen)."""
    filtered = parse_filtered(text, stream)
    if filtered.keys is not None:
        raise ConditionError("key IN lists a subscription's keys: give them as its keys")
    return filtered.condition


def combine_keys(listed: Collection[str] | None, filtered: Collection[str] | None,
                 prefix: str | None = None) -> list[str] | None:
    """The keys a subscription watches: its ``keys`` field and its condition's ``key IN`` both restrict them, so
    it watches the keys in both (either alone when the other is absent; None: every key). No key in common, or
    a listed key without the condition's ``key STARTS WITH`` prefix, is an error rather than a subscription
    that can never fire for it."""
    if listed is not None and prefix is not None:
        outside = sorted(k for k in listed if not k.startswith(prefix))
        if outside:
            raise ConditionError(f"the keys {', '.join(outside)} do not start with {prefix!r} (key STARTS WITH): "
                                 "they would never be watched")
    if listed is None and filtered is None:
        return None
    if listed is None or filtered is None:
        return sorted(set(listed if listed is not None else filtered))  # type: ignore[arg-type]  # one is given
    common = sorted(set(listed) & set(filtered))
    if not common:
        raise ConditionError("key IN (...) and the subscription's keys have no key in common: it would watch "
                             "nothing (a subscription watches the keys in both)")
    return common


def _one_form(expression: Expr, window_ms: int) -> tuple[Expr, int]:
    """The expression and the condition's window in the one form a condition has: terms over one window are written
    plainly over it; over several, each keeps its own and the condition's is the longest."""
    expression = with_window(expression, window_ms) if term_windows(expression) else expression
    windows = term_windows(expression)
    if not windows:
        return expression, window_ms
    if len(windows) == 1:
        return with_window(expression, None), windows.pop()
    return expression, max(windows)


def check_window(condition: Condition, pane_ms: int, max_window_ms: int, quantile_max_window_ms: int,
                 max_events: int | None = None) -> None:
    """Windows are whole numbers of panes and no longer than the evaluator keeps history (raw values for quantiles);
    a tuple window holds at most ``max_events`` (TOCSIN_TUPLE_MAX_EVENTS; None: unchecked); NO DATA is shorter
    than the horizon, after which a silent key is forgotten."""
    if condition.events is not None:
        if max_events is not None and condition.events > max_events:
            if not max_events:
                raise ConditionError("tuple windows (OVER LAST n EVENTS) are switched off on this deployment")
            raise ConditionError(f"a tuple window may hold at most {max_events} events")
        return
    if condition.no_data and condition.window_ms >= max_window_ms:
        raise ConditionError(f"NO DATA FOR must be shorter than {format_duration(max_window_ms)}: a key silent "
                             "that long is forgotten")
    for window_ms in sorted(condition.windows):
        if window_ms % pane_ms:
            raise ConditionError(f"the window must be a multiple of {format_duration(pane_ms)}")
        if window_ms > max_window_ms:
            raise ConditionError(f"the window may be at most {format_duration(max_window_ms)}")
    for term in condition.terms:
        aggregate = AGGREGATES[term.aggregate]
        if (isinstance(aggregate, EventAggregate) and aggregate.needs_every_event
                and term.over(condition.window_ms) > quantile_max_window_ms):
            noun = aggregate.name.lower()
            if not quantile_max_window_ms:
                raise ConditionError(f"{noun}s are switched off on this deployment")
            raise ConditionError(f"a {noun}'s window may be at most {format_duration(quantile_max_window_ms)}")


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % UNITS_MS[unit] == 0:
            return f"{ms // UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def format_expr(expr: Expr, context: int = 0, right: bool = False) -> str:
    """Text of an expression with only the parentheses it needs."""
    if isinstance(expr, Num):
        return number_text(expr.value)
    if isinstance(expr, Term):
        text = format_term(expr)
        return text if expr.window_ms is None else f"({text} OVER {format_duration(expr.window_ms)})"
    level = _PRECEDENCE[expr.op]
    text = f"{format_expr(expr.left, level)} {expr.op} {format_expr(expr.right, level, right=True)}"
    return f"({text})" if level < context or (right and level == context) else text


def _window_text(condition: Condition) -> str:
    return f"LAST {condition.events} EVENTS" if condition.events is not None else format_duration(condition.window_ms)


def quote(value: str) -> str:
    """A string literal of the language: single quotes, a quote inside doubled."""
    return "'" + value.replace("'", "''") + "'"


def format_filters(condition: Condition) -> str:
    """The canonical WHERE clause (leading space; "" for the whole stream): dimensions in order, then the prefix."""
    parts = [f"{dimension} = {quote(values[0])}" if len(values) == 1
             else f"{dimension} IN ({', '.join(quote(v) for v in values)})" for dimension, values in condition.where]
    if condition.key_prefix is not None:
        parts.append(f"key STARTS WITH {quote(condition.key_prefix)}")
    return " WHERE " + " AND ".join(parts) if parts else ""


def format_condition(condition: Condition) -> str:
    """Canonical text of a condition (parses back to an equal condition on its stream); the stream is named
    by the subscription, not the text."""
    return _format_value(condition) + format_filters(condition)


def _format_value(condition: Condition) -> str:
    if condition.no_data:
        return f"NO DATA FOR {format_duration(condition.window_ms)}"
    computes = condition.computes
    pct = "%" if condition.percent_of else ""
    if isinstance(computes, Term) and computes.aggregate == "PCT_CHANGE":  # written CHANGE(x) ... x%
        computes, pct = Term("CHANGE", computes.attribute), "%"
    head = format_expr(computes)
    if not term_windows(computes):  # else every term names its own
        head += f" OVER {_window_text(condition)}"
    if condition.rank is not None:
        return f"{head} IN {'TOP' if condition.rank.top else 'BOTTOM'} {condition.rank.k}"
    life = condition.lifecycle
    if life is not None and life.crossing is not None:
        [side] = condition.accepted
        threshold = side.low if side.low is not None else side.high
        assert threshold is not None  # a crossing's side is a half-line
        return f"{head} {crossing_of(life.crossing).syntax.format(f'{number_text(threshold)}{pct}')}" + \
            format_lifecycle(life, pct)
    comparator, thresholds = comparator_of(condition.accepted)
    text = f"{head} {comparator.syntax.format(*(f'{number_text(t)}{pct}' for t in thresholds))}"
    return text + format_lifecycle(life, pct) if life is not None else text


def format_lifecycle(life: Lifecycle, pct: str = "") -> str:
    """The lifecycle clauses' canonical text (leading space), in the order RESOLVE, FOR, KEEP FIRING FOR, DAMPEN."""
    text = ""
    if life.resolve is not None:
        r = life.resolve
        text += f" RESOLVE BELOW {number_text(r.low)}{pct}" if r.low is not None else \
            f" RESOLVE ABOVE {number_text(r.high)}{pct}"  # type: ignore[arg-type]  # one side is bounded
    for ms, word in ((life.for_ms, "FOR"), (life.keep_firing_ms, "KEEP FIRING FOR"), (life.dampen_ms, "DAMPEN")):
        if ms:
            text += f" {word} {format_duration(ms)}"
    return text


def explain(condition: Condition) -> str:
    """The condition in plain words, for the subscription form."""
    return _explain_value(condition) + explain_filters(condition)


def explain_filters(condition: Condition) -> str:
    """Which events and keys the condition is over, continuing :func:`explain`'s sentence ("" for every event
    of trades)."""
    parts = [f"{d} is {quote(vs[0])}" if len(vs) == 1 else f"{d} is one of {', '.join(quote(v) for v in vs)}"
             for d, vs in condition.where]
    text = ""
    if condition.stream != TRADES or parts:
        text += f" — counting only the events of stream {condition.stream}"
        text += f" whose {' and '.join(parts)}" if parts else ""
    if condition.key_prefix is not None:
        text += f"; only keys starting with {quote(condition.key_prefix)}"
    return text


def _explain_value(condition: Condition) -> str:
    if condition.aggregate is Aggregate.EXPR:
        what = format_expr(condition.computes)
    else:
        [term] = condition.terms
        what = AGGREGATES[term.aggregate].describe(term)
    pct = "%" if condition.percent_of else ""
    if condition.rank is not None:
        order = "highest" if condition.rank.top else "lowest"
        place = f"is the {order}" if condition.rank.k == 1 else f"is among the {condition.rank.k} {order}"
        return (f"fires when a key's {what}{_window_words(condition)} {place} of all keys with events in that "
                f"window, and resolves when it no longer is")
    life = condition.lifecycle
    if life is not None and life.crossing is not None:
        [side] = condition.accepted
        threshold = side.low if side.low is not None else side.high
        test = crossing_of(life.crossing).words.format(f"{number_text(threshold)}{pct}")  # type: ignore[arg-type]
        if condition.percent_of:
            test += f" of its latest {condition.percent_of}"
        text = f"notifies each time a key's {what}{_window_words(condition)} {test} (an event: nothing resolves)"
        if life.dampen_ms:
            text += f", at most once per key every {format_duration(life.dampen_ms)}"
        return text
    comparator, thresholds = comparator_of(condition.accepted)
    test = comparator.words.format(*(f"{number_text(t)}{pct}" for t in thresholds))
    if condition.percent_of:
        test += f" of its latest {condition.percent_of}"
    if condition.no_data:
        text = (f"fires for each key that has sent no event for {format_duration(condition.window_ms)} (a listed "
                "key always; any other until it has been silent for the evaluator's horizon, then it is forgotten)")
    else:
        text = f"fires for each key whose {what}{_window_words(condition)} {test}"
    return text + explain_lifecycle(life, pct) if life is not None else text


def _window_words(condition: Condition) -> str:
    """The window in words with a leading space (' over the last 5m'); empty when each term names its own window
    (the expression shows them)."""
    if condition.events is not None:
        return f" over the last {condition.events} events"
    return "" if term_windows(condition.computes) else f" over the last {format_duration(condition.window_ms)}"


def explain_lifecycle(life: Lifecycle, pct: str = "") -> str:
    """The lifecycle clauses in plain words, continuing :func:`explain`'s sentence."""
    text = ""
    if life.for_ms:
        text += f", once that has held for {format_duration(life.for_ms)} (pending until then)"
    if life.resolve is not None:
        r = life.resolve
        text += (f"; it resolves only when the value falls below {number_text(r.low)}{pct}" if r.low is not None
                 else f"; it resolves only when the value rises above {number_text(r.high)}{pct}")  # type: ignore[arg-type]
    if life.keep_firing_ms:
        text += f"; it keeps firing until the condition has been false for {format_duration(life.keep_firing_ms)}"
    if life.dampen_ms:
        text += (f"; once fired it stays firing at least {format_duration(life.dampen_ms)}, so a key notifies at "
                 f"most once per {format_duration(life.dampen_ms)}")
    return text


@dataclass(frozen=True)
class LanguageHelp:
    """What the form's help lists, read from the registries so it names every aggregate and comparison."""

    aggregates: tuple[tuple[str, str], ...]  # (syntax, plain words)
    aliases: tuple[tuple[str, str], ...]  # (alias, what it stands for)
    comparisons: tuple[str, ...]
    attributes: tuple[str, ...]
    lifecycle: tuple[tuple[str, str], ...] = ()  # (clause syntax, plain words)
    windows: tuple[tuple[str, str], ...] = ()  # (syntax, plain words): time and tuple windows, NO DATA
    filters: tuple[tuple[str, str], ...] = ()  # (syntax, plain words): the WHERE clause's forms


def language_help() -> LanguageHelp:
    return LanguageHelp(
        aggregates=tuple((a.syntax, a.summary) for a in AGGREGATES.values()),
        aliases=tuple((alias, format_term(Term(a.name, "attribute", param)))
                      for alias, (a, param) in SPELLINGS.items() if alias != a.name),
        comparisons=tuple(c.syntax.replace("{}", "x", 1).replace("{}", "y") for c in COMPARATORS),
        attributes=ATTRIBUTES,
        lifecycle=LIFECYCLE_HELP,
        windows=WINDOWS,
        filters=FILTERS,
    )


LIFECYCLE_HELP: tuple[tuple[str, str], ...] = (
    *((c.syntax.replace("{}", "x"), f"instead of a comparison: notify each time the value {c.words.format('x')} "
       "(an event; takes DAMPEN only)") for c in CROSSINGS),
    ("FOR d", "pending period: fire only once the condition has held for d"),
    ("KEEP FIRING FOR d", "resolve only once the condition has been false for d"),
    ("RESOLVE BELOW x / RESOLVE ABOVE x", "hysteresis: once firing, stay firing until the value leaves this range"),
    ("DAMPEN d", "once fired, stay firing at least d: at most one notification per key per d"),
)


#: The windows and constructs besides aggregates, for the form's help (and docs/conditions.md).
WINDOWS: tuple[tuple[str, str], ...] = (
    ("OVER 5m", "a time window: each key's events of the last 5 minutes (ms, s, m, h, d)"),
    ("OVER LAST 100 EVENTS", "a tuple window: each key's 100 newest events by event time, within the horizon "
                             "(every aggregate but those over time only)"),
    ("CHANGE(price) OVER 5m > 3%", "a percentage of CHANGE alone is relative to the window's first value "
                                   "(PCT_CHANGE); elsewhere a percentage is a share of the last value"),
    ("NO DATA FOR 5m", "fires for a key that sent nothing for 5 minutes: a listed key always, any other until "
                       "silent for the horizon"),
    ("(SUM(volume) OVER 5m) / (SUM(volume) OVER 3h) * 36 > 3",
     "a key against its own baseline: a part in parentheses may name its own window"),
    ("SUM(volume) OVER 5m IN TOP 10", "instead of a comparison: fires when a key enters the 10 highest of its "
                                      "stream (or WHERE view), resolves when it leaves them; IN BOTTOM 10: lowest"),
)


#: The WHERE clause's forms, for the form's help (and docs/conditions.md).
FILTERS: tuple[tuple[str, str], ...] = (
    ("WHERE exchange = 'XNAS'", "only the events whose dimension exchange is XNAS (the stream's dimensions)"),
    ("WHERE exchange IN ('XNAS', 'XNYS')", "... is one of these values"),
    ("WHERE key IN ('AAPL', 'MSFT')", "only these keys (with the Keys field too: the keys in both)"),
    ("WHERE key STARTS WITH 'AA'", "only the keys with this prefix"),
    ("WHERE region = 'eu' AND key STARTS WITH 'web-'", "filters joined by AND; WHERE comes last"),
)
