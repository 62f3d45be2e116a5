"""Conditions: the streams they may be over, validation as typed, and a preview of the keys that would match now."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from core.stream_names import TRADES
from core.streams import StreamName
from ingest.model import Key
from subscriptions.service import stream_schema
from subscriptions.streams import StreamService
from web.conditions import describe, preview_matches, preview_schema, stream_choices
from web.deps import DbDep, RedisDep, SettingsDep, UserDep
from web.limits import LimiterDep, limit_previews

router = APIRouter(prefix="/api/conditions", tags=["subscriptions"])


class ConditionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stream: StreamName = Field(TRADES, description="the stream the condition is over; trades when omitted")
    condition: str = Field(min_length=1, max_length=500, examples=["MAX(price) - MIN(price) OVER 30m > 3%"])
    keys: list[Key] | None = Field(None, min_length=1, max_length=10_000, description="null: every key")


@router.get("/streams")
def condition_streams(db: DbDep, settings: SettingsDep, _user: UserDep) -> list[dict[str, Any]]:
    """The streams a subscription may name, with the attributes its condition may aggregate and the dimensions
    its WHERE clause may filter on (and example conditions)."""
    streams = StreamService(db, settings)
    return stream_choices([streams.schema_of(s) for s in streams.streams()])


@router.post("/check")
def check_condition(data: ConditionIn, db: DbDep, settings: SettingsDep, _user: UserDep) -> dict:
    """The canonical text and a plain-words reading, or a 422 naming the problem and its column (or an
    unknown stream)."""
    return describe(data.condition, settings, stream_schema(db, settings, data.stream))


@router.post("/preview")
async def preview_condition(data: ConditionIn, request: Request, db: DbDep, settings: SettingsDep,
                            redis_client: RedisDep, user: UserDep, limiter: LimiterDep) -> dict:
    """Keys whose window satisfies the condition at the evaluator's last boundary, asked of every shard.

    ``complete`` is false when some shard did not answer within ``preview_timeout_s``
    (the evaluator is down or behind); ``matches`` lists the most extreme values first.
    """
    schema = await run_in_threadpool(preview_schema, db, settings, data.stream)  # the database, off the loop
    await run_in_threadpool(limit_previews, limiter, request, user.id)  # Redis, off the event loop
    return await preview_matches(data.condition, data.keys, settings, redis_client, schema)
