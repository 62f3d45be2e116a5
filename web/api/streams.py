"""Streams (operators declare them), publisher tokens (operators issue them), and publishing events.

``POST /api/streams/{name}/events`` takes a JSON array (``application/json``) or
NDJSON (``application/x-ndjson``) of records, answers 202 with the count accepted
and each reject's index and reason, and dead-letters the rejects with their
reasons; the rest of the batch is never lost to a bad record. See
docs/publishing.md for the limits and status codes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.clock_ahead import token_source
from core.redis_client import make_redis
from core.series_limit import SeriesLimit
from core.settings import Settings
from core.streams import (
    MAX_ATTRIBUTES,
    MAX_DIMENSIONS,
    Attribute,
    BatchError,
    Dimension,
    FieldName,
    IncompatibleChange,
    RecordLimits,
    StreamName,
    StreamSchema,
    StreamValidator,
    ValidatedBatch,
    split_json_array,
    split_ndjson,
)
from core.text import Name
from core.timestamps import UtcDatetime
from ingest.model import DeadLetter
from ingest.model import RecordLimits as LetterLimits
from subscriptions.models import PublisherToken, Stream
from subscriptions.streams import PUBLISHER_PREFIX, StreamService, TopicError, parse_schema
from web.deps import DbDep, IdPath, OperatorDep, SettingsDep, get_operator, web_sessions
from web.publishing import (
    PUBLISHED,
    Backpressure,
    StreamProducer,
    dead_letters_failed,
    note_clock_ahead,
    on_publishing_threads,
    publishing_executor,
    within_series_limit,
)

NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl",
                          "application/x-jsonlines", "application/jsonlines"})
NamePath = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{0,62}$", description="the stream's name")]


@asynccontextmanager
async def _producer_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Declares the built-in stream at start; the producer is made on the first publish, flushed at the end."""
    settings: Settings = app.state.settings
    with web_sessions(settings)() as session:
        StreamService(session, settings).ensure_builtin()
    app.state.stream_producer = None
    app.state.publish_executor = executor = publishing_executor(settings)
    app.state.series_limit = SeriesLimit(  # a Redis that does not answer delays a publish request briefly only
        make_redis(settings, socket_timeout=settings.publish_series_timeout_s,
                   socket_connect_timeout=settings.publish_series_timeout_s), settings)
    yield
    producer: StreamProducer | None = app.state.stream_producer
    app.state.stream_producer = None
    if producer is not None:
        await run_in_threadpool(producer.close)
    executor.shutdown(wait=False, cancel_futures=True)


router = APIRouter(prefix="/api/streams", tags=["streams"], dependencies=[Depends(get_operator)])
tokens_router = APIRouter(prefix="/api/publisher-tokens", tags=["streams"], dependencies=[Depends(get_operator)])
publish_router = APIRouter(prefix="/api/streams", tags=["publishing"], lifespan=_producer_lifespan)


class StreamIn(BaseModel):
    """A stream declaration; retention and partitions default to the deployment's settings."""

    model_config = ConfigDict(extra="forbid")

    name: StreamName
    key_field: FieldName | None = None
    time_field: FieldName | None = None
    time_format: Literal["epoch_ms", "iso8601"] | None = None
    attributes: list[Attribute] = Field(min_length=1, max_length=MAX_ATTRIBUTES)
    dimensions: list[Dimension] | None = Field(None, max_length=MAX_DIMENSIONS)
    retention_ms: int | None = None
    partitions: int | None = None


class StreamOut(BaseModel):
    name: str
    topic: str
    version: int
    schema_: StreamSchema = Field(alias="schema", serialization_alias="schema")
    created_at: UtcDatetime
    updated_at: UtcDatetime

    model_config = ConfigDict(populate_by_name=True)


class PublisherTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    streams: list[StreamName] = Field(min_length=1, max_length=100)


class PublisherTokenOut(BaseModel):
    id: int
    name: str
    prefix: str
    streams: list[str]
    created_at: UtcDatetime
    last_used_at: UtcDatetime | None


class PublisherTokenCreated(PublisherTokenOut):
    token: str = Field(description="shown once: only its SHA-256 is stored")


class RejectedOut(BaseModel):
    index: int = Field(description="the record's position in the batch (0-based; NDJSON blank lines not counted)")
    reason: str


class PublishOut(BaseModel):
    accepted: int
    rejected: list[RejectedOut]
    dead_letter_error: str | None = Field(
        None, description="present only when Kafka did not take some rejects on the dead-letter topic; the accepted "
                          "records are stored all the same: do not send the batch again")


def _out(stream: Stream) -> StreamOut:
    return StreamOut.model_validate({"name": stream.name, "topic": stream.topic, "version": stream.version,
                                     "schema": stream.schema, "created_at": stream.created_at,
                                     "updated_at": stream.updated_at})


def _token_out(row: PublisherToken) -> PublisherTokenOut:
    return PublisherTokenOut(id=row.id, name=row.name, prefix=row.prefix, streams=[s.name for s in row.streams],
                             created_at=row.created_at, last_used_at=row.last_used_at)


def _schema(data: dict, settings: Settings) -> StreamSchema:
    try:
        return parse_schema(data, settings)
    except ValidationError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, [
            {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()]) from None


def _refused(exc: IncompatibleChange) -> JSONResponse:
    return JSONResponse(status_code=status.HTTP_409_CONFLICT,
                        content={"detail": str(exc), "subscriptions": exc.subscriptions})


def _unavailable(exc: TopicError) -> HTTPException:
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc))


# -- streams (operators) ---------------------------------------------------------------------------------------------


@router.get("", response_model=list[StreamOut], response_model_by_alias=True)
def list_streams(db: DbDep, settings: SettingsDep) -> list[StreamOut]:
    return [_out(s) for s in StreamService(db, settings).streams()]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=StreamOut, response_model_by_alias=True)
def create_stream(data: StreamIn, db: DbDep, settings: SettingsDep) -> StreamOut:
    """Declare a stream and create its Kafka topic (409 if the name is taken, 503 if Kafka refuses)."""
    schema = _schema(data.model_dump(exclude_none=True), settings)
    try:
        return _out(StreamService(db, settings).create(schema))
    except TopicError as exc:
        raise _unavailable(exc) from None


@router.get("/{name}", response_model=StreamOut, response_model_by_alias=True)
def get_stream(name: NamePath, db: DbDep, settings: SettingsDep) -> StreamOut:
    return _out(StreamService(db, settings).get(name))


@router.put("/{name}", response_model=StreamOut, response_model_by_alias=True)
def update_stream(name: NamePath, data: StreamIn, db: DbDep, settings: SettingsDep) -> StreamOut | JSONResponse:
    """Replace the schema with a compatible one: 409 with the subscriptions concerned otherwise."""
    if data.name != name:
        raise HTTPException(status.HTTP_409_CONFLICT, "a stream cannot be renamed (its topic and subscriptions "
                                                      "name it)")
    service = StreamService(db, settings)
    current = service.schema_of(service.get(name))  # what the body leaves out stays as it is
    merged = {**current.model_dump(), **data.model_dump(exclude_none=True)}
    try:
        return _out(service.update(name, _schema(merged, settings)))
    except IncompatibleChange as exc:
        return _refused(exc)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, response_model=None)
def delete_stream(name: NamePath, db: DbDep, settings: SettingsDep) -> JSONResponse | None:
    """Delete a stream no subscription uses, and its topic (409 listing the subscriptions otherwise)."""
    try:
        StreamService(db, settings).delete(name)
    except IncompatibleChange as exc:
        return _refused(exc)
    except TopicError as exc:
        raise _unavailable(exc) from None
    return None


# -- publisher tokens (operators) --------------------------------------------------------------------------------


@tokens_router.get("", response_model=list[PublisherTokenOut])
def list_publisher_tokens(db: DbDep, settings: SettingsDep) -> list[PublisherTokenOut]:
    return [_token_out(t) for t in StreamService(db, settings).tokens()]


@tokens_router.post("", status_code=status.HTTP_201_CREATED, response_model=PublisherTokenCreated)
def create_publisher_token(data: PublisherTokenIn, operator: OperatorDep, db: DbDep,
                           settings: SettingsDep) -> PublisherTokenCreated:
    """A token that may publish to ``streams`` and nothing else; the token is in this answer only."""
    token, row = StreamService(db, settings).create_token(data.name, data.streams, operator)
    return PublisherTokenCreated(**_token_out(row).model_dump(), token=token)


@tokens_router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_publisher_token(token_id: IdPath, db: DbDep, settings: SettingsDep) -> None:
    StreamService(db, settings).revoke_token(token_id)


# -- publishing (publisher tokens) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Publishing:
    """The stream a request publishes to (as its row said), and the id of the publisher token it came with."""

    name: str
    topic: str
    schema: dict
    token: int
    token_name: str = ""


async def _publisher_stream(request: Request, name: NamePath) -> Publishing:
    """The stream ``name`` if the request carries a publisher token scoped to it (401/403/404 otherwise).

    Async, and no sync dependency (each would take a thread of the UI's pool): the database check runs on
    the publishing executor.
    """
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    challenge = {"WWW-Authenticate": "Bearer"}
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "publish with 'Authorization: Bearer <publisher token>'",
                            headers=challenge)
    if not token.startswith(PUBLISHER_PREFIX):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "publishing needs a publisher token (an operator makes one: "
                                                       "POST /api/publisher-tokens)")
    return await on_publishing_threads(request.app.state.publish_executor, _check_publisher,
                                       request.app.state.settings, token, name)


def _check_publisher(settings: Settings, token: str, name: str) -> Publishing:
    with web_sessions(settings)() as session:
        service = StreamService(session, settings)
        publisher = service.publisher(token)
        if publisher is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "the publisher token is not valid (revoked, or "
                                                              "mistyped)", headers={"WWW-Authenticate": "Bearer"})
        if name not in {s.name for s in publisher.streams}:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token may not publish to stream {name!r}")
        stream = service.get(name)
        return Publishing(stream.name, stream.topic, stream.schema, publisher.id, publisher.name)


@lru_cache(maxsize=256)
def _validator(schema_json: str, limits: RecordLimits) -> StreamValidator:
    """Validators are built once per schema version (their regular expression and pydantic model cost ms)."""
    return StreamValidator(StreamSchema.model_validate_json(schema_json), limits)


def _judge(body: bytes, content_type: str, stream: Publishing, settings: Settings, series: SeriesLimit
           ) -> tuple[ValidatedBatch, list[bytes]]:
    """The batch judged, and the dead letters of its rejects (CPU work: run off the event loop)."""
    most = settings.publish_max_records
    records = split_ndjson(body) if content_type in NDJSON_TYPES else split_json_array(body, most)
    if len(records) > most:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"more than {most} records; at most {most} per request")
    schema = StreamSchema.model_validate(stream.schema)
    latest_ts = int(time.time() * 1000) + settings.max_future_skew_ms  # later events: dead letters in the evaluator
    batch = _validator(schema.model_dump_json(), RecordLimits.of(settings)).validate(records, latest_ts)
    batch = within_series_limit(batch, records, schema, series, stream.token)
    limits = LetterLimits.of(settings)
    letters = [DeadLetter.of(r.reason, r.raw, f"stream {stream.name}: HTTP record {r.index}", limits).to_json()
               for r in batch.rejected]
    return batch, letters


@publish_router.post("/{name}/events", status_code=status.HTTP_202_ACCEPTED, response_model=PublishOut,
                     response_model_exclude_none=True,
                     responses={413: {"description": "more records than publish_max_records, or a larger body "
                                                     "than request_max_bytes"},
                                429: {"description": "backpressure: retry after the Retry-After header's seconds"}})
async def publish(request: Request, publishing: Annotated[Publishing, Depends(_publisher_stream)]) -> PublishOut:
    """Publish a batch of records: 202 with the count accepted and each reject's index and reason."""
    settings: Settings = request.app.state.settings
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json" and content_type not in NDJSON_TYPES:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                            "send a JSON array as application/json, or NDJSON as application/x-ndjson")
    app = request.app
    if app.state.stream_producer is None:
        app.state.stream_producer = StreamProducer(settings)
    producer: StreamProducer = app.state.stream_producer
    try:
        with producer.request(publishing.token):  # before the body is judged: a refused request costs no CPU
            return await _publish(request, settings, producer, publishing, content_type)
    except Backpressure as exc:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(exc),
                            headers={"Retry-After": str(exc.retry_after_s)}) from None


async def _publish(request: Request, settings: Settings, producer: StreamProducer, publishing: Publishing,
                   content_type: str) -> PublishOut:
    """Read, judge and produce one admitted request's batch; answer once Kafka acknowledged it."""
    stream = publishing
    executor = request.app.state.publish_executor
    loop = asyncio.get_running_loop()
    body = await request.body()
    try:
        batch, letters = await on_publishing_threads(executor, _judge, body, content_type, stream, settings,
                                                     request.app.state.series_limit)
    except BatchError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    delivery = await on_publishing_threads(executor, producer.send, loop, loop.create_future(), stream.topic,
                                           batch.keys, batch.records, settings.dead_letter_topic, letters,
                                           publishing.token)
    dead_letter_error = None
    if delivery is not None:
        await delivery.done
        if delivery.failed:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                f"Kafka did not acknowledge {delivery.failed} of {delivery.records} records "
                                f"({delivery.error}); publish the batch again (delivery is at least once)",
                                headers={"Retry-After": str(settings.publish_retry_after_s)})
        if delivery.dead_failed:  # the records are stored: a 503 would have them sent (and stored) again
            dead_letter_error = dead_letters_failed(stream.name, delivery)
        if batch.accepted:
            newest = batch.newest_ts or 0
            producer.published(stream.name, stream.topic, int(stream.schema["partitions"]), newest)
            if newest > time.time() * 1000 + settings.clock_tolerance_ms:
                await on_publishing_threads(executor, note_clock_ahead, request.app.state.series_limit.redis,
                                            settings, stream.name, token_source(stream.token, stream.token_name),
                                            newest)
    PUBLISHED.labels(stream.name, "accepted").inc(batch.accepted)
    PUBLISHED.labels(stream.name, "rejected").inc(len(batch.rejected))
    return PublishOut(accepted=batch.accepted, dead_letter_error=dead_letter_error,
                      rejected=[RejectedOut(index=r.index, reason=r.reason) for r in batch.rejected])
