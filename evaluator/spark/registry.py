"""The stream registry as the evaluator's driver reads it: every declared stream's schema, from Redis.

Written by ``subscriptions.streams.publish_registry`` (a hash name -> ``StreamSchema`` JSON, rewritten
with a version counter in one transaction). :func:`decode_registry` is pure; :class:`RegistryReader`
reads the hash only when the version moved. ``trades`` is always there: a deployment whose web
app has not published yet (or a Redis that lost the registry) still evaluates it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from pydantic import ValidationError
from redis import Redis, RedisError

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamSchema, trades_schema
from evaluator.streams import StreamShape

log = structlog.get_logger("evaluator")


def text_of(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def decode_registry(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> tuple[dict[str, StreamSchema], dict[str, str]]:
    """The registry hash (name -> schema JSON) as schemas by name, and the reason for each entry it could not read."""
    schemas: dict[str, StreamSchema] = {}
    problems: dict[str, str] = {}
    for name, payload in raw.items():
        stream = text_of(name)
        try:
            schema = StreamSchema.model_validate_json(payload)
        except (ValidationError, ValueError) as exc:
            problems[stream] = f"unreadable schema: {str(exc)[:300]}"
            continue
        if schema.name != stream:
            problems[stream] = f"the schema under {stream!r} names the stream {schema.name!r}"
            continue
        schemas[stream] = schema
    return schemas, problems


def checkpoint_of(settings: Settings, stream: str) -> Path:
    """A stream's query's checkpoint: ``trades`` keeps today's, every other stream one under ``streams/<name>``."""
    return settings.checkpoint_path if stream == TRADES else settings.checkpoint_path / "streams" / stream


INCARNATION = "incarnation"  # a file in a declared stream's checkpoint: the id of the streams row it belongs to


def claim_checkpoint(settings: Settings, stream: str, incarnation: int | None) -> bool:
    """Make ``stream``'s checkpoint the one of this declaration (``incarnation``: its row's id in the registry).

    A stream deleted and declared again under its name is a new stream on a new topic: the old checkpoint's
    offsets, windows and attribute columns are not its own (its query failed on offsets past the new topic's
    end, or evaluated nothing). A checkpoint recorded for another id is removed, so the query starts clean; one
    with no record (written before ids were published) is kept and claimed; None (an old registry) leaves it be.
    True when an old checkpoint was removed.
    """
    if incarnation is None or stream == TRADES:
        return False
    checkpoint = checkpoint_of(settings, stream)
    marker = checkpoint / INCARNATION
    held = marker.read_text().strip() if marker.exists() else None
    if held == str(incarnation):
        return False
    if held is not None:  # the predecessor's topic and records are gone with it: so is its checkpoint
        log.info("stream_checkpoint_reset", stream=stream, incarnation=incarnation, previous=held,
                 reason="the stream was deleted and declared again")
        shutil.rmtree(checkpoint)
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(incarnation))
    return held is not None


def checkpoint_identity(settings: Settings, stream: str) -> str:
    """The checkpoint's path and the declaration it belongs to: what executors key their shard copies by, so a
    stream declared again never reuses a copy of its predecessor's shards."""
    checkpoint = checkpoint_of(settings, stream)
    marker = checkpoint / INCARNATION
    return f"{checkpoint}#{marker.read_text().strip()}" if marker.exists() else str(checkpoint)


def checkpoint_partitions(checkpoint: Path) -> int | None:
    """The shuffle partitions (so the shards) a query's checkpoint was started with, from its newest offset log
    entry (Spark records its session's ``spark.sql.shuffle.partitions`` there and runs the stateful stage with it
    on every restart, whatever the session says); None for a new checkpoint."""
    offsets = checkpoint / "offsets"
    entries = sorted((int(f.name), f) for f in offsets.iterdir() if f.name.isdigit()) if offsets.is_dir() else []
    for _, entry in reversed(entries):
        for line in entry.read_text(errors="replace").splitlines():
            try:
                metadata = json.loads(line)
            except ValueError:
                continue
            if isinstance(metadata, dict) and "spark.sql.shuffle.partitions" in metadata.get("conf", {}):
                return int(metadata["conf"]["spark.sql.shuffle.partitions"])
    return None


def query_attributes(settings: Settings, schema: StreamSchema) -> tuple[str, ...]:
    """The attribute columns of a stream's query: those its checkpoint's state was built with, then the schema's
    new ones. A removed attribute keeps its column (always empty from then on), so state never has to shrink and
    every compatible change keeps the stream's windows. Recorded beside the checkpoint."""
    record = checkpoint_of(settings, schema.name) / "attributes.json"
    before: list[str] = json.loads(record.read_text()) if record.exists() else []
    columns = (*before, *(a for a in schema.attribute_names if a not in before))
    if list(columns) != before:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(list(columns)))
    return columns


def shape_of(schema: StreamSchema) -> StreamShape:
    return StreamShape.of(schema)


@dataclass
class RegistryReader:
    """Reads the registry when its version moved; keeps the last one read while Redis does not answer."""

    redis: Redis
    keys: RedisKeys
    settings: Settings
    version: int | None = None
    schemas: dict[str, StreamSchema] | None = None
    ids: dict[str, int] | None = None  # each stream's row id (None from a registry that had none)

    def read(self) -> dict[str, StreamSchema]:
        """Every declared stream's schema (``trades`` always)."""
        try:
            raw_version = self.redis.get(self.keys.streams_version)
            version = int(raw_version) if raw_version is not None else 0
            if version != self.version or self.schemas is None:
                schemas, problems = decode_registry(self.redis.hgetall(self.keys.stream_schemas))  # type: ignore[arg-type]
                for stream, problem in problems.items():
                    log.warning("stream_schema_unreadable", stream=stream, problem=problem)
                ids = {text_of(name): int(value) for name, value in self.redis.hgetall(self.keys.stream_ids).items()}
                self.version, self.schemas, self.ids = version, schemas, ids
        except RedisError as exc:
            log.warning("stream_registry_unreadable", reason=f"{type(exc).__name__}: {exc}")
        schemas = dict(self.schemas or {})
        schemas.setdefault(TRADES, trades_schema(self.settings))
        return schemas

    def incarnation(self, stream: str) -> int | None:
        """The id of ``stream``'s declaration, as last read (None if the registry did not say)."""
        return (self.ids or {}).get(stream)
