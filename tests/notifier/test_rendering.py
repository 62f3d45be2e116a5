"""Message templates are hostile code: refused at save time, or cut at render time, within bounded time and memory."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.settings import Settings
from notifier.rendering import message
from subscriptions.templating import (
    VARIABLES,
    MessageTemplateError,
    TemplateLimits,
    check_template,
    compile_template,
    sample_notification,
    variables,
)
from tests.examples import examples

LIMITS = TemplateLimits()
SAMPLE = variables(sample_notification())


def _render(source: str, escape: str = "text") -> str:
    return compile_template(source, LIMITS, escape).render(SAMPLE)


def test_every_documented_variable_is_there_and_nothing_else() -> None:
    assert set(SAMPLE) == set(VARIABLES)
    text = _render("{{ title }} | {{ subscription.name }} #{{ subscription.id }} | {{ alert_count }} alerts: "
                   "{% for a in alerts %}{{ a.key }}={{ a.value|number }}{% if not loop.last %}, {% endif %}"
                   "{% endfor %} at {{ evaluated_at|ms_time }} {{ keys|join('/') }} {{ state }} {{ reminder }}")
    assert text == ("FIRING: High volume (AAPL, MSFT) | High volume #1 | 2 alerts: AAPL=2.514e+06, MSFT=2.0715e+06 "
                    "at 2026-01-01 00:00:00 UTC AAPL/MSFT firing False")


def test_a_template_can_say_which_resolutions_have_no_record_of_their_firing() -> None:
    resolved = sample_notification("resolved")
    resolved["alerts"][1]["state_unknown"] = True
    source = "{% for a in alerts %}{{ a.key }}{% if a.state_unknown %} (firing unknown){% endif %};{% endfor %}"
    assert compile_template(source, LIMITS, "text").render(variables(resolved)) == "AAPL;MSFT (firing unknown);"
    assert _render(source) == "AAPL;MSFT;"


@pytest.mark.parametrize(("source", "line", "reason"), [
    ("ok\n{% for a in alerts %}\n{% for b in alerts %}\n{% for c in alerts %}{% endfor %}{% endfor %}{% endfor %}",
     4, "loops nested 3 deep: at most 2"),
    ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", 1, "macros are not available"),
    ("{% for a in alerts recursive %}{{ loop(a) }}{% endfor %}", 1, "recursive loops are not available"),
    ("\n\n{{ title|center(1000000000) }}", 3, "no filter named 'center'"),
    ("{{ '%s'|format(1) }}", 1, "no filter named 'format'"),
    ("{% include 'x' %}", 1, "includes are not available"),
    ("line one\n{% if %}", 2, "Expected an expression"),
    ("\n{{ nope }}", 2, "'nope' is undefined"),
    ("{% if state == 'resolved' %}{{ alert.missing }}{% endif %}", 1, "has no attribute 'missing'"),  # tried both ways
])
def test_refused_at_save_time_with_the_line(source: str, line: int, reason: str) -> None:
    with pytest.raises(MessageTemplateError) as refused:
        check_template(source, LIMITS)
    assert refused.value.line == line and reason in refused.value.reason, str(refused.value)
    assert str(refused.value).startswith(f"line {line}: ")


DEEP = {  # each under the 4,000-character limit; Jinja's parser and compiler recurse once or more per level
    "lists": "{{ " + "[" * 1500 + "]" * 1500 + " }}",
    "brackets": "{{ " + "(" * 1300 + "1" + ")" * 1300 + " }}",
    "not": "{{ " + "not " * 990 + "1 }}",
    "filters": "{{ 1" + "|abs" * 990 + " }}",
    "just over": "{{ 1" + "|abs" * 40 + " }}",
}


@pytest.mark.parametrize("source", DEEP.values(), ids=DEEP.keys())
def test_expressions_nested_too_deep_are_refused_with_the_reason(source: str) -> None:
    with pytest.raises(MessageTemplateError, match="nested too deep: at most 40 levels"):
        check_template(source, LIMITS)


def test_expressions_nested_within_the_limit_are_fine() -> None:
    assert _render("{{ 1" + "|abs" * 30 + " }} {{ " + "(" * 30 + "2" + ")" * 30 + " }}") == "1 2"
    assert _render("{{ " + "[" * 30 + "]" * 30 + "|length }}") == "1"


@pytest.mark.parametrize("source", [
    "{{ ''.format }}", "{{ range }}", "{{ [range]|first }}",
    "{{ range ~ '' }}", "{% for i in range(2) %}{{ loop.cycle }}{% endfor %}",
    "{{ '{:>999999999}'.format(1) }}",  # str.format pads to any width it is given, before any bound applies
])
def test_a_template_cannot_render_a_function_or_method(source: str) -> None:
    with pytest.raises(MessageTemplateError) as refused:
        check_template(source, LIMITS)
    assert any(reason in refused.value.reason for reason in ("can only be called", "unsafe", "cannot be shown"))
    assert "function" not in _render("{{ range(2)|list }} {% for i in range(2) %}{{ loop.index }}{% endfor %}")


def test_a_template_over_the_size_limit_is_refused() -> None:
    with pytest.raises(MessageTemplateError, match="4,001 characters: at most 4,000"):
        check_template("x" * 4001, LIMITS)


@pytest.mark.parametrize(("source", "reason"), [
    # run forever: loops draw from one budget, whatever they iterate
    ("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "loops ran over 10,000"),
    ("{% for a in keys * 5000 %}{% for b in keys * 5000 %}{% endfor %}{% endfor %}", "loops ran over 10,000"),
    ("{{ range(10 ** 9)|length }}", "range of 1,000,000,000 numbers: at most 1,000"),
    ("{{ 9 ** 9999 }}", "a power that large"),
    # exhaust memory: every way to build a string or list is bounded before it is built
    ("{{ 'x' * 10 ** 9 }}", "over the limit of 20,000"),
    ("{{ keys * 10 ** 9 }}", "over the limit of 20,000"),
    ("{% set a = title ~ title ~ title ~ title %}{% set b = a ~ a ~ a ~ a ~ a ~ a ~ a ~ a %}"
     "{% set c = b ~ b ~ b ~ b ~ b ~ b ~ b ~ b %}{% set d = c ~ c ~ c ~ c ~ c ~ c ~ c ~ c %}{{ d }}", "over the limit"),
    ("{% set a %}{{ title }}{{ title }}{{ title }}{{ title }}{% endset %}{% set b %}{{ a }}{{ a }}{{ a }}{{ a }}"
     "{{ a }}{{ a }}{{ a }}{{ a }}{% endset %}{% set c %}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}"
     "{% endset %}{% set d %}{{ c }}{{ c }}{{ c }}{{ c }}{{ c }}{{ c }}{{ c }}{{ c }}{% endset %}{{ d }}", "over the limit"),
    ("{{ title|replace('', title)|replace('', title)|replace('', title) }}", "over the limit"),
    ("{{ '%0999999999d' % 1 }}", "% formatting of strings is not available"),
    # ... or by amplifying: a result bigger than its inputs is sized before it is built
    ("{% set a = title * 600 %}{{ a|replace('', a) }}", "368,678,400 characters or items is over the limit"),
    ("{% set a = title * 600 %}{{ (keys * 9999)|join(a) }}", "over the limit"),
    ("{% set a = keys * 9999 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}{{ b }}", "over the limit"),
    ("{% set a = keys * 9999 %}{{ [a, a, a, a, a, a, a, a]|tojson }}", "over the limit"),
    ("{% set a = keys * 9999 %}{{ [a] * 20000 }}", "lists of lists cannot be sorted or compared"),
    ("{% set a = keys * 9999 %}{{ [a, a, a]|sort }}", "lists of lists cannot be sorted or compared"),
    ("{% set a = keys * 9999 %}{{ [a, a]|sum(start=[]) }}", "sum adds numbers only"),
    # ... or by doing a lot per iteration
    ("{% set a = keys * 9999 %}{% for i in range(100) %}{% for j in range(100) %}{% set s = a|sort %}"
     "{% endfor %}{% endfor %}", "the template did too much work"),
    # reach Python
    ("{{ title.__class__.__mro__ }}", "unsafe"),
    ("{{ alert.items() }}", "unsafe"),
    ("{{ title.upper() }}", "unsafe"),
    ("{{ lipsum(10 ** 6) }}", "'lipsum' is undefined"),
])
def test_runaway_and_escaping_templates_fail_fast_with_little_memory(source: str, reason: str) -> None:
    with pytest.raises(MessageTemplateError) as failed:  # stopped by counted work, not a clock (see templating)
        _render(source)
    assert reason in str(failed.value)
    tracemalloc.start()  # again, for the memory it takes (tracing slows it down, so not timed)
    try:
        with pytest.raises(MessageTemplateError):
            _render(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, peak


def test_the_output_is_cut_at_its_limit() -> None:
    out = _render("{% for a in range(1000) %}{% for b in range(9) %}{{ title }}{% endfor %}{% endfor %}")
    assert len(out) == LIMITS.max_output_chars and out.endswith("…")


def test_values_are_escaped_for_the_channel_the_template_text_is_not() -> None:
    hostile = variables({**sample_notification(), "subscription_name": "<!channel> & <b>[x](y)</b>"})
    source = "<!here> *{{ subscription.name }}*"
    rendered = {escape: compile_template(source, LIMITS, escape).render(hostile)
                for escape in ("text", "slack", "html", "markdown")}
    assert rendered == {
        "text": "<!here> *<!channel> & <b>[x](y)</b>*",
        "slack": "<!here> *&lt;!channel&gt; &amp; &lt;b&gt;[x](y)&lt;/b&gt;*",
        "html": "<!here> *&lt;!channel&gt; &amp; &lt;b&gt;[x](y)&lt;/b&gt;*",
        # Adaptive Cards' Markdown has no HTML: only its link and emphasis characters are escaped
        "markdown": r"<!here> *<!channel> & <b>\[x\](y)</b>*",
    }


def test_a_failing_or_empty_template_falls_back_to_the_default_and_says_why() -> None:
    settings = Settings()
    notification = sample_notification()
    failed = message(notification, "{{ alerts[9].key }}", settings, "text", lambda v: f"default {v['state']}")
    assert failed.text == "default firing" and "message template failed (line 1:" in (failed.error or "")
    empty = message(notification, "{% if false %}x{% endif %}  ", settings, "text", lambda v: "default")
    assert empty.text == "default" and "rendered nothing" in (empty.error or "")
    fine = message(notification, "{{ keys|join }}", settings, "text", lambda v: "default", limit=6)
    assert fine == type(fine)("AAPLM…")


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.sampled_from([
    "{{ title }}", "{{ title ~ title }}", "{% for a in alerts %}", "{% for i in range(999) %}", "{% endfor %}",
    "{% set t = title ~ title ~ title %}", "{{ t }}", "{{ keys * 99 }}", "{{ (keys * 99)|join }}", "x" * 50,
    "{% if state %}", "{% endif %}", "{{ alert.key|replace('A', title) }}"]), max_size=12))
def test_whatever_a_template_does_it_ends_within_the_output_limit(parts: list[str]) -> None:
    try:  # it ends: the loops and the work are counted (no clock in a test: machines under load vary)
        out = _render("".join(parts))
    except MessageTemplateError:
        out = ""
    assert len(out) <= LIMITS.max_output_chars
