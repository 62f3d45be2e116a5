"""One form for every date and time the API shows: ISO 8601 in UTC, ending in ``Z``.

SQLite hands datetimes back naive (Tocsin stores every time in UTC), PostgreSQL and freshly made rows aware, so
a resource's ``created_at`` carried a ``Z`` right after it was created and none once read back. Every datetime
field of an API model is a :data:`UtcDatetime`: naive means UTC, any other offset is converted, and the JSON
form is always ``2026-01-02T03:04:05.678901Z``. A client's input without an offset is read as UTC too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, PlainSerializer


def as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive one (SQLite's) was stored in UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def utc_text(moment: datetime) -> str:
    return as_utc(moment).isoformat().replace("+00:00", "Z")


UtcDatetime = Annotated[datetime, AfterValidator(as_utc), PlainSerializer(utc_text, return_type=str, when_used="json")]
