"""What every page shares: the templates, the signed-in principal, rendering, error pages and the flash.

Pages need a signed-in browser session; an unauthenticated visit is sent to the
sign-in page. Every form and htmx request carries the session's CSRF token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import Depends, HTTPException, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from core.redis_schema import RedisKeys
from notifier.channels import endpoint_kinds
from subscriptions.language import language_help
from subscriptions.models import WebSession
from subscriptions.service import SubscriptionService
from web.deps import DbDep, Principal, PrincipalDep, RedisDep, SettingsDep

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent.parent / "templates")
TEMPLATES.env.globals["fmt_ms"] = lambda ms: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) if ms else ""
TEMPLATES.env.globals["fmt_s"] = lambda s: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s)) if s else ""
TEMPLATES.env.globals["language"] = language_help()  # the form's condition-language help, from the registries
TEMPLATES.env.globals["endpoint_kinds"] = lambda: {kind.name: kind for kind in endpoint_kinds()}  # default first


@dataclass(frozen=True)
class PagePrincipal(Principal):
    """The caller of a page: always a browser session (an API token is no sign-in to the UI)."""

    web_session: WebSession


def page_principal(principal: PrincipalDep) -> PagePrincipal:
    if principal is None or principal.web_session is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "sign in")
    return PagePrincipal(principal.user, principal.web_session)


Page = Annotated[PagePrincipal, Depends(page_principal)]


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


def render(request: Request, template: str, principal: PagePrincipal | None = None, status_code: int = 200,
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


def form_errors(exc: ValidationError) -> dict[str, str]:
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


def flash(redis_client: redis.Redis, keys: RedisKeys, principal: PagePrincipal, **shown: Any) -> None:
    """Keep something to show once on the next page: a page from a POST is never what a reload shows."""
    redis_client.set(keys.flash(principal.web_session.id), json.dumps(shown), ex=FLASH_TTL_S)


def take_flash(redis_client: redis.Redis, keys: RedisKeys, principal: PagePrincipal) -> dict:
    raw = redis_client.getdel(keys.flash(principal.web_session.id))
    return json.loads(raw) if raw else {}
