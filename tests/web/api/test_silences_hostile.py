"""Silences an attacker or a hurried operator would try: ones that silence everything without saying so, markup in
what the page shows, a form posted from another site, times without a zone."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from subscriptions.db import session_factory
from subscriptions.errors import Forbidden
from subscriptions.models import Silence, User
from subscriptions.silences import SilenceIn, SilenceService
from tests.users import api_client, new_user, sign_in


def _create(api: TestClient, *matchers: tuple[str, str, str], **body: object):
    return api.post("/api/silences", json={"matchers": [{"name": n, "op": o, "value": v} for n, o, v in matchers],
                                           "comment": "why", "duration_s": 600, **body})


@pytest.mark.database_plays_no_part
@pytest.mark.parametrize("matchers", [
    [("key", "!=", "AAPL")],
    [("key", "=~", ".*")],
    [("key", "=~", "")],
    [("key", "=", "")],
    [("subscription_name", "!~", "prod.*")],
    [("key", "!=", "AAPL"), ("subscription_name", "=~", "(x)?")],
])
def test_a_silence_whose_every_matcher_matches_the_empty_string_is_refused(api: TestClient, matchers: list) -> None:
    """Alertmanager's rule: such a silence narrows nothing down and would silence everything its owner has."""
    response = _create(api, *matchers)
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "matchers"] and "must not match the empty string" in detail["msg"]
    assert api.get("/api/silences").json() == []


@pytest.mark.parametrize("matchers", [[("key", "=~", ".+")], [("key", "!=", "AAPL"), ("key", "=~", "A.*")]])
def test_saying_everything_or_narrowing_a_negative_matcher_is_accepted(api: TestClient, matchers: list) -> None:
    assert _create(api, *matchers).status_code == 201


def test_a_time_without_a_zone_is_utc(api: TestClient) -> None:
    ends = (datetime.now(UTC) + timedelta(hours=2)).replace(tzinfo=None, microsecond=0)
    created = _create(api, ("key", "=", "AAPL"), duration_s=None, ends_at=ends.isoformat())
    assert created.status_code == 201, created.text
    assert datetime.fromisoformat(created.json()["ends_at"]) == ends.replace(tzinfo=UTC)


def test_control_characters_are_refused(api: TestClient) -> None:
    assert _create(api, ("key", "=", "AA\x00PL")).status_code == 422
    assert api.post("/api/silences", json={"matchers": [{"name": "key", "value": "A"}], "comment": "x\x00",
                                           "duration_s": 60}).status_code == 422


def test_markup_in_a_silence_is_shown_as_text_and_the_expire_form_needs_its_token(settings: Settings) -> None:
    user, token = new_user(settings)
    script = "<script>alert(1)</script>"
    with api_client(settings, token) as api:
        silence = _create(api, ("key", "=", '"><img src=x onerror=alert(2)>'), comment=script).json()
    with api_client(settings) as client:
        csrf = sign_in(client, user.email)
        page = client.get("/silences").text
        assert script not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<img src=x" not in page
        del client.headers["X-CSRF-Token"]
        assert client.post(f"/silences/{silence['id']}/expire", follow_redirects=False).status_code == 403
        checked = client.post("/silences/check", data={"matcher_name": "key", "matcher_op": "=~",
                                                       "matcher_value": "<b>(", "comment": "c", "duration_s": "60",
                                                       "csrf_token": csrf})
        assert "<b>(" not in checked.text and "&lt;b&gt;(" in checked.text
    with api_client(settings, token) as api:
        assert api.get(f"/api/silences/{silence['id']}").json()["state"] == "active"


def test_a_row_the_dispatcher_ignores_is_still_listed_with_why_and_can_be_expired(settings: Settings) -> None:
    """Edited past the API: the owner's list must not fail, or no silence of theirs could be seen or ended."""
    user, token = new_user(settings)
    now = datetime.now(UTC)
    with session_factory(settings.database_url)() as session:
        rows = [Silence(owner_id=user.id, created_by=user.id, comment="by hand", matchers=m, starts_at=now,
                        ends_at=now + timedelta(hours=1), created_at=now)
                for m in ({"name": "key"}, [{"name": "key", "op": "==", "value": "A"}],
                          [{"name": "key", "op": "!=", "value": "A"}])]
        session.add_all(rows)
        session.commit()
        ids = [r.id for r in rows]
    with api_client(settings, token) as api:
        good = _create(api, ("key", "=", "AAPL")).json()
        listed = api.get("/api/silences")
        assert listed.status_code == 200, listed.text
        by_id = {s["id"]: s for s in listed.json()}
        assert by_id[good["id"]]["ignored"] is None
        assert "cannot read" in by_id[ids[0]]["ignored"] and by_id[ids[0]]["matchers"] == []
        assert "cannot read" in by_id[ids[1]]["ignored"]
        assert "must not match the empty string" in by_id[ids[2]]["ignored"]
        assert api.post(f"/api/silences/{ids[0]}/expire").json()["state"] == "expired"
    with api_client(settings) as client:
        sign_in(client, user.email)
        page = client.get("/silences")
        assert page.status_code == 200 and page.text.count("ignored, silences nothing") == 3


def test_a_short_pattern_that_would_take_long_to_compile_is_refused_at_once(api: TestClient) -> None:
    """\\pL{400} is 9 characters and valid RE2, but took ~200 ms to compile (each, in the web app and in the
    dispatcher for every matcher of every silence of its owner); RE2's memory budget refuses it in a few ms."""
    started = time.perf_counter()
    response = _create(api, ("key", "=~", r"\pL{400}"))
    assert response.status_code == 422 and "pattern too large" in response.text
    assert time.perf_counter() - started < 2.0
    assert _create(api, ("key", "=~", r"\pL{1,8}"), ("subscription_name", "=~", "[A-Za-z ]{1,200}")).status_code == 201


def test_parallel_creates_cannot_overshoot_the_quota(settings: Settings) -> None:
    limited = settings.model_copy(update={"user_max_silences": 3})
    user, _ = new_user(limited)

    def create(i: int) -> str:
        with session_factory(limited.database_url)() as session:
            owner = session.get(User, user.id)
            data = SilenceIn(matchers=[{"name": "key", "value": f"K{i}"}], comment="c", duration_s=60)
            try:
                SilenceService(session, limited, owner).create(data)
                return "created"
            except Forbidden:
                return "refused"

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(create, range(8)))
    assert outcomes == ["created"] * 3 + ["refused"] * 5
