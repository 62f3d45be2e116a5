"""The condition language users write subscriptions in.

    SUM(volume) OVER 5m > 2e6
    COUNT(*) OVER 30s >= 100
    AVG(price) OVER 1h BETWEEN 10 AND 20
    QUANTILE(volume, 0.95) OVER 15m > 5000
    MAX(price) - MIN(price) OVER 30m > 3%

Grammar (case-insensitive words)::

    condition  := expr OVER duration ( comparator threshold | BETWEEN threshold AND threshold )
    expr       := term (('+' | '-') term)*
    term       := factor (('*' | '/') factor)*
    factor     := number | '-' factor | aggregate | '(' expr ')'
    aggregate  := COUNT '(' ['*'] ')' | (SUM | AVG | MIN | MAX | LAST | MEDIAN) '(' attribute ')'
                | QUANTILE '(' attribute ',' fraction ')'
    threshold  := ['-' | '+'] number ['%']

A percentage compares the expression with that share of the last value of the
one attribute it uses ("high minus low above 3% of the last price").

Parsing is a small hand-written tokenizer + recursive descent so every error can
say what was expected and where (column numbers start at 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evaluator.spec import Aggregate, Condition, Expr, expr_terms
from ingest.model import ATTRIBUTES

UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_FUNCTIONS = ("COUNT", "SUM", "AVG", "MIN", "MAX", "LAST", "MEDIAN", "QUANTILE")

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<duration>\d+(?:\.\d+)?(?:ms|s|m|h|d)\b)
      | (?P<number>(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>>=|<=|>|<|\(|\)|\*|\+|-|/|,|%)
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


MAX_NESTING = 32  # parentheses and unary signs within each other


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

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
            node = (op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.factor()
        while self.at("*", "/"):
            op = self.take("op").text
            node = (op, node, self.factor())
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
            return ("num", self.number())
        if self.at("-"):
            self.i += 1
            inner = self.factor()
            return ("num", -inner[1]) if inner[0] == "num" else ("*", ("num", -1.0), inner)
        if self.at("("):
            self.i += 1
            node = self.expr()
            self.take("op", ")")
            return node
        return self.aggregate()

    def aggregate(self) -> Expr:
        names = ", ".join(_FUNCTIONS)
        token = self.take("word", expected=f"an aggregate ({names})")
        name = token.text.upper()
        if name not in _FUNCTIONS:
            raise ConditionError(f"unknown aggregate {token.text!r}; use one of {names}", token.column)
        self.take("op", "(")
        if name == "COUNT":
            if self.at("*"):
                self.i += 1
            self.take("op", ")")
            return ("agg", "COUNT", None, None)
        attribute = self.attribute()
        q = None
        if name == "QUANTILE":
            self.take("op", ",", expected="',' and the quantile's fraction, as in QUANTILE(price, 0.95)")
            q_column = self.column()
            q = self.number()
            if not 0 < q <= 1:
                raise ConditionError(f"a quantile's fraction is between 0 and 1 (0.95 for the 95th percentile), "
                                     f"not {q:g}", q_column)
        elif name == "MEDIAN":
            name, q = "QUANTILE", 0.5
        self.take("op", ")")
        return ("agg", name, attribute, q)

    def attribute(self) -> str:
        token = self.take("word", expected=f"an attribute ({', '.join(ATTRIBUTES)})")
        attribute = token.text.lower()
        if attribute not in ATTRIBUTES:
            raise ConditionError(f"unknown attribute {token.text!r}; events carry {', '.join(ATTRIBUTES)}",
                                 token.column)
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

    def parse(self) -> Condition:
        start = self.column()
        expression = self.expr()
        if not expr_terms(expression):
            raise ConditionError("the condition needs an aggregate such as SUM(volume)", start)
        self.take("word", "OVER", expected="OVER and a window, as in OVER 5m")
        window_token = self.take("duration", expected="a window such as 30s, 5m or 1h")
        window_ms = _duration_ms(window_token)
        op = self.peek()
        bounds: dict[str, object]
        if self.at("BETWEEN"):
            self.i += 1
            (low, low_pct), _ = self.threshold(), self.take("word", "AND")
            high, high_pct = self.threshold()
            if low_pct != high_pct:
                raise ConditionError("give both ends of the range as percentages, or neither", op.column)  # type: ignore[union-attr]
            if low > high:
                raise ConditionError(f"empty range: {low:g} is above {high:g}", op.column)  # type: ignore[union-attr]
            bounds, percent = {"low": low, "high": high, "low_inclusive": True, "high_inclusive": True}, low_pct
        else:
            comparator = self.take("op", expected="a comparison (>, >=, <, <=) or BETWEEN").text
            if comparator not in {">", ">=", "<", "<="}:
                raise ConditionError(f"expected a comparison, found {comparator!r}", op.column if op else None)
            value, percent = self.threshold()
            inclusive = comparator.endswith("=")
            bounds = ({"low": value, "low_inclusive": inclusive} if comparator.startswith(">")
                      else {"high": value, "high_inclusive": inclusive})
        if self.peek() is not None:
            raise ConditionError(f"unexpected {self.peek().text!r} after the condition", self.column())  # type: ignore[union-attr]
        if percent:
            attributes = {term[2] for term in expr_terms(expression) if term[2]}
            if len(attributes) != 1:
                raise ConditionError("a percentage compares with the last value of one attribute: use it with an "
                                     "expression over exactly one attribute, like MAX(price) - MIN(price)", start)
            return Condition(Aggregate.EXPR, None, window_ms, expression=expression,
                             percent_of=attributes.pop(), **bounds)  # type: ignore[arg-type]
        if expression[0] == "agg":
            _, aggregate, attribute, q = expression
            return Condition(Aggregate(aggregate), attribute, window_ms, q=q, **bounds)  # type: ignore[arg-type]
        return Condition(Aggregate.EXPR, None, window_ms, expression=expression, **bounds)  # type: ignore[arg-type]


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


def check_window(condition: Condition, pane_ms: int, max_window_ms: int, quantile_max_window_ms: int) -> None:
    """Windows are whole numbers of panes and no longer than the evaluator keeps history (raw values for quantiles)."""
    if condition.window_ms % pane_ms:
        raise ConditionError(f"the window must be a multiple of {format_duration(pane_ms)}")
    if condition.window_ms > max_window_ms:
        raise ConditionError(f"the window may be at most {format_duration(max_window_ms)}")
    if any(term[1] == "QUANTILE" for term in condition.terms) and condition.window_ms > quantile_max_window_ms:
        if not quantile_max_window_ms:
            raise ConditionError("quantiles are switched off on this deployment")
        raise ConditionError(f"a quantile's window may be at most {format_duration(quantile_max_window_ms)}")


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % UNITS_MS[unit] == 0:
            return f"{ms // UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def _number(value: float) -> str:
    """Shortest text that parses back to exactly ``value``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def format_expr(expr: Expr, context: int = 0, right: bool = False) -> str:
    """Text of an expression with only the parentheses it needs."""
    kind = expr[0]
    if kind == "num":
        return _number(expr[1])
    if kind == "agg":
        _, aggregate, attribute, q = expr
        if aggregate == "COUNT":
            return "COUNT(*)"
        return f"QUANTILE({attribute}, {_number(q)})" if aggregate == "QUANTILE" else f"{aggregate}({attribute})"
    level = _PRECEDENCE[kind]
    text = f"{format_expr(expr[1], level)} {kind} {format_expr(expr[2], level, right=True)}"
    return f"({text})" if level < context or (right and level == context) else text


def format_condition(condition: Condition) -> str:
    """Canonical text of a condition (parses back to an equal condition)."""
    expression = condition.expression if condition.aggregate is Aggregate.EXPR else condition.terms[0]
    head = f"{format_expr(expression)} OVER {format_duration(condition.window_ms)}"  # type: ignore[arg-type]
    pct = "%" if condition.percent_of else ""
    if condition.low is not None and condition.high is not None:
        return f"{head} BETWEEN {_number(condition.low)}{pct} AND {_number(condition.high)}{pct}"
    if condition.low is not None:
        return f"{head} {'>=' if condition.low_inclusive else '>'} {_number(condition.low)}{pct}"
    return f"{head} {'<=' if condition.high_inclusive else '<'} {_number(condition.high)}{pct}"


_AGGREGATE_WORDS = {"COUNT": "number of events", "SUM": "sum of {a}", "AVG": "average {a}",
                    "MIN": "lowest {a}", "MAX": "highest {a}", "LAST": "latest {a}"}


def _describe_term(term: Expr) -> str:
    _, aggregate, attribute, q = term
    if aggregate == "QUANTILE":
        return "median " + attribute if q == 0.5 else f"{_number(q * 100)}th percentile of {attribute}"
    return _AGGREGATE_WORDS[aggregate].format(a=attribute)


def explain(condition: Condition) -> str:
    """The condition in plain words, for the subscription form."""
    if condition.aggregate is Aggregate.EXPR:
        what = format_expr(condition.expression)  # type: ignore[arg-type]
    else:
        what = _describe_term(condition.terms[0])
    pct = "%" if condition.percent_of else ""

    def n(value: float | None) -> str:
        return f"{_number(value)}{pct}"  # type: ignore[arg-type]

    if condition.low is not None and condition.high is not None:
        test = f"is between {n(condition.low)} and {n(condition.high)}"
    elif condition.low is not None:
        test = f"is {'at least' if condition.low_inclusive else 'above'} {n(condition.low)}"
    else:
        test = f"is {'at most' if condition.high_inclusive else 'below'} {n(condition.high)}"
    if condition.percent_of:
        test += f" of its latest {condition.percent_of}"
    return f"fires for each key whose {what} over the last {format_duration(condition.window_ms)} {test}"
