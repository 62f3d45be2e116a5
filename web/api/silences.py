"""Silences: hold back notifications of the caller's alerts that match, for a while (``subscriptions.silences``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from subscriptions.silences import SilenceIn, SilenceOut, SilenceService, SilenceState
from web.deps import DbDep, IdPath, SettingsDep, UserDep

router = APIRouter(prefix="/api/silences", tags=["silences"])


def get_silences(session: DbDep, settings: SettingsDep, user: UserDep) -> SilenceService:
    return SilenceService(session, settings, user)


SilencesDep = Annotated[SilenceService, Depends(get_silences)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SilenceOut)
def create_silence(data: SilenceIn, silences: SilencesDep) -> SilenceOut:
    """Matching alerts of your subscriptions are not notified from ``starts_at`` (default now) until its end;
    each is logged in the subscription's delivery log as ``suppressed``, ``silenced by #<id>``."""
    return SilenceOut.of(silences.create(data))


@router.get("", response_model=list[SilenceOut])
def list_silences(silences: SilencesDep, state: SilenceState | None = None,
                  limit: Annotated[int, Query(ge=1, le=1_000)] = 200) -> list[SilenceOut]:
    """Your silences, newest first, optionally only the pending, active or expired ones."""
    return [SilenceOut.of(s) for s in silences.list(state, limit)]


@router.get("/{silence_id}", response_model=SilenceOut)
def get_silence(silence_id: IdPath, silences: SilencesDep) -> SilenceOut:
    return SilenceOut.of(silences.get(silence_id))


@router.post("/{silence_id}/expire", response_model=SilenceOut)
def expire_silence(silence_id: IdPath, silences: SilencesDep) -> SilenceOut:
    """End the silence now (idempotent: an expired one is returned unchanged)."""
    return SilenceOut.of(silences.expire(silence_id))
