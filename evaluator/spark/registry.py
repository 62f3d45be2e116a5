"""The stream registry as the evaluator's driver reads it: every declared stream's schema, from Redis.

Written by ``subscriptions.streams.publish_registry`` (a hash name -> ``StreamSchema`` JSON, rewritten
with a version counter in one transaction). :func:`decode_registry` is pure; :class:`RegistryReader`
reads the hash only when the version moved. ``trades`` is always there: a deployment whose web
app has not published yet (or a Redis that lost the registry) still evaluates it.

Each stream's query has a checkpoint of its own (:func:`checkpoint_of`); what the driver reads and writes
beside Spark's files there (the declaration it belongs to, its attribute columns, the shuffle partitions of
its offset log) goes through Hadoop's FileSystem (``evaluator.spark.checkpoint_fs``), as Spark's own writes do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog
from pydantic import ValidationError
from pyspark.sql import SparkSession
from redis import Redis, RedisError

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamSchema, trades_schema
from evaluator.spark.checkpoint_fs import CheckpointFiles, child
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


def checkpoint_of(settings: Settings, stream: str) -> str:
    """A stream's query's checkpoint: ``trades`` keeps today's, every other stream one under ``streams/<name>``."""
    root = settings.checkpoint_location
    return root if stream == TRADES else child(root, STREAMS, stream)


STREAMS = "streams"  # the directory of the declared streams' checkpoints, under the evaluator's
INCARNATION = "incarnation"  # a file in a declared stream's checkpoint: the id of the streams row it belongs to
ATTRIBUTES = "attributes.json"  # a file in a declared stream's checkpoint: its query's attribute columns


def stream_checkpoint(spark: SparkSession, settings: Settings, stream: str) -> CheckpointFiles:
    return CheckpointFiles(spark, checkpoint_of(settings, stream))


def claim_checkpoint(spark: SparkSession, settings: Settings, stream: str, incarnation: int | None) -> bool:
    """Make ``stream``'s checkpoint the one of this declaration (``incarnation``: its row's id in the registry).

    A stream deleted and declared again under its name is a new stream on a new topic: the old checkpoint's
    offsets, windows and attribute columns are not its own (its query failed on offsets past the new topic's
    end, or evaluated nothing). A checkpoint recorded for another id is removed, so the query starts clean; one
    with no record (written before ids were published) is kept and claimed; None (an old registry) leaves it be.
    True when an old checkpoint was removed.
    """
    if incarnation is None or stream == TRADES:
        return False
    files = stream_checkpoint(spark, settings, stream)
    marker = files.read_text(INCARNATION)
    held = marker.strip() if marker is not None else None
    if held == str(incarnation):
        return False
    if held is not None:  # the predecessor's topic and records are gone with it: so is its checkpoint
        log.info("stream_checkpoint_reset", stream=stream, incarnation=incarnation, previous=held,
                 reason="the stream was deleted and declared again")
        files.delete()
    files.write_text(INCARNATION, str(incarnation))
    return held is not None


def checkpoint_identity(files: CheckpointFiles) -> str:
    """The checkpoint's location and the declaration it belongs to: what executors key their shard copies by, so a
    stream declared again never reuses a copy of its predecessor's shards."""
    marker = files.read_text(INCARNATION)
    return f"{files.location}#{marker.strip()}" if marker is not None else files.location


def checkpoint_partitions(files: CheckpointFiles) -> int | None:
    """The shuffle partitions (so the shards) a query's checkpoint was started with, from its newest offset log
    entry (Spark records its session's ``spark.sql.shuffle.partitions`` there and runs the stateful stage with it
    on every restart, whatever the session says); None for a new checkpoint."""
    for batch in sorted((int(n) for n in files.names("offsets") if n.isdigit()), reverse=True):
        for line in (files.read_text(f"offsets/{batch}") or "").splitlines():
            try:
                metadata = json.loads(line)
            except ValueError:
                continue
            if isinstance(metadata, dict) and "spark.sql.shuffle.partitions" in metadata.get("conf", {}):
                return int(metadata["conf"]["spark.sql.shuffle.partitions"])
    return None


def attribute_columns(before: Sequence[str], schema: StreamSchema) -> tuple[str, ...]:
    """The columns a query's state was built with (``before``), then the schema's new attributes. A removed
    attribute keeps its column (always empty from then on), so state never has to shrink and every compatible
    change keeps the stream's windows."""
    return (*before, *(a for a in schema.attribute_names if a not in before))


def query_attributes(files: CheckpointFiles, schema: StreamSchema) -> tuple[str, ...]:
    """The attribute columns of a stream's query (:func:`attribute_columns`), recorded beside its checkpoint."""
    record = files.read_text(ATTRIBUTES)
    before: list[str] = json.loads(record) if record is not None else []
    columns = attribute_columns(before, schema)
    if list(columns) != before:
        files.write_text(ATTRIBUTES, json.dumps(list(columns)))
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
