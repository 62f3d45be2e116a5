"""Conditions as the subscription form shows them: checked as typed, and previewed against live data.

A preview asks the running evaluator, not a copy of the data: the request goes to
Redis (``previews``), every shard answers at its next micro-batch with the keys
that satisfy the condition at the last boundary it evaluated, with the values a
subscription of it would have there (``ShardEvaluator.preview``), and the web app gathers the
answers for up to ``preview_timeout_s``. When no shard (or not every shard)
answers, ``reason`` says why in words: the evaluator has not started, is still
starting, has been silent since a given time, or was too slow. A shard whose
preview failed answers with its error: the preview is then incomplete and says
which shards failed and why (``errors``); the evaluator's batches are not affected.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
import structlog
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from core.evaluator_status import EvaluatorStatus, evaluator_status
from core.redis_replies import text_hash
from core.redis_schema import RedisKeys
from core.settings import Settings
from core.streams import StreamSchema
from evaluator.preview import PreviewAnswer, PreviewRequest, most_extreme
from evaluator.spec import Condition
from subscriptions.language import combine_keys, explain, format_condition
from subscriptions.service import checked_condition, stream_schema

log = structlog.get_logger("web")


def describe(text: str, settings: Settings, stream: StreamSchema | None = None) -> dict[str, Any]:
    """The canonical text and a plain-words reading of a condition on ``stream`` (trades when None), and the
    keys its ``key IN`` lists; ConditionError if it is not valid."""
    filtered = checked_condition(text, settings, stream)
    condition = filtered.condition
    return {"stream": condition.stream, "canonical": format_condition(condition), "explanation": explain(condition),
            "keys": sorted(filtered.keys) if filtered.keys is not None else None}


def stream_choices(streams: list[StreamSchema]) -> list[dict[str, Any]]:
    """What the subscription form offers per stream: its attributes (with units) and dimensions, and examples
    of conditions over them."""
    return [{"name": s.name, "key_field": s.key_field,
             "attributes": [{"name": a.name, "unit": a.unit, "min": a.min, "max": a.max, "required": a.required}
                            for a in s.attributes],
             "dimensions": list(s.dimension_names), "examples": examples(s)} for s in streams]


def examples(stream: StreamSchema) -> list[str]:
    """A few conditions on ``stream`` (the placeholder and the help show them): over its first attribute, and,
    when it has dimensions, one filtered on the first."""
    first = stream.attribute_names[0]
    texts = [f"AVG({first}) OVER 5m > 100", f"MAX({first}) - MIN({first}) OVER 30m > 3%",
             f"SUM({stream.attribute_names[-1]}) OVER 1m > 1000", "COUNT(*) OVER 1m > 10"]
    if stream.dimensions:
        texts.append(f"AVG({first}) OVER 5m > 100 WHERE {stream.dimensions[0].name} = 'example'")
    return texts


def _ask_and_gather(condition: Condition, watch: list[str] | None, settings: Settings,
                    client: redis.Redis) -> dict[str, Any]:
    keys = RedisKeys(settings)
    status = evaluator_status(text_hash(client.hgetall(keys.evaluator_stats)), settings, time.time())
    shards = status.shards
    request_id = uuid.uuid4().hex
    answers_key = keys.preview_answers(request_id)
    request = PreviewRequest(condition, frozenset(watch) if watch is not None else None, time.time())
    client.hset(keys.previews, request_id, request.to_json())
    answers: dict[int, PreviewAnswer] = {}
    deadline = time.monotonic() + settings.preview_timeout_s
    try:
        while shards and len(answers) < shards:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            got = client.blpop([answers_key], timeout=max(min(left, 1.0), 0.01))
            if not got:
                continue
            try:
                answer = PreviewAnswer.from_json(got[1])
            except (ValueError, KeyError, TypeError) as exc:  # one unreadable answer must not cost the others
                log.warning("malformed_preview_answer_skipped", request_id=request_id,
                            reason=f"{type(exc).__name__}: {exc}")
                continue
            answers[answer.shard] = answer
    finally:
        client.hdel(keys.previews, request_id)
        client.delete(answers_key)
    matches = most_extreme((m for a in answers.values() for m in a.matches), condition)
    evaluated = [a.evaluated_at for a in answers.values() if a.evaluated_at]
    errors = [{"shard": a.shard, "error": a.error} for _, a in sorted(answers.items()) if a.error is not None]
    return {
        "reason": _reason(status, shards, len(answers), settings, errors),
        "evaluator": status.state,
        "shards": shards,
        "answered": len(answers),
        "complete": bool(shards) and len(answers) == shards and not errors,
        "errors": errors,
        "evaluated_at": min(evaluated) if evaluated else None,
        "total": len(matches) if condition.rank is not None else sum(a.total for a in answers.values()),
        "watched": sum(a.watched for a in answers.values()),
        "matches": [{"key": k, "value": v} for k, v in matches],
    }


def _reason(status: EvaluatorStatus, shards: int, answered: int, settings: Settings,
            errors: list[dict[str, Any]]) -> str | None:
    """Why fewer than every shard answered, or some answered with an error, in words (None when all answered)."""
    if errors:
        failed = "; ".join(f"shard {e['shard']}: {e['error']}" for e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        return f"{len(errors)} of {shards} evaluator shards could not compute the preview: {failed}{more}"
    if shards and answered == shards:
        return None
    if not status.ready:
        return status.reason if not answered else f"only {answered} of {shards} shards answered: {status.reason}"
    return (f"only {answered} of {shards} evaluator shards answered within {settings.preview_timeout_s:g} s "
            f"(the evaluator is behind: its last batch ended {status.last_batch_age_s or 0:.0f} s ago)")


def preview_schema(session: Session, settings: Settings, stream: str) -> StreamSchema:
    """The schema a preview is over, and the session's database connection back to the pool: the wait for the
    evaluator's answers (up to ``preview_timeout_s``) needs none (FieldError if there is no such stream)."""
    try:
        return stream_schema(session, settings, stream)
    finally:
        session.close()


async def preview_matches(text: str, watch: list[str] | None, settings: Settings,
                          client: redis.Redis, stream: StreamSchema | None = None) -> dict[str, Any]:
    """Which keys of ``stream`` (trades when None) satisfy ``text`` now, among ``watch`` and the condition's
    ``key IN`` (the keys in both, as a subscription would watch); ConditionError if it is not valid."""
    filtered = checked_condition(text, settings, stream)
    keys = combine_keys(watch, filtered.keys, filtered.condition.key_prefix)
    result = await run_in_threadpool(_ask_and_gather, filtered.condition, keys, settings, client)
    return {"condition": format_condition(filtered.condition), "stream": filtered.condition.stream, **result}
