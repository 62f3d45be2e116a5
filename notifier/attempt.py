"""The outcome of one delivery attempt, whatever the channel."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attempt:
    ok: bool
    retryable: bool  # worth trying again later (network trouble, overload, a transient refusal)
    latency_ms: float
    status_code: int | None = None  # HTTP status or SMTP reply code
    error: str | None = None
    retry_after_s: float | None = None  # the receiver's own request, if it made one

    def detail(self) -> dict:
        return {"status_code": self.status_code, "latency_ms": round(self.latency_ms, 1), "error": self.error}
