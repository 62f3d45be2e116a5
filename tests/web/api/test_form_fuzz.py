"""A fuzz of the HTML pages' forms and fragments, on SQLite and PostgreSQL: generated fields never get a 5xx.

Every route of ``web.pages`` is called as a signed-in operator with its CSRF token (the
sign-in and sign-up forms with their pre-session token), with generated values for
every field any form has: text, unicode and oversized digits, huge and negative ids,
lists, and plausible valid values, so that both the error paths and the saving
paths are taken.
"""

from __future__ import annotations

import string
from urllib.parse import quote

from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from core.settings import Settings
from tests.examples import examples
from tests.users import api_client, form_csrf, new_user, sign_in
from web import pages
from web.deps import CSRF_HEADER, SESSION_COOKIE

EXAMPLES_PER_ROUTE = examples(25)
SKIPPED = {"/logout"}  # would end the session the fuzz runs in
SUBSCRIPTION_FORM = ["name", "condition", "keys", "endpoint_ids", "active", "cooldown_s", "renotify_s",
                     "send_resolved", "group"]  # read from the request's form, not declared as parameters

digits = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.text(alphabet="0123456789\u0663\u00b2\u0969\uff11", min_size=1, max_size=12),
    st.integers(4_000, 6_000).map(lambda n: "1" * n),  # past int()'s digit limit
)
plausible = st.sampled_from([
    "COUNT(*) OVER 1m > 1", "SUM(volume) OVER 5m > 2e6", "(" * 40 + "COUNT(*)" + ")" * 40 + " OVER 1m > 1",
    "AAPL, MSFT", "webhook", "email", "https://hooks.example.com/x", "a@example.com", "on", "operator", "user",
    "firing", "resolved", "1-0", "99999999999999999999999-0", "correct horse battery", "/", "//evil.example",
])
value = st.one_of(st.text(max_size=40), st.text(alphabet=string.printable, max_size=600), digits, plausible)
field = st.one_of(value, st.lists(value, max_size=3))


def _fields(route: APIRoute) -> st.SearchStrategy[dict]:
    """Any of the route's own fields (each one present or not), and now and then one it does not know."""
    names = [p.name for p in route.dependant.body_params + route.dependant.query_params if p.name != "csrf_token"]
    if route.path.startswith("/subscriptions/") and route.path.endswith(("/new", "/edit")):
        names += SUBSCRIPTION_FORM
    return st.fixed_dictionaries({}, optional=dict.fromkeys([*names, "unknown"], field))


def _path(route: APIRoute, ids: dict[str, list[int]]) -> st.SearchStrategy[str]:
    parts = {}
    for param in route.dependant.path_params:
        if param.name == "action":
            parts[param.name] = st.one_of(st.sampled_from(["pause", "resume", "unmute", "delete"]), st.text(max_size=8))
        else:
            parts[param.name] = st.one_of(st.sampled_from(ids[param.name]), st.sampled_from(ids[param.name]), digits)
    return st.fixed_dictionaries(parts).map(
        lambda values: route.path.format(**{k: quote(str(v), safe="") for k, v in values.items()}))


def test_no_form_makes_a_server_error(settings: Settings) -> None:
    settings = settings.model_copy(update={"preview_timeout_s": 0.05, "rate_preview_account": "10000/minute",
                                           "rate_preview_client": "10000/minute", "rate_sign_in_client": "10000/minute",
                                           "rate_sign_up_client": "10000/minute",
                                           "rate_test_alert_account": "10000/minute",
                                           "rate_test_alert_client": "10000/minute"})
    operator, token = new_user(settings, role="operator")
    with api_client(settings, token) as api:
        endpoint = api.post("/api/endpoints", json={"kind": "email", "target": "a@example.com"}).json()["id"]
        subscription = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1",
                                                            "endpoint_ids": [endpoint]}).json()["id"]
        api_token = api.post("/api/tokens", json={"name": "fuzz"}).json()["id"]
    ids = {"subscription_id": [subscription], "endpoint_id": [endpoint], "token_id": [api_token]}
    with api_client(settings) as browser:
        csrf = sign_in(browser, operator.email)
        pre_session = form_csrf(browser)
        cookies = dict(browser.cookies)
        routes = sorted((r for r in pages.router.routes if isinstance(r, APIRoute) and r.path not in SKIPPED),
                        key=lambda r: r.path.endswith(("{action}", "/delete", "/revoke")))  # those delete: last
        for route in routes:
            method = sorted(route.methods)[0]

            @given(path=_path(route, ids), fields=_fields(route), method=st.just(method))
            @hypothesis_settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None,
                                 suppress_health_check=list(HealthCheck))
            def no_server_error(path: str, fields: dict, method: str) -> None:
                browser.cookies.clear()
                for name, cookie in cookies.items():  # a sign-up may have signed the browser in as someone else
                    browser.cookies.set(name, cookie)
                if method == "GET":
                    response = browser.get(path, params=fields, headers={"accept": "text/html"})
                else:
                    token = pre_session if path in ("/login", "/signup") else csrf
                    response = browser.post(path, data={**fields, "csrf_token": token},
                                            headers={"accept": "text/html", CSRF_HEADER: csrf},
                                            follow_redirects=False)
                assert response.status_code < 500, (method, path, fields, response.text[-2000:])

            no_server_error()
        assert browser.cookies.get(SESSION_COOKIE)
