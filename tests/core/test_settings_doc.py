"""docs/configuration.md is what core.settings_doc generates from Settings: every setting, never a stale one."""

from __future__ import annotations

import re

import pytest
from pydantic import Field

from core import settings_doc
from core.settings import Settings


def test_the_configuration_page_is_up_to_date() -> None:
    generated = settings_doc.render()
    written = settings_doc.PAGE.read_text() if settings_doc.PAGE.exists() else ""
    assert written == generated, (f"docs/configuration.md is stale (a setting was added, changed or described "
                                  f"differently): run `{settings_doc.COMMAND}` and commit the page")


def test_every_setting_is_listed_once_with_its_variable_type_default_and_description() -> None:
    page = settings_doc.render()
    rows = re.findall(r"^\| `(TOCSIN_[A-Z0-9_]+)` \| (.+?) \| (.+?) \| (.+) \|$", page, flags=re.M)
    assert sorted(name for name, *_ in rows) == sorted(f"TOCSIN_{name.upper()}" for name in Settings.model_fields)
    by_name = {name: (type_, default, description) for name, type_, default, description in rows}
    assert by_name["TOCSIN_EVENT_PARTITIONS"] == ("`int` (≥ 1)", "`4`", "partitions of the event topic (fixed when "
                                                  "the topic is first created)")
    assert by_name["TOCSIN_SECRET_KEY"][:2] == ("`SecretStr \\| None`", "none")
    assert by_name["TOCSIN_WEBHOOK_ALLOW_HOSTS"][1] == "`[]`"
    assert by_name["TOCSIN_DISPATCHER_CONSUMER"][1] == "`dispatcher-<host name>` (computed)"  # not this host's name
    assert all(description.strip() for _, _, description in by_name.values())


def test_settings_are_grouped_under_the_areas_of_core_settings() -> None:
    titles = [title for title, _ in settings_doc.areas()]
    assert titles[:2] == ["Kafka", "Redis (match events, firing sets, counters; Celery broker)"]
    assert any(title.startswith("Dead man's switch") for title in titles)
    assert len({name for _, names in settings_doc.areas() for name in names}) == len(Settings.model_fields)


def test_a_setting_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = dict(Settings.model_fields)
    fields["undocumented_knob"] = Field(3)  # type: ignore[assignment]
    monkeypatch.setattr(Settings, "model_fields", fields)
    with pytest.raises(settings_doc.MissingDescription, match="undocumented_knob"):
        settings_doc.render()
