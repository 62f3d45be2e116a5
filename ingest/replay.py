"""Replaying recorded events from CSV or JSON Lines files.

Every row is validated; bad rows go to the dead-letter topic with the reason and
their line number, good rows are published in file order.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path


def read_records(path: Path) -> Iterator[tuple[str, str | dict]]:
    """Yield ``(source, record)`` per data row; source is ``file:line`` for the dead letters."""
    suffix = path.suffix.lower()
    with path.open(newline="", encoding="utf-8") as handle:
        if suffix == ".csv":
            reader = csv.DictReader(handle)
            for row in reader:
                yield f"{path.name}:{reader.line_num}", {k: _csv_value(v) for k, v in row.items() if k is not None}
        elif suffix in {".jsonl", ".ndjson", ".json"}:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield f"{path.name}:{number}", line.rstrip("\n")
        else:
            raise ValueError(f"{path}: unsupported file type {suffix!r} (use .csv or .jsonl)")


def _csv_value(text: str | None) -> object:
    """CSV cells are strings; numbers become numbers so the event model can check them."""
    if text is None:
        return None
    try:
        return json.loads(text) if text.strip() and text.strip()[0] in "-0123456789" else text
    except json.JSONDecodeError:
        return text
