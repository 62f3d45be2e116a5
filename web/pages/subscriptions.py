"""The subscriptions pages: the list, the form (new and edit), one subscription and its live fragments."""

from __future__ import annotations

import re
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.datastructures import FormData

from core.stream_names import TRADES
from subscriptions.alerts import AlertViews, HistoryFilter, valid_cursor
from subscriptions.errors import FieldError, Forbidden, NotFound
from subscriptions.language import ConditionError, combine_keys
from subscriptions.models import Subscription
from subscriptions.policy import AlertPolicy
from subscriptions.schemas import SubscriptionIn
from subscriptions.service import SubscriptionService, checked_condition, stream_schema
from subscriptions.streams import StreamService, stream_of
from web.admission import admission_status
from web.conditions import stream_choices
from web.deps import IdPath, KeysDep, RecordsDep, RedisDep, SettingsDep
from web.pages.common import Page, PagePrincipal, PageService, form_errors, render

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def subscriptions_page(request: Request, principal: Page, service: PageService, settings: SettingsDep,
                       redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    rows = service.list()
    pipe = redis_client.pipeline(transaction=False)
    for s in rows:
        pipe.hlen(keys.firing(s.id))
    firing = dict(zip([s.id for s in rows], pipe.execute(), strict=True))
    return render(request, "subscriptions.html", principal, subscriptions=rows, firing=firing,
                  streams={s.id: stream_of(s) for s in rows}, limit=settings.user_max_subscriptions)


def _form_context(service: SubscriptionService, values: dict, errors: dict, subscription_id: int | None) -> dict:
    streams = StreamService(service.session, service.settings)
    choices = stream_choices([streams.schema_of(s) for s in streams.streams()])
    if values["stream"] not in {c["name"] for c in choices}:  # mistyped, or deleted meanwhile: offer trades
        values = {**values, "stream": TRADES}
    return {"values": values, "errors": errors, "endpoints": service.list_endpoints(),
            "subscription_id": subscription_id, "streams": choices}


def _form_values(s: Subscription | None) -> dict:
    """What the subscription form shows: a subscription's, or a new one's defaults."""
    policy = AlertPolicy.model_validate(s.policy or {}) if s else AlertPolicy()
    return {"name": s.name if s else "", "stream": stream_of(s) if s else TRADES, "condition": s.condition if s else "",
            "keys": " ".join(s.keys) if s and s.keys is not None else "",
            "endpoint_ids": [e.id for e in s.endpoints] if s else [], "active": s.active if s else True,
            "cooldown_s": policy.cooldown_s, "renotify_s": policy.renotify_s or "",
            "send_resolved": policy.send_resolved, "group": policy.group}


@router.get("/subscriptions/new", response_class=HTMLResponse)
def new_subscription_page(request: Request, principal: Page, service: PageService) -> HTMLResponse:
    return render(request, "subscription_form.html", principal,
                  **_form_context(service, _form_values(None), {}, None))


def _parse_form(form: FormData, service: SubscriptionService) -> tuple[dict, SubscriptionIn | None, dict[str, str]]:
    """The form's values as typed, and the subscription or every error at once (the stream's attributes and
    dimensions, the window checks and the keys included)."""
    keys_text = str(form.get("keys", "")).replace(",", " ")
    endpoint_ids = [str(e) for e in form.getlist("endpoint_ids")]  # pydantic checks them (ASCII digits, range)
    values: dict[str, Any] = {
        "name": str(form.get("name", "")).strip(), "stream": str(form.get("stream", TRADES)).strip(),
        "condition": str(form.get("condition", "")).strip(),
        "keys": keys_text.strip(), "endpoint_ids": [int(e) for e in endpoint_ids if re.fullmatch(r"[0-9]{1,10}", e)],
        "active": form.get("active") == "on", "cooldown_s": form.get("cooldown_s") or 0,
        "renotify_s": form.get("renotify_s") or "", "send_resolved": form.get("send_resolved") == "on",
        "group": form.get("group") == "on",
    }
    try:
        data = SubscriptionIn(
            name=values["name"], stream=values["stream"], condition=values["condition"],
            keys=keys_text.split() or None, endpoint_ids=endpoint_ids, active=values["active"],
            policy={"cooldown_s": values["cooldown_s"], "renotify_s": values["renotify_s"] or None,
                    "send_resolved": values["send_resolved"], "group": values["group"]},
        )
    except ValidationError as exc:
        errors, data = form_errors(exc), None
    else:
        errors = {}
    if "condition" not in errors and "stream" not in errors:
        try:
            filtered = checked_condition(values["condition"], service.settings,
                                         stream_schema(service.session, service.settings, values["stream"]))
            if "keys" not in errors:
                try:
                    combine_keys(keys_text.split() or None, filtered.keys, filtered.condition.key_prefix)
                except ConditionError as exc:  # on keys: the condition alone is valid (its live check says so)
                    errors["keys"] = str(exc)
        except ConditionError as exc:
            errors["condition"] = str(exc)
        except FieldError as exc:
            errors[exc.field] = str(exc)
    return values, data if not errors else None, errors


async def _save_subscription(request: Request, principal: PagePrincipal, service: SubscriptionService,
                             subscription_id: int | None) -> Response:
    form = await request.form()

    def save() -> Response:
        values, data, errors = _parse_form(form, service)
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


# After the edit route: ``{action}`` would match ``edit`` too.
@router.post("/subscriptions/{subscription_id}/{action}")
def subscription_action(subscription_id: IdPath, action: str, service: PageService) -> Response:
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
    subscription = service.get(subscription_id)
    return render(request, "subscription.html", principal, s=subscription, stream=stream_of(subscription))


@router.get("/subscriptions/{subscription_id}/firing", response_class=HTMLResponse)
def firing_fragment(request: Request, subscription_id: IdPath, principal: Page, service: PageService,
                    redis_client: RedisDep, keys: KeysDep) -> HTMLResponse:
    subscription = service.get(subscription_id)
    return render(request, "_firing.html", principal, firing=AlertViews(redis_client, keys).firing(subscription_id),
                  admission=admission_status(redis_client, keys, stream_of(subscription), subscription_id,
                                             subscription.catalog_version))


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
                  query={"state": state, "key": key, "since": since}, paged=cursor_given is not None)


@router.get("/subscriptions/{subscription_id}/deliveries", response_class=HTMLResponse)
def deliveries_fragment(request: Request, subscription_id: IdPath, principal: Page, service: PageService,
                        records: RecordsDep) -> HTMLResponse:
    service.get(subscription_id)
    return render(request, "_deliveries.html", principal, deliveries=records.log(subscription_id, 100))
