"""How long a wait for a condition may take: every deadline a test or a local tool waits on, scaled by one factor.

Tests never depend on the machine being fast: each waits on a condition polled until a generous deadline, sized
for a 2-core machine with another CPU-heavy job beside it. ``TOCSIN_TEST_PATIENCE`` (a factor, default 1) scales
them all, and pytest-timeout's limit per test with them, for a slower machine or a busier CI.
"""

from __future__ import annotations

import os
import time

ENV = "TOCSIN_TEST_PATIENCE"


def patience() -> float:
    """The factor, read at each call so that a test may set it; a value that is not a positive number is refused."""
    raw = os.environ.get(ENV, "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor > 0:
        raise ValueError(f"{ENV} must be a positive number (a factor for every wait's deadline), not {raw!r}")
    return factor


def patient(seconds: float) -> float:
    """``seconds`` scaled by the patience factor."""
    return seconds * patience()


def deadline(seconds: float) -> float:
    """The ``time.monotonic()`` by which a wait of ``seconds`` (scaled) gives up."""
    return time.monotonic() + patient(seconds)
