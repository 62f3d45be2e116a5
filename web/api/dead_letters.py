"""Deliveries that failed for good, for operators to inspect, replay or discard."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response, status

from subscriptions.errors import NotFound
from web.deps import CeleryDep, OutboxDep, RecordsDep, get_operator

router = APIRouter(prefix="/api/dead-letters", tags=["operations"], dependencies=[Depends(get_operator)])


@router.get("")
def list_dead_letters(records: RecordsDep, limit: Annotated[int, Query(ge=1, le=5_000)] = 500) -> list[dict]:
    """Newest first: the notification, the endpoint, and the last attempt's status and error."""
    return records.dead_letters(limit)


@router.post("/replay")
def replay_all(records: RecordsDep, celery: CeleryDep, outbox: OutboxDep) -> dict:
    replayed = [letter["id"] for letter in records.dead_letters(limit=5_000)
                if records.replay(letter["id"], celery, outbox)]
    return {"replayed": replayed}


@router.post("/{letter_id}/replay")
def replay(letter_id: str, records: RecordsDep, celery: CeleryDep, outbox: OutboxDep) -> dict:
    """Deliver again with a fresh retry budget."""
    if not records.replay(letter_id, celery, outbox):
        raise NotFound(f"dead letter {letter_id} not found")
    return {"replayed": [letter_id]}


@router.delete("/{letter_id}", status_code=status.HTTP_204_NO_CONTENT)
def discard(letter_id: str, records: RecordsDep) -> Response:
    if not records.discard(letter_id):
        raise NotFound(f"dead letter {letter_id} not found")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
