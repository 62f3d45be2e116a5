"""The web UI: server-rendered pages (Jinja2) made live with htmx; the same services as the JSON API.

Pages need a signed-in browser session; an unauthenticated visit is sent to the
sign-in page. Every form and htmx request carries the session's CSRF token.
"""

from __future__ import annotations

import hmac
import html
import json
import re
import secrets
import time
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Depends, Form, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from starlette.datastructures import FormData

from core.redis_schema import RedisKeys
from core.settings import Settings
from notifier.deliveries import enqueue_test_alert
from notifier.policy import AlertPolicy
from subscriptions.alerts import AlertViews, HistoryFilter, valid_cursor
from subscriptions.errors import Conflict, FieldError, Forbidden, NotFound
from subscriptions.language import ConditionError, language_help
from subscriptions.models import ROLES, Subscription
from subscriptions.schemas import EndpointIn, SignUpIn, SubscriptionIn, TokenIn
from subscriptions.service import SubscriptionService, checked_condition
from web.auth import check_password, sign_in, sign_out, wrong_current_password
from web.conditions import describe, preview_matches
from web.deps import (
    AccountsDep,
    CeleryDep,
    DbDep,
    IdPath,
    KeysDep,
    Principal,
    PrincipalDep,
    RecordsDep,
    RedisDep,
    SettingsDep,
)
from web.limits import LimiterDep, client_address, limit_previews, limit_test_alerts
from web.ops import samples, subscription_load
from web.watchdog import banner, open_incidents

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
TEMPLATES.env.globals["fmt_ms"] = lambda ms: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) if ms else ""
TEMPLATES.env.globals["fmt_s"] = lambda s: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s)) if s else ""
TEMPLATES.env.globals["language"] = language_help()  # the form's condition-language help, from the registries

router = APIRouter(include_in_schema=False)


def page_principal(principal: PrincipalDep) -> Principal:
    """Pages are for browser sessions (an API token is no sign-in to the UI)."""
    if principal is None or principal.web_session is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "sign in")
    return principal


Page = Annotated[Principal, Depends(page_principal)]


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Pages send the unauthenticated to the sign-in page and show other errors as a page; the API gets JSON."""
    wants_page = not request.url.path.startswith("/api") and "text/html" in request.headers.get("accept", "")
    if wants_page and exc.status_code == status.HTTP_401_UNAUTHORIZED:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={target}", status_code=status.HTTP_303_SEE_OTHER)
    if wants_page and not request.headers.get("hx-request"):
        return TEMPLATES.TemplateResponse(request, "error.html", {"error": exc.detail, "code": exc.status_code},
                                          status_code=exc.status_code, headers=exc.headers)
    return await http_exception_handler(request, exc)


def render(request: Request, template: str, principal: Principal | None = None, status_code: int = 200,
           **context: Any) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, template, {
        "user": principal.user if principal else None,
        "csrf": principal.web_session.csrf_token if principal else "",
        **context,
    }, status_code=status_code)


def page_service(principal: Page, session: DbDep, settings: SettingsDep, redis_client: RedisDep) -> SubscriptionService:
    """The signed-in user's subscriptions and endpoints."""
    return SubscriptionService(session, settings, redis_client, principal.user)


PageService = Annotated[SubscriptionService, Depends(page_service)]


def _errors(exc: ValidationError) -> dict[str, str]:
    """pydantic's errors by field (``policy.cooldown_s`` keeps its path); an item of a list is reported
    on the list's field with the item, as the form has one input for the list (``keys``, not ``keys.0``)."""
    found: dict[str, str] = {}
    for error in exc.errors():
        names = [str(part) for part in error["loc"] if not isinstance(part, int)]
        message = error["msg"].removeprefix("Value error, ")
        if len(names) < len(error["loc"]):
            message = f"{str(error.get('input'))[:64]!r}: {message}"
        found.setdefault(".".join(names) or "form", message)
    return found


FLASH_TTL_S = 300


def _flash(redis_client: redis.Redis, keys: RedisKeys, principal: Principal, **shown: Any) -> None:
    """Keep something to show once on the next page: a page from a POST is never what a reload shows."""
    redis_client.set(keys.flash(principal.web_session.id), json.dumps(shown), ex=FLASH_TTL_S)


def _take_flash(redis_client: redis.Redis, keys: RedisKeys, principal: Principal) -> dict:
    raw = redis_client.getdel(keys.flash(principal.web_session.id))
    return json.loads(raw) if raw else {}


def _safe_next(target: str | None) -> str:
    return target if target and target.startswith("/") and not target.startswith("//") else "/"


# -- signing in -------------------------------------------------------------------------------------

# Sign-in and sign-up forms come before any session, so their CSRF token is a random cookie the form
# repeats (double submit): another site can make a browser post the form, but cannot read the cookie.
PRE_SESSION_COOKIE = "tocsin_csrf"
FORM_EXPIRED = "the form expired; please try again"


def _anonymous_form(request: Request, template: str, status_code: int = 200, headers: dict | None = None,
                    **context: Any) -> HTMLResponse:
    """A sign-in or sign-up page with its pre-session CSRF token (the cookie is set if missing).

    ``headers``: those of the error shown, so a 429 or 503 keeps its Retry-After.
    """
    token = request.cookies.get(PRE_SESSION_COOKIE) or secrets.token_urlsafe(32)
    response = render(request, template, status_code=status_code, csrf=token, **context)
    response.headers.update(headers or {})
    response.set_cookie(PRE_SESSION_COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.app.state.settings.session_cookie_secure)
    return response


def _pre_session_csrf_ok(request: Request, sent: str) -> bool:
    cookie = request.cookies.get(PRE_SESSION_COOKIE)
    return bool(cookie) and hmac.compare_digest(sent.encode(), cookie.encode())


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> HTMLResponse:  # noqa: A002
    return _anonymous_form(request, "login.html", next=_safe_next(next))


@router.post("/login")
def login(request: Request, accounts: AccountsDep, limiter: LimiterDep, settings: SettingsDep,
          email: Annotated[str, Form()] = "", password: Annotated[str, Form()] = "",
          next: Annotated[str, Form()] = "/", csrf_token: Annotated[str, Form()] = "") -> Response:  # noqa: A002
    try:
        if not _pre_session_csrf_ok(request, csrf_token):
            raise HTTPException(status.HTTP_403_FORBIDDEN, FORM_EXPIRED)
        user = check_password(accounts, limiter, request, email, password)
    except HTTPException as exc:
        return _anonymous_form(request, "login.html", error=exc.detail, email=email, next=_safe_next(next),
                               status_code=exc.status_code, headers=exc.headers)
    response = RedirectResponse(_safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    sign_in(response, accounts, settings, user)
    return response


@router.get("/signup", response_class=HTMLResponse)
def signup_page(request: Request, settings: SettingsDep, invitation: str = "") -> HTMLResponse:
    return _anonymous_form(request, "signup.html", closed=not settings.signup_open and not invitation, errors={},
                           invitation=invitation)


@router.post("/signup")
def signup(request: Request, accounts: AccountsDep, settings: SettingsDep, limiter: LimiterDep,
           email: Annotated[str, Form()] = "", password: Annotated[str, Form()] = "",
           invitation: Annotated[str, Form()] = "", csrf_token: Annotated[str, Form()] = "") -> Response:
    form = {"email": email, "invitation": invitation}
    if not settings.signup_open and not invitation:
        return _anonymous_form(request, "signup.html", closed=True, errors={}, status_code=403, **form)
    try:
        if not _pre_session_csrf_ok(request, csrf_token):
            raise FieldError("form", FORM_EXPIRED)
        limiter.hit(settings.rate_sign_up_client, "sign-up", client_address(request), what="sign-ups")
        data = SignUpIn(email=email, password=password, invitation=invitation or None)
        user = accounts.sign_up(data.email, data.password, invitation=data.invitation)
    except ValidationError as exc:
        return _anonymous_form(request, "signup.html", errors=_errors(exc), status_code=422, **form)
    except FieldError as exc:
        code = 403 if exc.field == "form" else 422
        return _anonymous_form(request, "signup.html", errors={exc.field: str(exc)}, status_code=code, **form)
    except HTTPException as exc:
        return _anonymous_form(request, "signup.html", errors={"form": exc.detail}, status_code=exc.status_code,
                               headers=exc.headers, **form)
    except Conflict as exc:
        return _anonymous_form(request, "signup.html", errors={"email": str(exc)}, status_code=409, **form)
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    sign_in(response, accounts, settings, user)
    return response


@router.post("/logout")
def logout(request: Request, accounts: AccountsDep, _principal: Page) -> Response:
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    sign_out(request, response, accounts)
    return response


# -- subscriptions -------------------------------------------------------------------------------------

@router.get("/", response_class=HTMLResponse)
def subscriptions_page(request: Request, principal: Page, service: PageService, settings: SettingsDep,
                       redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    rows = service.list()
    pipe = redis_client.pipeline(transaction=False)
    for s in rows:
        pipe.hlen(keys.firing(s.id))
    firing = dict(zip([s.id for s in rows], pipe.execute(), strict=True))
    return render(request, "subscriptions.html", principal, subscriptions=rows, firing=firing,
                  limit=settings.user_max_subscriptions)


def _form_context(service: SubscriptionService, values: dict, errors: dict, subscription_id: int | None) -> dict:
    return {"values": values, "errors": errors, "endpoints": service.list_endpoints(),
            "subscription_id": subscription_id}


def _form_values(s: Subscription | None) -> dict:
    """What the subscription form shows: a subscription's, or a new one's defaults."""
    policy = AlertPolicy.model_validate(s.policy or {}) if s else AlertPolicy()
    return {"name": s.name if s else "", "condition": s.condition if s else "",
            "keys": " ".join(s.keys) if s and s.keys is not None else "",
            "endpoint_ids": [e.id for e in s.endpoints] if s else [], "active": s.active if s else True,
            "cooldown_s": policy.cooldown_s, "renotify_s": policy.renotify_s or "",
            "send_resolved": policy.send_resolved, "group": policy.group}


@router.get("/subscriptions/new", response_class=HTMLResponse)
def new_subscription_page(request: Request, principal: Page, service: PageService) -> HTMLResponse:
    return render(request, "subscription_form.html", principal,
                  **_form_context(service, _form_values(None), {}, None))


def _parse_form(form: FormData, settings: Settings) -> tuple[dict, SubscriptionIn | None, dict[str, str]]:
    """The form's values as typed, and the subscription or every error at once (the window checks included)."""
    keys_text = str(form.get("keys", "")).replace(",", " ")
    endpoint_ids = [str(e) for e in form.getlist("endpoint_ids")]  # pydantic checks them (ASCII digits, range)
    values = {
        "name": str(form.get("name", "")).strip(), "condition": str(form.get("condition", "")).strip(),
        "keys": keys_text.strip(), "endpoint_ids": [int(e) for e in endpoint_ids if re.fullmatch(r"[0-9]{1,10}", e)],
        "active": form.get("active") == "on", "cooldown_s": form.get("cooldown_s") or 0,
        "renotify_s": form.get("renotify_s") or "", "send_resolved": form.get("send_resolved") == "on",
        "group": form.get("group") == "on",
    }
    try:
        data = SubscriptionIn(
            name=values["name"], condition=values["condition"],
            keys=keys_text.split() or None, endpoint_ids=endpoint_ids, active=values["active"],
            policy={"cooldown_s": values["cooldown_s"], "renotify_s": values["renotify_s"] or None,
                    "send_resolved": values["send_resolved"], "group": values["group"]},
        )
    except ValidationError as exc:
        errors, data = _errors(exc), None
    else:
        errors = {}
    if "condition" not in errors:
        try:
            checked_condition(values["condition"], settings)
        except ConditionError as exc:
            errors["condition"] = str(exc)
    return values, data if not errors else None, errors


async def _save_subscription(request: Request, principal: Principal, service: SubscriptionService,
                             subscription_id: int | None) -> Response:
    form = await request.form()

    def save() -> Response:
        values, data, errors = _parse_form(form, service.settings)
        if data is not None:
            try:
                saved = (service.update(subscription_id, data) if subscription_id is not None
                         else service.create(data))
                return RedirectResponse(f"/subscriptions/{saved.id}", status_code=status.HTTP_303_SEE_OTHER)
            except FieldError as exc:
                errors = {exc.field: str(exc)}
            except (NotFound, Forbidden) as exc:
                errors = {"form": str(exc)}
        return render(request, "subscription_form.html", principal, status_code=422,
                      **_form_context(service, values, errors, subscription_id))

    return await run_in_threadpool(save)


@router.post("/subscriptions/new")
async def create_subscription(request: Request, principal: Page, service: PageService) -> Response:
    return await _save_subscription(request, principal, service, None)


@router.get("/subscriptions/{subscription_id}/edit", response_class=HTMLResponse)
def edit_subscription_page(request: Request, subscription_id: IdPath, principal: Page,
                           service: PageService) -> HTMLResponse:
    values = _form_values(service.get(subscription_id))
    return render(request, "subscription_form.html", principal,
                  **_form_context(service, values, {}, subscription_id))


@router.post("/subscriptions/{subscription_id}/edit")
async def update_subscription(request: Request, subscription_id: IdPath, principal: Page,
                              service: PageService) -> Response:
    return await _save_subscription(request, principal, service, subscription_id)


@router.post("/subscriptions/{subscription_id}/{action}")
def subscription_action(subscription_id: IdPath, action: str, principal: Page, service: PageService) -> Response:
    if action == "pause":
        service.set_active(subscription_id, False)
    elif action == "resume":
        service.set_active(subscription_id, True)
    elif action == "delete":
        service.delete(subscription_id)
        return Response(headers={"HX-Redirect": "/"})
    elif action == "unmute":
        service.set_muted(subscription_id, None)
    else:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no action {action!r}")
    return Response(headers={"HX-Refresh": "true"})


@router.get("/subscriptions/{subscription_id}", response_class=HTMLResponse)
def subscription_page(request: Request, subscription_id: IdPath, principal: Page, service: PageService) -> HTMLResponse:
    return render(request, "subscription.html", principal, s=service.get(subscription_id))


@router.get("/subscriptions/{subscription_id}/firing", response_class=HTMLResponse)
def firing_fragment(request: Request, subscription_id: IdPath, principal: Page, service: PageService,
                    redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    service.get(subscription_id)
    return render(request, "_firing.html", principal, firing=AlertViews(redis_client, keys).firing(subscription_id))


@router.get("/subscriptions/{subscription_id}/history", response_class=HTMLResponse)
def history_fragment(request: Request, subscription_id: IdPath, principal: Page, service: PageService,
                     redis_client: RedisDep, keys: KeysDep,
                     state: str = "", key: str = "", since: str = "", before: str = "") -> HTMLResponse:
    service.get(subscription_id)
    since_ms = int(time.time() * 1000) - int(since) * 60_000 if re.fullmatch(r"[0-9]{1,9}", since) else None
    where = HistoryFilter(state=state if state in ("firing", "resolved") else None,
                          key=key.strip() or None, since_ms=since_ms)
    cursor_given = before if valid_cursor(before) else None
    alerts, cursor = AlertViews(redis_client, keys).history(subscription_id, where, 50, cursor_given)
    return render(request, "_history.html", principal, alerts=alerts, cursor=cursor, subscription_id=subscription_id,
                  query={"state": state, "key": key, "since": since})


@router.get("/subscriptions/{subscription_id}/deliveries", response_class=HTMLResponse)
def deliveries_fragment(request: Request, subscription_id: IdPath, principal: Page, service: PageService,
                        records: RecordsDep) -> HTMLResponse:
    service.get(subscription_id)
    return render(request, "_deliveries.html", principal, deliveries=records.log(subscription_id, 100))


# -- conditions: live validation and preview ---------------------------------------------------------

@router.post("/conditions/check", response_class=HTMLResponse)
def check_condition_fragment(request: Request, principal: Page, settings: SettingsDep,
                             condition: Annotated[str, Form()] = "") -> HTMLResponse:
    try:
        return render(request, "_condition.html", principal, described=describe(condition, settings), error=None)
    except ConditionError as exc:
        return render(request, "_condition.html", principal, described=None, error=str(exc))


@router.post("/conditions/preview", response_class=HTMLResponse)
async def preview_fragment(request: Request, principal: Page, settings: SettingsDep, redis_client: RedisDep,
                           limiter: LimiterDep, condition: Annotated[str, Form()] = "",
                           keys: Annotated[str, Form()] = "") -> HTMLResponse:
    try:
        await run_in_threadpool(limit_previews, limiter, request, principal.user.id)  # Redis, off the loop
    except HTTPException as exc:
        response = render(request, "_preview.html", principal, result=None, error=exc.detail,
                          status_code=exc.status_code)
        response.headers.update(exc.headers or {})
        return response
    try:
        result = await preview_matches(condition, keys.replace(",", " ").split() or None, settings, redis_client)
    except ConditionError as exc:
        return render(request, "_preview.html", principal, result=None, error=str(exc))
    return render(request, "_preview.html", principal, result=result, error=None)


# -- endpoints and tokens ------------------------------------------------------------------------------

@router.get("/endpoints", response_class=HTMLResponse)
def endpoints_page(request: Request, principal: Page, service: PageService,
                   redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    return render(request, "endpoints.html", principal, endpoints=service.list_endpoints(), errors={}, values={},
                  secret=_take_flash(redis_client, keys, principal).get("secret"))


@router.post("/endpoints")
def create_endpoint(request: Request, principal: Page, service: PageService, redis_client: RedisDep,
                    keys: KeysDep, kind: Annotated[str, Form()] = "", target: Annotated[str, Form()] = "") -> Response:
    try:
        endpoint = service.create_endpoint(EndpointIn(kind=kind, target=target.strip()))
    except ValidationError as exc:
        errors = _errors(exc)
    except Forbidden as exc:
        errors = {"form": str(exc)}
    else:
        if endpoint.secret:
            _flash(redis_client, keys, principal, secret={"target": endpoint.target, "value": endpoint.secret})
        return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)
    return render(request, "endpoints.html", principal, endpoints=service.list_endpoints(), errors=errors,
                  values={"kind": kind, "target": target}, secret=None, status_code=422)


@router.post("/endpoints/{endpoint_id}/rotate")
def rotate_endpoint_secret(endpoint_id: IdPath, principal: Page, service: PageService,
                           redis_client: RedisDep, keys: KeysDep) -> Response:
    endpoint = service.rotate_secret(endpoint_id)
    _flash(redis_client, keys, principal, secret={"target": endpoint.target, "value": endpoint.secret})
    return RedirectResponse("/endpoints", status_code=status.HTTP_303_SEE_OTHER)


@router.post("/endpoints/{endpoint_id}/test", response_class=HTMLResponse)
def test_endpoint(request: Request, endpoint_id: IdPath, principal: Page, service: PageService,
                  celery: CeleryDep, limiter: LimiterDep) -> HTMLResponse:
    endpoint = service.get_endpoint(endpoint_id)
    try:
        limit_test_alerts(limiter, request, principal.user.id)
    except HTTPException as exc:
        return HTMLResponse(f'<span class="error">{html.escape(exc.detail)}</span>', status_code=exc.status_code,
                            headers=exc.headers)
    queued = enqueue_test_alert(celery, endpoint)
    return HTMLResponse(f'<span class="ok">Test alert queued ({queued[:8]}…); its delivery shows in the log below.'
                        '</span>')


@router.post("/endpoints/{endpoint_id}/delete")
def delete_endpoint(endpoint_id: IdPath, principal: Page, service: PageService) -> Response:
    service.delete_endpoint(endpoint_id)
    return Response(headers={"HX-Redirect": "/endpoints"})


@router.get("/endpoints/{endpoint_id}/deliveries", response_class=HTMLResponse)
def endpoint_deliveries_fragment(request: Request, endpoint_id: IdPath, principal: Page, service: PageService,
                                 records: RecordsDep) -> HTMLResponse:
    service.get_endpoint(endpoint_id)
    return render(request, "_deliveries.html", principal, deliveries=records.endpoint_log(endpoint_id, 20))


@router.get("/account", response_class=HTMLResponse)
def account_page(request: Request, principal: Page, accounts: AccountsDep, redis_client: RedisDep,
                 keys: KeysDep) -> HTMLResponse:
    shown = _take_flash(redis_client, keys, principal)
    return render(request, "account.html", principal, tokens=accounts.tokens(principal.user), errors={},
                  new_token=shown.get("token"), password_changed=shown.get("password_changed"))


@router.post("/account/tokens")
def create_token(request: Request, principal: Page, accounts: AccountsDep, redis_client: RedisDep, keys: KeysDep,
                 name: Annotated[str, Form()] = "") -> Response:
    try:
        token, _ = accounts.create_token(principal.user, TokenIn(name=name.strip()).name)
    except ValidationError as exc:
        errors = {"name": f"the token's name {next(iter(_errors(exc).values()))}"}
    except Forbidden as exc:
        errors = {"name": str(exc)}
    else:
        _flash(redis_client, keys, principal, token=token)
        return RedirectResponse("/account", status_code=status.HTTP_303_SEE_OTHER)
    return render(request, "account.html", principal, tokens=accounts.tokens(principal.user), new_token=None,
                  errors=errors, status_code=422)


@router.post("/account/password")
def change_password(request: Request, principal: Page, accounts: AccountsDep, limiter: LimiterDep,
                    redis_client: RedisDep, keys: KeysDep, current_password: Annotated[str, Form()] = "",
                    new_password: Annotated[str, Form()] = "") -> Response:
    """Other sessions end and every API token is revoked; the page says how many."""
    user = principal.user
    try:
        check_password(accounts, limiter, request, user.email, current_password, wrong=wrong_current_password())
        sessions, tokens = accounts.change_password(user, new_password, keep_session=principal.web_session)
    except HTTPException as exc:
        errors, code = {"password": exc.detail}, exc.status_code
    except FieldError as exc:
        errors, code = {"password": f"the new password {exc}"}, 422
    else:
        _flash(redis_client, keys, principal, password_changed=(
            f"Password changed: {sessions} other browser session(s) signed out, {tokens} API token(s) revoked."))
        return RedirectResponse("/account", status_code=status.HTTP_303_SEE_OTHER)
    return render(request, "account.html", principal, tokens=accounts.tokens(user), new_token=None, errors=errors,
                  status_code=code)


@router.post("/account/tokens/{token_id}/revoke")
def revoke_token(token_id: IdPath, principal: Page, accounts: AccountsDep) -> Response:
    accounts.revoke_token(principal.user, token_id)
    return Response(headers={"HX-Redirect": "/account"})


# -- operators ------------------------------------------------------------------------------------------

def _operator(principal: Principal) -> None:
    if not principal.user.is_operator:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "operators only")


@router.get("/ops", response_class=HTMLResponse)
def ops_page(request: Request, principal: Page, session: DbDep, settings: SettingsDep, redis_client: RedisDep,
             records: RecordsDep) -> HTMLResponse:
    _operator(principal)
    return render(request, "ops.html", principal, load=subscription_load(session),
                  latest=(samples(redis_client, settings, 1) or [None])[0],
                  dead_letters=records.dead_letters(100), sample_s=settings.dashboard_sample_s,
                  invitation=_take_flash(redis_client, RedisKeys(settings), principal).get("invitation"),
                  invitation_ttl=f"{settings.invitation_ttl_s // 3600} h",
                  incidents=banner(open_incidents(redis_client, settings)))


@router.post("/ops/invitations")
def create_invitation(request: Request, principal: Page, accounts: AccountsDep, redis_client: RedisDep,
                      keys: KeysDep, role: Annotated[str, Form()] = "user") -> Response:
    """An operator's invitation link, shown once on the next page."""
    _operator(principal)
    token, invitation = accounts.invite(principal.user, role if role in ROLES else "user")
    url = str(request.url_for("signup_page").include_query_params(invitation=token))
    _flash(redis_client, keys, principal, invitation={"role": invitation.role, "url": url})
    return RedirectResponse("/ops", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/ops/watchdog", response_class=HTMLResponse)
def watchdog_fragment(request: Request, principal: Page, settings: SettingsDep, redis_client: RedisDep
                      ) -> HTMLResponse:
    """The dead man's switch banner, refreshed in place."""
    _operator(principal)
    return render(request, "_watchdog.html", principal, incidents=banner(open_incidents(redis_client, settings)))


@router.get("/ops/dead-letters", response_class=HTMLResponse)
def dead_letters_fragment(request: Request, principal: Page, records: RecordsDep) -> HTMLResponse:
    _operator(principal)
    return render(request, "_dead_letters.html", principal, dead_letters=records.dead_letters(100))


@router.post("/ops/dead-letters/replay", response_class=HTMLResponse)
def replay_dead_letters(request: Request, principal: Page, records: RecordsDep, celery: CeleryDep,
                        letter: Annotated[str, Form()] = "") -> HTMLResponse:
    _operator(principal)
    ids = [letter] if letter else [d["id"] for d in records.dead_letters(5_000)]
    for letter_id in ids:
        records.replay(letter_id, celery)
    return render(request, "_dead_letters.html", principal, dead_letters=records.dead_letters(100))


@router.get("/ops/samples")
def ops_samples(principal: Page, settings: SettingsDep, redis_client: RedisDep) -> JSONResponse:
    _operator(principal)
    return JSONResponse(samples(redis_client, settings))
