"""Conditions: validation as typed, and a preview of the keys that would match now."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from ingest.model import Key
from web.conditions import describe, preview_matches
from web.deps import RedisDep, SettingsDep, UserDep
from web.limits import LimiterDep, limit_previews

router = APIRouter(prefix="/api/conditions", tags=["subscriptions"])


class ConditionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    condition: str = Field(min_length=1, max_length=500, examples=["MAX(price) - MIN(price) OVER 30m > 3%"])
    keys: list[Key] | None = Field(None, min_length=1, max_length=10_000, description="null: every key")


@router.post("/check")
def check_condition(data: ConditionIn, settings: SettingsDep, _user: UserDep) -> dict:
    """The canonical text and a plain-words reading, or a 422 naming the problem and its column."""
    return describe(data.condition, settings)


@router.post("/preview")
async def preview_condition(data: ConditionIn, request: Request, settings: SettingsDep, redis_client: RedisDep,
                            user: UserDep, limiter: LimiterDep) -> dict:
    """Keys whose window satisfies the condition at the evaluator's last boundary, asked of every shard.

    ``complete`` is false when some shard did not answer within ``preview_timeout_s``
    (the evaluator is down or behind); ``matches`` lists the most extreme values first.
    """
    await run_in_threadpool(limit_previews, limiter, request, user.id)  # Redis, off the event loop
    return await preview_matches(data.condition, data.keys, settings, redis_client)
