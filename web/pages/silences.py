"""The silences page: hold back a while the alerts of one's subscriptions that match, see and expire silences."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.datastructures import FormData

from subscriptions.errors import FieldError, Forbidden
from subscriptions.silences import SilenceIn, SilenceOut, SilenceService
from web.deps import DbDep, IdPath, SettingsDep
from web.pages.common import Page, PageService, form_errors, render

router = APIRouter(include_in_schema=False)

#: The form's choice of durations (label, seconds); "ends at" overrides it.
DURATIONS = (("15 minutes", 900), ("1 hour", 3_600), ("2 hours", 7_200), ("4 hours", 14_400), ("1 day", 86_400),
             ("7 days", 604_800))
FORM_MATCHERS = 3  # matcher rows the form shows; empty ones are ignored


def page_silences(principal: Page, session: DbDep, settings: SettingsDep) -> SilenceService:
    return SilenceService(session, settings, principal.user)


PageSilences = Annotated[SilenceService, Depends(page_silences)]


def _page(request: Request, principal: Page, silences: SilenceService, service: PageService, values: dict,
          errors: dict[str, str], status_code: int = 200) -> HTMLResponse:
    now = datetime.now(UTC)
    return render(request, "silences.html", principal, status_code=status_code,
                  silences=[SilenceOut.of(s, now) for s in silences.list()], subscriptions=service.list(),
                  values=values, errors=errors, durations=DURATIONS, limit=silences.settings.user_max_silences)


def _blank(subscription: int | None = None) -> dict[str, Any]:
    rows = [{"name": "subscription", "op": "=", "value": str(subscription)}] if subscription else []
    rows += [{"name": "key", "op": "=", "value": ""} for _ in range(FORM_MATCHERS - len(rows))]
    return {"matchers": rows, "comment": "", "duration_s": 3_600, "ends_at": ""}


@router.get("/silences", response_class=HTMLResponse)
def silences_page(request: Request, principal: Page, silences: PageSilences, service: PageService,
                  subscription: int | None = None) -> HTMLResponse:
    """``?subscription=<id>`` prefills a matcher of that subscription (the shortcut on a subscription's page)."""
    return _page(request, principal, silences, service, _blank(subscription), {})


def _parse_form(form: FormData) -> tuple[dict, SilenceIn | None, dict[str, str]]:
    """The form's values as typed, and the silence or its errors by field."""
    rows = [{"name": str(n), "op": str(o), "value": str(v).strip()} for n, o, v in
            zip(form.getlist("matcher_name"), form.getlist("matcher_op"), form.getlist("matcher_value"), strict=False)]
    ends_at = str(form.get("ends_at", "")).strip()
    values: dict[str, Any] = {"matchers": rows + _blank()["matchers"][len(rows):],
                              "comment": str(form.get("comment", "")), "duration_s": str(form.get("duration_s", "")),
                              "ends_at": ends_at}
    given = [row for row in rows if row["value"]]
    try:  # "ends at" (UTC, as the label says) wins over the duration
        data = SilenceIn.model_validate({"matchers": given, "comment": values["comment"],
                                         **({"ends_at": ends_at} if ends_at else {"duration_s": values["duration_s"]})})
    except ValidationError as exc:
        return values, None, form_errors(exc)
    return values, data, {}


@router.post("/silences")
async def create_silence(request: Request, principal: Page, silences: PageSilences, service: PageService) -> Response:
    form = await request.form()

    def save() -> Response:
        values, data, errors = _parse_form(form)
        if data is not None:
            try:
                silences.create(data)
                return RedirectResponse("/silences", status_code=status.HTTP_303_SEE_OTHER)
            except FieldError as exc:
                errors = {exc.field: str(exc)}
            except Forbidden as exc:
                errors = {"form": str(exc)}
        return _page(request, principal, silences, service, values, errors, status_code=422)

    return await run_in_threadpool(save)


@router.post("/silences/check", response_class=HTMLResponse)
async def check_silence(request: Request, principal: Page, silences: PageSilences) -> HTMLResponse:
    """The form's live check as it is filled in: every error by field, or what the silence would span."""
    form = await request.form()

    def check() -> HTMLResponse:
        _, data, errors = _parse_form(form)
        window = None
        if data is not None:
            try:
                window = silences.check(data, datetime.now(UTC))
            except FieldError as exc:
                errors = {exc.field: str(exc)}
        return render(request, "_silence_check.html", principal, errors=errors, window=window)

    return await run_in_threadpool(check)


@router.post("/silences/{silence_id}/expire")
def expire_silence(silence_id: IdPath, silences: PageSilences) -> Response:
    silences.expire(silence_id)
    return RedirectResponse("/silences", status_code=status.HTTP_303_SEE_OTHER)
