"""Backtest jobs: a condition over a time range of a stream's history, asked by an account, run by a worker.

The web app admits a job (:meth:`BacktestJobs.submit`) and queues it on the ``backtests`` lane; a
worker of that lane runs it (``notifier.backtests``), reporting progress after every chunk and
stopping at the next chunk once cancelled. The job lives in Redis, in its owner's slot, and is
kept ``backtest_keep_s`` after it ends.

States: ``queued`` → ``running`` → ``done`` | ``failed`` | ``cancelled``; a queued job the lane did
not start within ``backtest_queue_timeout_s`` ends ``expired``; a running job silent for
``backtest_stale_s`` (its worker died) is ``failed`` when next looked at. An account may have
``backtest_max_active`` jobs queued or running: one more is refused (409), never queued behind.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis.typing import EncodableT
from sqlalchemy.orm import Session

from core.redis_schema import RedisKeys
from core.settings import Settings
from core.stream_names import TRADES
from core.streams import StreamName, StreamSchema
from core.timestamps import UtcDatetime
from ingest.model import Key
from subscriptions.errors import Conflict, FieldError, NotFound
from subscriptions.language import ConditionError, combine_keys, format_condition
from subscriptions.models import User
from subscriptions.policy import AlertPolicy
from subscriptions.schemas import Id
from subscriptions.service import SubscriptionService, checked_condition, stream_schema
from subscriptions.streams import stream_of

State = Literal["queued", "running", "done", "failed", "cancelled", "expired"]
ACTIVE: tuple[State, ...] = ("queued", "running")


class BacktestRequest(BaseModel):
    """What a worker is asked to run (the condition already checked against the stream's schema)."""

    model_config = ConfigDict(extra="forbid")

    stream_schema: StreamSchema  # as declared when asked: the worker judges records by it (and its name is the stream)
    condition: str  # canonical text, for the result's heading
    condition_spec: dict[str, Any]  # evaluator.spec.Condition.to_dict()
    keys: list[str] | None = None
    start_ms: int = Field(ge=0)
    end_ms: int = Field(ge=0)
    subscription_id: int = 0  # a saved subscription's: the transitions carry the live alert ids
    policy: AlertPolicy = Field(default_factory=AlertPolicy)

    @model_validator(mode="before")
    @classmethod
    def _without_stream(cls, data: Any) -> Any:
        """A job queued before the stream's name was read from its schema carried it beside (the same name)."""
        if isinstance(data, dict) and "stream" in data:
            data = {k: v for k, v in data.items() if k != "stream"}
        return data

    @property
    def stream(self) -> str:
        return self.stream_schema.name


class BacktestIn(BaseModel):
    """What the API takes: a saved subscription, or a condition on a stream; and the time range."""

    model_config = ConfigDict(extra="forbid")

    subscription_id: Id | None = Field(None, description="a saved subscription (its condition, keys and policy, and "
                                                         "its id in the alert ids); or give stream and condition")
    stream: StreamName = Field(TRADES, description="the stream the condition is over; trades when omitted")
    condition: str | None = Field(None, min_length=1, max_length=500, examples=["SUM(volume) OVER 5m > 2e6"])
    keys: list[Key] | None = Field(None, min_length=1, max_length=10_000, description="null: every key")
    start: UtcDatetime = Field(description="the range's start (within the stream's retention)")
    end: UtcDatetime | None = Field(None, description="the range's end; now when omitted")
    policy: AlertPolicy | None = Field(None, description="the alert policy applied to the transitions (cool-down, "
                                                         "send-resolved); the subscription's or the default")


class BacktestStatus(BaseModel):
    """Where a job stands, as the API shows it."""

    id: str
    state: State
    request: BacktestRequest
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    records_read: int = 0
    records_total: int | None = None
    evaluated_to: int | None = None  # the last boundary evaluated (epoch ms)
    error: str | None = None
    result: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


#: Admit a job unless its account has its maximum active: KEYS active set, job hash; ARGV max, id, keep_s,
#: request, now. Both keys are in the owner's slot.
_ADMIT = """
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'state', 'queued', 'request', ARGV[4], 'created_at', ARGV[5], 'beat', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""

_FIELDS = ("state", "request", "created_at", "started_at", "finished_at", "records_read", "records_total",
           "evaluated_to", "error", "result", "beat", "cancel")


class BacktestJobs:
    """The jobs of every account, in Redis."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.keys = RedisKeys(settings)
        self._admit = client.register_script(_ADMIT)

    # -- the web app's side ----------------------------------------------------------------------------------------

    def submit(self, owner_id: int, request: BacktestRequest) -> BacktestStatus:
        """Admit a job (Conflict if the account has ``backtest_max_active`` active already); the caller queues it."""
        job_id = uuid.uuid4().hex
        active, job = self.keys.backtests_active(owner_id), self.keys.backtest(owner_id, job_id)
        now = time.time()
        for other in self.redis.smembers(active):  # give up the places of jobs lost, expired or forgotten
            other_id = other.decode() if isinstance(other, bytes) else other
            self._settled(owner_id, other_id, self._read(owner_id, other_id))
        admitted = self._admit(keys=[active, job], args=[
            self.settings.backtest_max_active, job_id, self.settings.backtest_keep_s, request.model_dump_json(), now])
        if not admitted:
            raise Conflict(f"this account already has {self.settings.backtest_max_active} backtest(s) queued or "
                           "running; wait for one to end or cancel it")
        return BacktestStatus(id=job_id, state="queued", request=request, created_at=now)

    def get(self, owner_id: int, job_id: str) -> BacktestStatus:
        """The job (NotFound if it is not this account's, or no longer kept); a lost one is marked so first."""
        data = self._settled(owner_id, job_id, self._read(owner_id, job_id))
        if data is None:
            raise NotFound(f"no backtest {job_id}")
        return _status(job_id, data)

    def cancel(self, owner_id: int, job_id: str) -> BacktestStatus:
        """Stop the job: a queued one at once, a running one at its next chunk (its state says when)."""
        status = self.get(owner_id, job_id)
        if status.state == "queued":
            self._end(owner_id, job_id, "cancelled")
        elif status.state == "running":
            self.redis.hset(self.keys.backtest(owner_id, job_id), "cancel", 1)
        return self.get(owner_id, job_id)

    # -- the worker's side -----------------------------------------------------------------------------------------

    def claim(self, owner_id: int, job_id: str) -> BacktestRequest | None:
        """Start the job if it is still queued and not expired (None: nothing to run)."""
        key = self.keys.backtest(owner_id, job_id)
        data = self._read(owner_id, job_id)
        if data is None or data["state"] != "queued":
            return None
        if time.time() - float(data["created_at"]) > self.settings.backtest_queue_timeout_s:
            self._end(owner_id, job_id, "expired", error=f"not started within {self.settings.backtest_queue_timeout_s:g}"
                                                         " s of being queued (the backtest lane was busy or down)")
            return None
        now = time.time()
        self.redis.hset(key, mapping={"state": "running", "started_at": now, "beat": now})
        return BacktestRequest.model_validate_json(data["request"])

    def progress(self, owner_id: int, job_id: str, read: int, total: int, evaluated_to: int | None) -> bool:
        """Record progress; whether the job is to go on (False once cancelled)."""
        key = self.keys.backtest(owner_id, job_id)
        mapping: dict[EncodableT, EncodableT] = {"records_read": read, "records_total": total, "beat": time.time()}
        if evaluated_to is not None:
            mapping["evaluated_to"] = evaluated_to
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=mapping)
        pipe.hget(key, "cancel")
        return not pipe.execute()[1]

    def finish(self, owner_id: int, job_id: str, result: dict[str, Any]) -> None:
        self._end(owner_id, job_id, "done", result=result)

    def fail(self, owner_id: int, job_id: str, error: str) -> None:
        self._end(owner_id, job_id, "failed", error=error)

    def cancelled(self, owner_id: int, job_id: str) -> None:
        self._end(owner_id, job_id, "cancelled")

    # -- both ------------------------------------------------------------------------------------------------------

    def _end(self, owner_id: int, job_id: str, state: State, *, error: str | None = None,
             result: dict[str, Any] | None = None) -> None:
        key = self.keys.backtest(owner_id, job_id)
        mapping: dict[EncodableT, EncodableT] = {"state": state, "finished_at": time.time()}
        if error is not None:
            mapping["error"] = error
        if result is not None:
            mapping["result"] = json.dumps(result, separators=(",", ":"))
        pipe = self.redis.pipeline(transaction=False)  # the state first: a place not yet given back is freed when read
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, self.settings.backtest_keep_s)
        pipe.srem(self.keys.backtests_active(owner_id), job_id)
        pipe.execute()

    def _read(self, owner_id: int, job_id: str) -> dict[str, str] | None:
        values = self.redis.hmget(self.keys.backtest(owner_id, job_id), _FIELDS)
        data = {f: (v.decode() if isinstance(v, bytes) else v) for f, v in zip(_FIELDS, values, strict=True)
                if v is not None}
        return data if "state" in data else None

    def _settled(self, owner_id: int, job_id: str, data: dict[str, str] | None) -> dict[str, str] | None:
        """The job as read (``data``), after a lost, expired or forgotten one gave up its account's place (then read
        again: only a job that just ended is read twice)."""
        if data is None:
            self.redis.srem(self.keys.backtests_active(owner_id), job_id)
            return None
        if data["state"] not in ACTIVE:
            return data
        now = time.time()
        if data["state"] == "queued" and now - float(data["created_at"]) > self.settings.backtest_queue_timeout_s:
            self._end(owner_id, job_id, "expired", error="not started in time (the backtest lane was busy or down)")
        elif data["state"] == "running" and now - float(data.get("beat", data["created_at"])) > \
                self.settings.backtest_stale_s:
            self._end(owner_id, job_id, "failed", error=f"no progress for {self.settings.backtest_stale_s:g} s: "
                                                        "its worker was lost")
        else:
            return data
        return self._read(owner_id, job_id)


def _status(job_id: str, data: dict[str, str]) -> BacktestStatus:
    def number(name: str) -> float | None:
        return float(data[name]) if name in data else None

    def integer(name: str) -> int | None:
        return int(float(data[name])) if name in data else None

    return BacktestStatus(
        id=job_id, state=data["state"], request=BacktestRequest.model_validate_json(data["request"]),
        created_at=float(data["created_at"]), started_at=number("started_at"), finished_at=number("finished_at"),
        records_read=integer("records_read") or 0, records_total=integer("records_total"),
        evaluated_to=integer("evaluated_to"), error=data.get("error"),
        result=json.loads(data["result"]) if "result" in data else None,
    )


def backtest_request(session: Session, settings: Settings, client: redis.Redis, owner: User, data: BacktestIn,
                     now: float) -> BacktestRequest:
    """The job ``data`` asks for, checked: the condition against the stream's schema, the range against its
    retention and ``backtest_max_range_ms`` (FieldError on the field at fault)."""
    policy = data.policy
    if data.subscription_id is not None:
        subscription = SubscriptionService(session, settings, client, owner).get(data.subscription_id)
        stream, text, keys = stream_of(subscription), subscription.condition, subscription.keys
        policy = policy or AlertPolicy.model_validate(subscription.policy or {})
    elif data.condition is None:
        raise FieldError("condition", "give a condition (or a saved subscription's subscription_id)")
    else:
        stream, text, keys = data.stream, data.condition, data.keys
    schema = stream_schema(session, settings, stream)
    try:
        filtered = checked_condition(text, settings, schema)
        keys = combine_keys(keys, filtered.keys, filtered.condition.key_prefix)
    except ConditionError as exc:
        raise FieldError("condition", str(exc)) from None
    start_ms, end_ms = int(data.start.timestamp() * 1000), int((data.end.timestamp() if data.end else now) * 1000)
    now_ms = int(now * 1000)
    if end_ms > now_ms:
        raise FieldError("end", "the range must end by now: a backtest reads history")
    if start_ms >= end_ms:
        raise FieldError("start", "the range must start before it ends")
    oldest = now_ms - schema.retention_ms
    if start_ms < oldest:
        raise FieldError("start", f"stream {stream!r} keeps {schema.retention_ms / 3_600_000:g} h of history "
                                  f"(retention): start at {oldest} ms or later")
    if end_ms - start_ms > settings.backtest_max_range_ms:
        raise FieldError("end", f"a backtest covers at most {settings.backtest_max_range_ms / 3_600_000:g} h "
                                "(TOCSIN_BACKTEST_MAX_RANGE_MS)")
    return BacktestRequest(stream_schema=schema, condition=format_condition(filtered.condition),
                           condition_spec=filtered.condition.to_dict(), keys=keys, start_ms=start_ms,
                           end_ms=end_ms, subscription_id=data.subscription_id or 0, policy=policy or AlertPolicy())
