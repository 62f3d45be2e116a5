"""Domain errors the web layer maps to HTTP statuses (one place, see ``web.app``)."""

from __future__ import annotations


class NotFound(LookupError):
    """404: no such object, or not the caller's (the two are not told apart)."""


class Conflict(ValueError):
    """409: the request clashes with what exists (an address already registered)."""


class Forbidden(PermissionError):
    """403: authenticated, but not allowed (role, per-user limit)."""


class FieldError(ValueError):
    """422 on one field of the request body, with the same shape as pydantic's errors."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)
