"""The message-template language of endpoints: Jinja2's sandbox, with every cost bounded.

An endpoint's template is written by a user and run by the delivery worker, so it
is hostile code. Jinja2's ``SandboxedEnvironment`` stops it reaching Python
internals but bounds neither CPU nor memory; this module adds the bounds:

- **at save time** (:func:`check_template`): at most ``max_chars`` of source; loops
  nested at most ``max_loop_depth`` deep; no macros, call blocks, recursive loops,
  includes or filter blocks; only the filters in :data:`FILTERS`; a trial render
  against a sample must succeed. Errors carry their line number.
- **at render time** (:func:`render_template`): every loop draws its iterations from
  one budget (``max_iterations`` per render); ``range`` is capped; ``+``, ``*``,
  ``**``, ``~`` and block ``set`` refuse results beyond ``max_intermediate_chars``
  (strings or lists) or 4096-bit integers, and ``%`` on strings is refused;
  every filter's result is held to the same bound; the output is cut at
  ``max_output_chars``.
- **no attribute access** beyond the documented variables: they are plain dicts,
  read with ``alert.key`` or ``alert["key"]``; methods of strings, lists and dicts
  are out of reach, ``str.format`` too (only ``loop``'s data attributes are readable).
- **no functions as values**: ``range`` may only be called, and a value that is callable
  is never rendered (``{{ range }}`` would print ``<function … at 0x…>``).
- **nesting bounded**: expressions nested deeper than :data:`MAX_NESTING` are refused
  at save time, as is anything Jinja's recursive parser and compiler cannot take
  (a ``RecursionError`` becomes a :class:`MessageTemplateError`, never a 500).

Values interpolated with ``{{ ... }}`` are escaped for the channel (``escape``):
the template's own text is the author's, the data (keys, names) is not, so a key
cannot add a Slack mention or HTML. The language lives here, below the notifier,
because endpoints are validated where they are stored (``subscriptions``); the
notifier (``notifier.rendering``) gives it the variables of a notification.
"""

from __future__ import annotations

import contextvars
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, Undefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import LoopContext
from jinja2.sandbox import SandboxedEnvironment, SecurityError
from markupsafe import escape as html_escape


@dataclass(frozen=True)
class TemplateLimits:
    """What one template may be and cost (``TOCSIN_TEMPLATE_*``; see ``core.settings``)."""

    max_chars: int = 4000  # source
    max_output_chars: int = 4000  # rendered, then cut (a channel may cut further)
    max_intermediate_chars: int = 20_000  # any string or list built while rendering
    max_loop_depth: int = 2
    max_iterations: int = 10_000  # all loops of one render together
    max_range: int = 1000

    @classmethod
    def from_settings(cls, settings: Any) -> TemplateLimits:
        return cls(settings.template_max_chars, settings.template_max_output_chars,
                   settings.template_max_intermediate_chars, settings.template_max_loop_depth,
                   settings.template_max_iterations, settings.template_max_range)


class MessageTemplateError(ValueError):
    """A template refused at save time, or failed at render time; ``line`` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        self.reason = message
        super().__init__(f"line {line}: {message}" if line else message)


MAX_NESTING = 40  # syntax-tree depth: Jinja parses and compiles recursively (~15 Python frames a level)
WORK_PER_ITERATION = 50  # the work budget of a render: its iterations times this, in items touched (~1 s at worst)


class _Budget:
    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.iterations = 0
        self.work = 0  # items and characters filters, operators and joins went through


def _charge(units: int) -> None:
    """Count work that loops do not (sorting, joining, copying): a loop of cheap iterations that each
    sort or copy a big list is bounded by this, not by the iteration count alone."""
    budget = _budget.get(None)
    if budget is not None:
        budget.work += units
        if budget.work > budget.limits.max_iterations * WORK_PER_ITERATION:
            raise SecurityError("the template did too much work (big values in loops)")


_budget: contextvars.ContextVar[_Budget] = contextvars.ContextVar("template_budget")


def _limits() -> TemplateLimits:
    budget = _budget.get(None)
    return budget.limits if budget else TemplateLimits()


def _check_length(length: int) -> None:
    cap = _limits().max_intermediate_chars
    if length > cap:
        raise SecurityError(f"a value of {length:,} characters or items is over the limit of {cap:,}")


def _sized(value: Any) -> Any:
    """``value`` if it is within the bounds of one intermediate result, else a ``SecurityError``."""
    if isinstance(value, str | list | tuple | dict):
        _check_length(len(value))
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
        raise SecurityError("an integer over 4096 bits")
    return value


def _bounded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    """Every loop goes through this (the for-loops' iterables are wrapped at compile time)."""
    budget = _budget.get(None)
    for item in iterable:
        if budget is not None:
            budget.iterations += 1
            if budget.iterations > budget.limits.max_iterations:
                raise SecurityError(f"loops ran over {budget.limits.max_iterations:,} iterations")
        yield item


def _range(*args: int) -> range:
    numbers = range(*args)
    cap = _limits().max_range
    if len(numbers) > cap:
        raise SecurityError(f"range of {len(numbers):,} numbers: at most {cap:,}")
    return numbers


def _weight(value: Any, budget: int | None = None) -> int:
    """About how many characters ``str(value)`` makes, walked without building it; ``SecurityError``
    past the bound. A list can hold one big list many times over: its text is the product, not the sum."""
    cap = _limits().max_intermediate_chars if budget is None else budget
    total, pending = 0, [value]
    while pending:
        _charge(1)
        item = pending.pop()
        if callable(item) and not isinstance(item, Undefined):  # Undefined is callable: it raises its own error
            raise SecurityError("a function cannot be shown: call it, or use a value")
        if isinstance(item, list | tuple | set | frozenset):
            total += 2 + 2 * len(item)
            pending.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            pending.extend(item.keys())
            pending.extend(item.values())
        else:
            total += len(item) if isinstance(item, str) else 24
        if total > cap:
            raise SecurityError(f"a value of over {cap:,} characters is over the limit")
    return total


def _text(value: Any) -> str:
    """``str(value)``, once its size is known to be within the bound."""
    if isinstance(value, str):
        return _sized(value)
    _weight(value)
    return str(value)


def _join(parts: Iterable[Any]) -> str:
    """``~`` and block ``set``: string joins, bounded before they are built."""
    texts = [_text(part) for part in parts]
    _check_length(sum(map(len, texts)))
    _charge(sum(map(len, texts)))
    return "".join(texts)


def _no_nested(items: Any) -> None:
    """Sorting or comparing lists of lists costs their product: only lists of plain values and dicts."""
    if isinstance(items, list | tuple) and any(isinstance(item, list | tuple | set) for item in items):
        raise SecurityError("lists of lists cannot be sorted or compared")


def _check_join(value: Any, separator: Any = "", attribute: Any = None) -> None:  # noqa: ARG001
    items = value if isinstance(value, list | tuple) else list(value)
    _check_length(_weight(items) + len(_text(separator)) * len(items))


def _check_replace(value: Any, old: Any, new: Any, count: Any = None) -> None:  # noqa: ARG001
    text, old_text, new_text = _text(value), _text(old), _text(new)
    hits = len(text) + 1 if old_text == "" else text.count(old_text)
    _check_length(len(text) + hits * len(new_text))


def _check_tojson(value: Any, indent: Any = None) -> None:  # noqa: ARG001
    _weight(value, _limits().max_intermediate_chars // 6)  # escaping can make one character six


def _check_sum(iterable: Any, attribute: Any = None, start: Any = 0) -> None:  # noqa: ARG001
    if not isinstance(start, int | float) or isinstance(start, bool):
        raise SecurityError("sum adds numbers only")


def _check_flat(value: Any, *args: Any, **kwargs: Any) -> None:  # noqa: ARG001
    _no_nested(value)


def _check_text(value: Any) -> None:
    _text(value)


_CHECKS: dict[str, Callable[..., None]] = {
    "join": _check_join, "replace": _check_replace, "tojson": _check_tojson, "sum": _check_sum,
    "sort": _check_flat, "unique": _check_flat, "min": _check_flat, "max": _check_flat, "dictsort": _check_flat,
    "string": _check_text,
}


def _guarded(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """The filter, checked before it runs for the sizes it could build and the work it could do."""
    check = _CHECKS.get(name)
    if check is None:
        return function
    skip = 1 if hasattr(function, "jinja_pass_arg") else 0  # Jinja passes the environment or context first

    def guarded(*args: Any, **kwargs: Any) -> Any:
        check(*args[skip:], **kwargs)
        return function(*args, **kwargs)

    if skip:
        guarded.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return guarded


def ms_time(ms: Any) -> str:
    """Epoch milliseconds as ``2026-01-02 03:04:05 UTC`` (``-`` if absent)."""
    if not isinstance(ms, int | float) or isinstance(ms, bool) or not math.isfinite(ms):
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "-"


def number(value: Any) -> str:
    """A value as people read it (``1,234.57``), ``-`` if absent."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-" if value is None else str(value)
    return f"{value:,.6g}"


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _charge(sum(len(arg) for arg in args if isinstance(arg, str | list | tuple | dict)))
        result = function(*args, **kwargs)
        if isinstance(result, Iterator):  # lazy results (map, select, reverse...) become bounded lists
            result = list(_bounded_iter(result))
        return _sized(result)

    for attr in ("jinja_pass_arg",):  # pass_context / pass_environment markers travel with the function
        if hasattr(function, attr):
            setattr(bounded, attr, getattr(function, attr))
    return bounded


# The filters a template may use; anything that pads, fills or formats to a width it is given is left out.
FILTERS = ("abs", "capitalize", "count", "default", "d", "dictsort", "first", "float", "int", "join", "last",
           "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round",
           "select", "selectattr", "sort", "string", "sum", "title", "trim", "truncate", "unique", "upper",
           "urlencode", "wordcount", "tojson")
EXTRA_FILTERS: dict[str, Callable[..., Any]] = {"ms_time": ms_time, "number": number}
_FORBIDDEN_NODES: dict[type[nodes.Node], str] = {
    nodes.Macro: "macros", nodes.CallBlock: "call blocks", nodes.Include: "includes", nodes.Import: "imports",
    nodes.FromImport: "imports", nodes.Extends: "extends", nodes.Block: "blocks", nodes.FilterBlock: "filter blocks",
    nodes.With: "with blocks",
}
#: What Adaptive Cards' Markdown subset interprets (bold and italic, links; no code, HTML, headings, images or
#: tables), and the backslash itself: a value is escaped before these only, so it rarely shows a backslash.
_MARKDOWN = re.compile(r"[\\*_\[\]]")
ESCAPES: dict[str, Callable[[str], str]] = {
    "text": lambda text: text,
    # Slack's mrkdwn: these three alone, as Slack documents (a key cannot become <!channel> or a link).
    "slack": lambda text: text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"),
    "html": lambda text: str(html_escape(text)),
    # Teams' text blocks: Markdown, whose emphasis and link characters a value must not use.
    "markdown": lambda text: _MARKDOWN.sub(r"\\\g<0>", text),
}


class _Generator(CodeGenerator):
    """Compiles ``a ~ b`` to the environment's bounded join (block ``set`` already uses ``concat``)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802 - Jinja's visitor naming
        self.write("concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Environment(SandboxedEnvironment):
    code_generator_class = _Generator
    intercepted_binops = frozenset({"+", "*", "**", "%", "//", "/", "-"})
    concat = staticmethod(_join)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        """Only ``loop.index`` and friends (data, not ``loop.cycle``): the variables are dicts, read by key."""
        return isinstance(obj, LoopContext) and not attr.startswith("_") and not callable(value)

    def wrap_str_format(self, value: Any) -> None:
        """No ``str.format``: it pads to any width it is given, and ``{{ ''.format }}`` printed a function."""

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "%" and isinstance(left, str):
            raise SecurityError("% formatting of strings is not available: use filters")
        if (operator == "**" and isinstance(right, int | float) and isinstance(left, int | float)
                and (abs(right) > 64 or abs(left) > 2**64)):
            raise SecurityError("a power that large is not available")
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    _check_length(len(seq) * max(times, 0))  # before it is built
                    if times > 1:
                        _no_nested(seq)
        if operator == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
            _check_length(len(left) + len(right))
        result = _sized(super().call_binop(context, operator, left, right))
        if isinstance(result, str | list | tuple):
            _charge(len(result))
        return result


@lru_cache(maxsize=8)
def environment(escape: str) -> _Environment:
    """The sandbox for one escaping (``text``, ``slack``, ``html``): every ``{{ }}`` value goes through it."""
    escaper = ESCAPES[escape]
    env = _Environment(autoescape=False, undefined=StrictUndefined, keep_trailing_newline=False,
                       finalize=lambda value: escaper("" if value is None else _text(value)))
    env.filters = {name: _bounded_filter(_guarded(name, env.filters[name])) for name in FILTERS}
    env.filters.update({name: _bounded_filter(function) for name, function in EXTRA_FILTERS.items()})
    env.filters["tocsin_iter"] = _bounded_iter
    env.globals = {"range": _range}
    env.tests = {name: env.tests[name] for name in ("defined", "undefined", "none", "number", "string", "even",
                                                      "odd", "divisibleby", "eq", "ne", "lt", "le", "gt", "ge", "in",
                                                      "true", "false", "boolean", "integer", "float")
                 if name in env.tests}
    return env


def _check_tree(tree: nodes.Template, limits: TemplateLimits) -> None:
    def walk(node: nodes.Node, depth: int) -> None:
        for kind, what in _FORBIDDEN_NODES.items():
            if isinstance(node, kind):
                raise MessageTemplateError(f"{what} are not available in message templates", node.lineno)
        if isinstance(node, nodes.For):
            if node.recursive:
                raise MessageTemplateError("recursive loops are not available", node.lineno)
            depth += 1
            if depth > limits.max_loop_depth:
                raise MessageTemplateError(f"loops nested {depth} deep: at most {limits.max_loop_depth}", node.lineno)
        if isinstance(node, nodes.Name) and node.name in environment("text").globals and node.ctx == "load":
            raise MessageTemplateError(f"{node.name} can only be called: {node.name}(…)", node.lineno)
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name):
            for child in node.iter_child_nodes(exclude=("node",)):
                walk(child, depth)
            return
        if isinstance(node, nodes.Filter | nodes.Test):
            env = environment("text")
            known = env.filters if isinstance(node, nodes.Filter) else env.tests
            if node.name not in known or node.name == "tocsin_iter":
                what = "filter" if isinstance(node, nodes.Filter) else "test"
                raise MessageTemplateError(f"no {what} named {node.name!r}", node.lineno)
        for child in node.iter_child_nodes():
            walk(child, depth)

    walk(tree, 0)


@dataclass(frozen=True)
class MessageTemplate:
    """A checked, compiled template, rendered by :meth:`render` within its limits."""

    source: str
    limits: TemplateLimits
    escape: str

    def render(self, variables: dict[str, Any]) -> str:
        """The output, cut at ``max_output_chars`` (with ``…``); :class:`MessageTemplateError` if it fails."""
        template = _compiled(self.source, self.escape, self.limits)
        token = _budget.set(_Budget(self.limits))
        cap = self.limits.max_output_chars
        out: list[str] = []
        size = 0
        try:
            for chunk in template.generate(**variables):
                out.append(chunk)
                size += len(chunk)
                if size > cap:
                    break
        except MessageTemplateError:
            raise
        except (TemplateError, ArithmeticError, ValueError, TypeError, LookupError, RecursionError) as exc:
            raise MessageTemplateError(f"{type(exc).__name__}: {exc}"[:300], _error_line(exc)) from None
        finally:
            _budget.reset(token)
        text = "".join(out)
        return text if len(text) <= cap else text[: cap - 1] + "…"


def _error_line(exc: BaseException) -> int | None:
    """The template line a runtime error was raised at (Jinja's tracebacks carry ``<template>`` frames)."""
    if isinstance(exc, TemplateSyntaxError):
        return exc.lineno
    line = None
    trace = exc.__traceback__
    while trace is not None:  # Jinja rewrites the frames of template code to the template's own lines
        if trace.tb_frame.f_code.co_filename == "<template>":
            line = trace.tb_lineno
        trace = trace.tb_next
    return line


def _depth(tree: nodes.Node) -> tuple[int, int | None]:
    """How deep the syntax tree nests, and the line where it is deepest (walked without recursion)."""
    deepest, line = 0, None
    pending: list[tuple[nodes.Node, int]] = [(tree, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > deepest:
            deepest, line = depth, getattr(node, "lineno", None)
        pending.extend((child, depth + 1) for child in node.iter_child_nodes())
    return deepest, line


_TOO_DEEP = f"expressions nested too deep: at most {MAX_NESTING} levels of brackets, operators or filters"


@lru_cache(maxsize=256)
def _compiled(source: str, escape: str, limits: TemplateLimits) -> Any:
    env = environment(escape)
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as exc:
        raise MessageTemplateError(exc.message or "syntax error", exc.lineno) from None
    except RecursionError:  # the parser recurses per bracket or operator: too deep for it is too deep
        raise MessageTemplateError(_TOO_DEEP) from None
    depth, line = _depth(tree)
    if depth > MAX_NESTING:
        raise MessageTemplateError(_TOO_DEEP, line)
    _check_tree(tree, limits)
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Filter(loop.iter, "tocsin_iter", [], [], None, None, lineno=loop.lineno)
    try:
        return env.from_string(tree)
    except (RecursionError, SyntaxError):  # the compiler's recursion, Python's own nesting limits
        raise MessageTemplateError(_TOO_DEEP) from None


def compile_template(source: str, limits: TemplateLimits, escape: str = "text") -> MessageTemplate:
    """The template, checked statically (size, nesting, what it uses), or :class:`MessageTemplateError`."""
    if len(source) > limits.max_chars:
        raise MessageTemplateError(f"{len(source):,} characters: at most {limits.max_chars:,}")
    if escape not in ESCAPES:
        raise ValueError(f"unknown escaping {escape!r}")
    _compiled(source, escape, limits)
    return MessageTemplate(source, limits, escape)


def check_template(source: str, limits: TemplateLimits) -> None:
    """What saving a template checks: :func:`compile_template`, then a trial render against the samples.

    Both a firing and a resolved sample, so a branch on ``state`` is tried both ways.
    """
    template = compile_template(source, limits)
    for state in ("firing", "resolved"):
        template.render(variables(sample_notification(state)))


# -- the variables -------------------------------------------------------------------------------

ALERT_VARIABLES = ("key", "state", "value", "window_start", "window_end", "evaluated_at", "alert_id", "sequence",
                   "state_unknown")
VARIABLES: dict[str, str] = {
    "title": "the default one-line summary, e.g. FIRING: High volume (AAPL, MSFT +3)",
    "state": "firing or resolved",
    "reminder": "true when this repeats alerts still firing (re-notify)",
    "test": "true for the 'send test alert' button's",
    "subscription": "name, id and condition of the subscription: subscription.name ...",
    "alerts": "the alerts, each with key, state, value, window_start, window_end, evaluated_at (epoch ms), alert_id, "
              "sequence (its place among its key's notifications), state_unknown (true on a resolution sent without a "
              "record of its firing, which may never have been announced)",
    "alert": "the first alert (the only one in a PagerDuty event, which is one per key)",
    "alert_count": "how many alerts",
    "keys": "the alerts' keys",
    "evaluated_at": "epoch ms of the evaluation (format with |ms_time)",
    "notification_id": "the notification's id",
}


def state_label(notification: dict[str, Any]) -> str:
    """How a title names the notification's state: ``FIRING``, ``STILL FIRING``, ``STALE RESOLVED`` ..."""
    return "STILL FIRING" if notification.get("reminder") else str(notification["state"]).replace("_", " ").upper()


def variables(notification: dict[str, Any]) -> dict[str, Any]:
    """What a template sees of a notification (its JSON object): plain values and dicts, nothing callable."""
    alerts = [{name: alert.get(name) for name in ALERT_VARIABLES} for alert in notification["alerts"]]
    keys = [alert["key"] for alert in alerts]
    shown = ", ".join(keys[:3]) + (f" +{len(keys) - 3}" if len(keys) > 3 else "")
    return {
        "title": f"{state_label(notification)}: {notification['subscription_name']} ({shown})",
        "state": notification["state"],
        "reminder": bool(notification.get("reminder")),
        "test": bool(notification.get("test")),
        "subscription": {"id": notification.get("subscription_id"), "name": notification["subscription_name"],
                         "condition": notification["condition"]},
        "alerts": alerts,
        "alert": alerts[0],
        "alert_count": len(alerts),
        "keys": keys,
        "evaluated_at": notification.get("evaluated_at"),
        "notification_id": notification["notification_id"],
    }


def sample_notification(state: str = "firing") -> dict[str, Any]:
    """A notification to try templates on (saving checks against it; the preview renders it)."""
    at = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC
    alerts = [{"alert_id": f"sample-{key.lower()}-{state}", "key": key, "state": state, "value": value,
               "window_start": at - 300_000, "window_end": at, "evaluated_at": at,
               "sequence": sequence + (state == "resolved")}
              for key, value, sequence in (("AAPL", 2_514_000.0, 7), ("MSFT", 2_071_500.0, 3))]
    return {"notification_id": f"sample-{state}", "subscription_id": 1, "subscription_name": "High volume",
            "condition": "SUM(volume) OVER 5m > 2e6", "state": state, "reminder": False, "evaluated_at": at,
            "created_at": at / 1000, "alerts": alerts}


__all__ = ["ESCAPES", "FILTERS", "MessageTemplate", "MessageTemplateError", "TemplateLimits",
           "check_template", "compile_template", "environment", "ms_time", "number", "sample_notification",
           "variables"]
