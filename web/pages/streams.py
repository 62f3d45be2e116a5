"""The operators' stream pages: declare streams, evolve their attributes, issue publisher tokens.

Everything goes through ``subscriptions.streams.StreamService``, as the API and the
admin CLI do, so the three give the same answers; refusals are shown on the field
(or, for a change subscriptions depend on, with the list of those subscriptions).
A new publisher token is shown once, on the page after the POST (the flash).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Form, Path, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select

from core.streams import Attribute, IncompatibleChange, StreamSchema
from core.text import Name
from subscriptions.admin import attribute_spec
from subscriptions.errors import Conflict, Forbidden, NotFound
from subscriptions.models import Stream, Subscription
from subscriptions.streams import StreamService, TopicError, fields_used, parse_schema, stream_of
from web.deps import DbDep, IdPath, KeysDep, RedisDep, SettingsDep
from web.pages.common import Page, PagePrincipal, flash, form_errors, render, take_flash
from web.pages.ops import _operator

router = APIRouter(include_in_schema=False)
NAME: TypeAdapter[str] = TypeAdapter(Name)

NamePath = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
FieldPath = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")]


@dataclass(frozen=True)
class StreamView:
    """A stream as the page shows it: its schema, and which subscriptions use each field."""

    row: Stream
    schema: StreamSchema
    used: dict[str, list[str]]


def _views(service: StreamService) -> list[StreamView]:
    """Every stream with its fields' users, reading the subscriptions once (not once per stream)."""
    used: dict[str, dict[str, list[str]]] = {}
    for subscription in service.session.scalars(select(Subscription).order_by(Subscription.id)):
        by_field = used.setdefault(stream_of(subscription), {})
        for name in sorted(fields_used(subscription)):
            by_field.setdefault(name, []).append(f"#{subscription.id} {subscription.name}")
    return [StreamView(row, service.schema_of(row), used.get(row.name, {})) for row in service.streams()]


def _page(request: Request, principal: PagePrincipal, service: StreamService, status_code: int = 200,
          **context: Any) -> HTMLResponse:
    context.setdefault("errors", {})
    context.setdefault("values", {})
    return render(request, "streams.html", principal, status_code, streams=_views(service), tokens=service.tokens(),
                  **context)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _attributes(text: str, required: bool) -> list[dict]:
    """Lines ``name[:unit[:min[:max]]]``, as the admin CLI takes them (a bound that is no number is a field error)."""
    try:
        return [attribute_spec(line, required) for line in _lines(text)]
    except ValueError as exc:
        raise _FormError({"optional_attributes" if not required else "attributes": f"a bound is not a number: {exc}"}
                         ) from None


class _FormError(Exception):
    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors)
        self.errors = errors


def _declaration_errors(exc: ValidationError) -> dict[str, str]:
    """The schema's errors on the form's inputs (optional attributes share the ``attributes`` list)."""
    errors: dict[str, str] = {}
    for name, message in form_errors(exc).items():
        field = name.split(".")[0] if name.startswith(("attributes", "dimensions")) else name
        errors.setdefault(field, message if field == name else f"{name}: {message}")
    return errors


@router.get("/streams", response_class=HTMLResponse)
def streams_page(request: Request, principal: Page, session: DbDep, settings: SettingsDep, redis_client: RedisDep,
                 keys: KeysDep) -> HTMLResponse:
    _operator(principal)
    shown = take_flash(redis_client, keys, principal)
    return _page(request, principal, StreamService(session, settings), new_token=shown.get("token"),
                 notice=shown.get("notice"))


@router.post("/streams")
def declare_stream(request: Request, principal: Page, session: DbDep, settings: SettingsDep, redis_client: RedisDep,
                   keys: KeysDep, name: Annotated[str, Form()] = "", key_field: Annotated[str, Form()] = "",
                   time_field: Annotated[str, Form()] = "", time_format: Annotated[str, Form()] = "",
                   attributes: Annotated[str, Form()] = "", optional_attributes: Annotated[str, Form()] = "",
                   dimensions: Annotated[str, Form()] = "", partitions: Annotated[str, Form()] = "",
                   retention_ms: Annotated[str, Form()] = "") -> Response:
    """Declare a stream and create its topic; the form comes back with each field's error otherwise."""
    _operator(principal)
    service = StreamService(session, settings)
    values = {"name": name, "key_field": key_field, "time_field": time_field, "time_format": time_format,
              "attributes": attributes, "optional_attributes": optional_attributes, "dimensions": dimensions,
              "partitions": partitions, "retention_ms": retention_ms}
    try:
        data = {"name": name.strip(), "key_field": key_field.strip() or None, "time_field": time_field.strip() or None,
                "time_format": time_format or None,
                "attributes": _attributes(attributes, True) + _attributes(optional_attributes, False),
                "dimensions": [{"name": d.strip()} for d in dimensions.replace("\n", ",").split(",") if d.strip()],
                "partitions": partitions.strip() or None, "retention_ms": retention_ms.strip() or None}
        stream = service.create(parse_schema(data, settings))
    except _FormError as exc:
        errors, code = exc.errors, 422
    except ValidationError as exc:
        errors, code = _declaration_errors(exc), 422
    except Conflict as exc:
        errors, code = {"name": str(exc)}, 409
    except Forbidden as exc:
        errors, code = {"form": str(exc)}, 403
    except TopicError as exc:
        errors, code = {"form": str(exc)}, 503
    else:
        flash(redis_client, keys, principal, notice=f"Stream {stream.name} declared on topic {stream.topic}.")
        return RedirectResponse(f"/streams#stream-{stream.name}", status_code=status.HTTP_303_SEE_OTHER)
    return _page(request, principal, service, code, errors=errors, values=values)


@router.post("/streams/{name}/attributes")
def add_attribute(request: Request, name: NamePath, principal: Page, session: DbDep, settings: SettingsDep,
                  redis_client: RedisDep, keys: KeysDep, attribute: Annotated[str, Form()] = "",
                  unit: Annotated[str, Form()] = "", low: Annotated[str, Form(alias="min")] = "",
                  high: Annotated[str, Form(alias="max")] = "") -> Response:
    """Add an optional attribute (a compatible change: the stream's version goes up)."""
    _operator(principal)
    service = StreamService(session, settings)
    try:
        added = Attribute.model_validate({"name": attribute.strip(), "unit": unit.strip() or None,
                                          "min": low.strip() or None, "max": high.strip() or None,
                                          "required": False})
        stream = service.add_attribute(name, added)
    except ValidationError as exc:
        message, code = "; ".join(f"{field}: {text}" for field, text in form_errors(exc).items()), 422
    except IncompatibleChange as exc:
        message, code = str(exc), 409
    else:
        flash(redis_client, keys, principal, notice=f"Stream {name}: attribute {added.name} added "
                                                    f"(version {stream.version}).")
        return RedirectResponse(f"/streams#stream-{name}", status_code=status.HTTP_303_SEE_OTHER)
    return _page(request, principal, service, code, attribute_errors={name: message},
                 attribute_values={name: {"attribute": attribute, "unit": unit, "min": low, "max": high}})


@router.post("/streams/{name}/attributes/{attribute}/remove")
def remove_attribute(request: Request, name: NamePath, attribute: FieldPath, principal: Page, session: DbDep,
                     settings: SettingsDep, redis_client: RedisDep, keys: KeysDep) -> Response:
    """Remove an attribute; refused, with the subscriptions that use it, while any does."""
    _operator(principal)
    service = StreamService(session, settings)
    try:
        stream = service.remove_attribute(name, attribute)
    except IncompatibleChange as exc:
        refusal = {"stream": name, "message": str(exc), "subscriptions": exc.subscriptions}
        return _page(request, principal, service, status.HTTP_409_CONFLICT, refusal=refusal)
    except ValidationError as exc:  # e.g. the last attribute: a stream has at least one
        refusal = {"stream": name, "message": "; ".join(form_errors(exc).values()), "subscriptions": []}
        return _page(request, principal, service, status.HTTP_422_UNPROCESSABLE_CONTENT, refusal=refusal)
    flash(redis_client, keys, principal, notice=f"Stream {name}: attribute {attribute} removed "
                                                f"(version {stream.version}).")
    return RedirectResponse(f"/streams#stream-{name}", status_code=status.HTTP_303_SEE_OTHER)


@router.post("/streams/tokens")
def create_publisher_token(request: Request, principal: Page, session: DbDep, settings: SettingsDep,
                           redis_client: RedisDep, keys: KeysDep, token_name: Annotated[str, Form()] = "",
                           streams: Annotated[list[str] | None, Form()] = None) -> Response:
    """A publisher token for the chosen streams, shown once on the next page."""
    _operator(principal)
    service = StreamService(session, settings)
    errors: dict[str, str] = {}
    try:
        NAME.validate_python(token_name.strip())
    except ValidationError as exc:
        errors["token_name"] = f"the token's name {form_errors(exc)['form']}"
    if not streams:
        errors["token_streams"] = "choose at least one stream the token may publish to"
    if not errors:
        try:
            token, _ = service.create_token(token_name.strip(), streams or [], principal.user)
        except (Forbidden, NotFound) as exc:
            errors["token_streams"] = str(exc)
        else:
            flash(redis_client, keys, principal, token=token)
            return RedirectResponse("/streams#publisher-tokens", status_code=status.HTTP_303_SEE_OTHER)
    return _page(request, principal, service, 422, errors=errors,
                 values={"token_name": token_name, "token_streams": streams or []})


@router.post("/streams/tokens/{token_id}/revoke")
def revoke_publisher_token(token_id: IdPath, principal: Page, session: DbDep, settings: SettingsDep) -> Response:
    _operator(principal)
    StreamService(session, settings).revoke_token(token_id)
    return Response(headers={"HX-Redirect": "/streams"})  # no fragment: one would not reload the page
