"""The operators' pages: the dashboard, invitations, the watchdog banner and the dead letters."""

from __future__ import annotations

import time
from typing import Annotated

import redis
from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from core.redis_schema import RedisKeys
from core.restarts import recorded
from core.settings import Settings
from subscriptions.models import ROLES
from web.deps import AccountsDep, CeleryDep, DbDep, KeysDep, OutboxDep, RecordsDep, RedisDep, SettingsDep
from web.ops import samples, stream_load, subscription_load
from web.pages.common import Page, PagePrincipal, flash, render, take_flash
from web.watchdog import banner, open_incidents, unwatched_since

router = APIRouter(include_in_schema=False)


def _latest(client: redis.Redis, settings: Settings) -> dict | None:
    return next(iter(samples(client, settings, 1)), None)


def _supervision(client: redis.Redis, settings: Settings, latest: dict | None) -> dict:
    """What the refreshed banner shows: the dead man's switch's incidents, whether it watches at all (from the
    ``latest`` sample), and the runner's restarts."""
    keys = RedisKeys(settings)
    return {"incidents": banner(open_incidents(client, settings)), "restarts": recorded(client, keys),
            "unwatched_since": unwatched_since(latest, settings, time.time())}


def _operator(principal: PagePrincipal) -> None:
    if not principal.user.is_operator:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "operators only")


@router.get("/ops", response_class=HTMLResponse)
def ops_page(request: Request, principal: Page, session: DbDep, settings: SettingsDep, redis_client: RedisDep,
             records: RecordsDep) -> HTMLResponse:
    _operator(principal)
    load = subscription_load(session)
    latest = _latest(redis_client, settings)
    return render(request, "ops.html", principal, load=load, streams=stream_load(load), latest=latest,
                  dead_letters=records.dead_letters(100), sample_s=settings.dashboard_sample_s,
                  invitation=take_flash(redis_client, RedisKeys(settings), principal).get("invitation"),
                  invitation_ttl=f"{settings.invitation_ttl_s // 3600} h",
                  **_supervision(redis_client, settings, latest))


@router.post("/ops/invitations")
def create_invitation(request: Request, principal: Page, accounts: AccountsDep, redis_client: RedisDep,
                      keys: KeysDep, role: Annotated[str, Form()] = "user") -> Response:
    """An operator's invitation link, shown once on the next page."""
    _operator(principal)
    token, invitation = accounts.invite(principal.user, role if role in ROLES else "user")
    url = str(request.url_for("signup_page").include_query_params(invitation=token))
    flash(redis_client, keys, principal, invitation={"role": invitation.role, "url": url})
    return RedirectResponse("/ops", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/ops/watchdog", response_class=HTMLResponse)
def watchdog_fragment(request: Request, principal: Page, settings: SettingsDep, redis_client: RedisDep
                      ) -> HTMLResponse:
    """The dead man's switch banner and the process restarts, refreshed in place."""
    _operator(principal)
    return render(request, "_watchdog.html", principal,
                  **_supervision(redis_client, settings, _latest(redis_client, settings)))


@router.get("/ops/dead-letters", response_class=HTMLResponse)
def dead_letters_fragment(request: Request, principal: Page, records: RecordsDep) -> HTMLResponse:
    _operator(principal)
    return render(request, "_dead_letters.html", principal, dead_letters=records.dead_letters(100))


@router.post("/ops/dead-letters/replay", response_class=HTMLResponse)
def replay_dead_letters(request: Request, principal: Page, records: RecordsDep, celery: CeleryDep, outbox: OutboxDep,
                        letter: Annotated[str, Form()] = "") -> HTMLResponse:
    _operator(principal)
    ids = [letter] if letter else [d["id"] for d in records.dead_letters(5_000)]
    for letter_id in ids:
        records.replay(letter_id, celery, outbox)
    return render(request, "_dead_letters.html", principal, dead_letters=records.dead_letters(100))


@router.get("/ops/samples")
def ops_samples(principal: Page, settings: SettingsDep, redis_client: RedisDep) -> JSONResponse:
    _operator(principal)
    return JSONResponse(samples(redis_client, settings))
