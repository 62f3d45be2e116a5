"""How many examples a property test draws: all it asks for in CI (``CI`` set, as infra/test's CI mode), a third
(at least 10) in a developer's run, where the heaviest properties took ~4 of the default run's 14 minutes."""

from __future__ import annotations

import os

FULL = bool(os.environ.get("CI"))


def examples(n: int) -> int:
    return n if FULL else max(n // 3, 10)
