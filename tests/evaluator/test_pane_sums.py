"""A pane's sum, as the Spark parser computes it (no Spark needed), is as accurate as ``math.fsum``.

Window sums are exact sums of pane sums, so a pane's own sum bounds their precision.
"""

from __future__ import annotations

import math
import random

from core.settings import Settings
from evaluator.spark.parse import PaneParser
from ingest.model import ATTRIBUTES

PANE_VALUES = {
    "large-then-small": [1e15] + [0.06] * 200_000,  # a plain running sum is 1.2e-11 off
    "log-uniform": [10 ** random.Random(11).uniform(-3, 15) for _ in range(5_000)],
}


def test_pane_sums_match_fsum() -> None:
    settings = Settings()
    parser = PaneParser(settings, (0,))
    for key, values in PANE_VALUES.items():  # one pane per key: every event in the same pane
        events = [(key, 10 * settings.pane_ms, *(v for _ in ATTRIBUTES)) for v in values]
        frame = parser._frame(events, {}).to_pandas()
        row = frame[frame["key"] == key].iloc[0]
        for a in ATTRIBUTES:
            want = math.fsum(values)
            assert abs(row[f"sum_{a}"] - want) <= 1e-12 * want, (key, a)
