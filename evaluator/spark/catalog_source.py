"""Reading what the web app asks of the evaluator, inside Spark's Python workers.

The subscription catalog: at most every ``refresh_s`` one round trip reads the newest
version and the changes after the one held, which are applied in time proportional to
them (``Catalog.applied``); the whole snapshot is read only by a new reader, one the
change log no longer reaches back to, or when the version went backwards (Redis lost
its data and was republished). Edits take effect within one trigger without
restarting the query and without a Redis round trip per key. Condition previews:
one-off questions every shard answers once (see ``web.conditions``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import structlog

from core.catalog_log import CatalogLog
from core.evaluator_status import CATALOG_STUCK, CATALOG_STUCK_SINCE
from core.redis_client import make_redis
from core.redis_outage import Outage
from core.redis_schema import RedisKeys
from core.series_limit import SeriesLimit
from core.settings import Settings
from core.stream_names import TRADES
from evaluator.catalog import UNREADABLE, Catalog
from evaluator.preview import PreviewRequest
from evaluator.streams import StreamCatalogs, StreamShape

log = structlog.get_logger("evaluator")
_UNREPORTED = object()  # a new worker writes its first view (a restarted job may have left a mark)
#: How often a stuck worker rewrites its mark (with ``seen_at``): another worker's clearing, or a restart, cannot
#: hide that this one is still stuck for longer than that, and a mark nobody rewrites is known to be left over.
REASSERT_S = 5.0
#: The field of ``stats:evaluator`` listing subscriptions no stream query evaluates, and why (at most REFUSALS_SHOWN).
NOT_EVALUATED = "subscriptions_not_evaluated"
REFUSALS_SHOWN = 100


@dataclass(frozen=True)
class Reach:
    """Where a catch-up got: the catalog held after it, the newest version published, and, when the held one is
    behind, why (a change or snapshot no reader can decode, or a log that does not reach the published version)."""

    catalog: Catalog
    published: int
    problem: str | None = None


def reach(source: CatalogLog, catalog: Catalog, keep: int) -> Reach:
    """``catalog`` brought to the newest version published, remembering up to ``keep`` changes.

    By the changes after it when the log reaches back to it, else from the snapshot and the changes
    after the snapshot. Nothing published (Redis lost its data and nobody republished yet) keeps it.
    What it cannot reach it keeps, and says why: evaluation goes on with the last catalog it could read.
    """
    read = source.read(after=catalog.version)
    if read.version in (0, catalog.version):
        return Reach(catalog, read.version)
    if read.version > catalog.version:
        ahead = catalog.brought_forward(read.entries, keep)
        if ahead.version == read.version:
            return Reach(ahead, read.version)
    full = source.read_with_snapshot()
    try:
        base = Catalog.decode(full.snapshot) if full.snapshot else Catalog.empty()
    except UNREADABLE as exc:  # a snapshot this worker cannot read must not stop every shard's batch
        log.warning("catalog_snapshot_unreadable", held=catalog.version, reason=f"{type(exc).__name__}: {exc}")
        return Reach(catalog, full.version, f"the catalog snapshot (version {full.snapshot_version}) cannot be "
                                            f"read: {type(exc).__name__}: {exc}")
    reloaded = base.brought_forward(full.entries, keep)
    if full.version == 0 or reloaded.version != full.version:  # the invariants of core.catalog_log say never
        log.warning("catalog_unreachable", held=catalog.version, published=full.version, reached=reloaded.version)
        return Reach(catalog, full.version, f"the change log stops at version {reloaded.version} of "
                                            f"{full.version} (an entry no reader can decode, or a lost one)")
    return Reach(reloaded, full.version)


def caught_up(source: CatalogLog, catalog: Catalog, keep: int) -> Catalog:
    """The catalog :func:`reach` gets to."""
    return reach(source, catalog, keep).catalog


class CatalogSource:
    def __init__(self, settings: Settings, refresh_s: float = 0.2, reassert_s: float = REASSERT_S) -> None:
        self.keys = RedisKeys(settings)
        self.refresh_s = refresh_s
        self.reassert_s = reassert_s
        self.preview_max_age_s = settings.preview_timeout_s
        self.redis = make_redis(settings)
        # Redis away (a node lost, a failover): the batch waits for it rather than failing the query, or
        # evaluating against a catalog it could not read (core.redis_outage).
        self.outage = Outage("evaluator_worker", settings, self.redis)
        self.catalog_log = CatalogLog(self.redis, self.keys)
        # the parser's series registry (core.series_limit), remembering what this worker reported
        self.series = SeriesLimit(self.redis, settings, remember_s=settings.stream_series_report_s)
        self.keep = settings.catalog_snapshot_every
        self._catalog = Catalog.empty()
        self._checked = 0.0
        self._reported: object = _UNREPORTED  # the problem last written to the stats, by this worker
        self._stuck_since: float | None = None  # when this worker found itself stuck (unix seconds)
        self._asserted = 0.0  # when it last wrote its mark
        self._answered: dict[tuple[str, int, str], float] = {}  # (stream, shard, request) -> when, in this worker
        self._shares = StreamCatalogs(keep=self.keep)
        self._refusals_logged: dict[int, str] = {}

    def previews(self, shard: int, stream: str = TRADES) -> list[tuple[str, PreviewRequest]]:
        """Preview requests on ``stream`` still waited for that ``shard`` (of that stream's query) has not answered
        in this worker, by request id. A request counts as answered once :meth:`answered` says so, after its
        answer (or its error) is stored: one whose answer could not be stored is asked again at the next batch."""
        now = time.time()
        raw: dict[bytes, bytes] = self.redis.hgetall(self.keys.previews)  # type: ignore[assignment]  # bytes: no decode_responses
        self._answered = {k: at for k, at in self._answered.items() if now - at < 2 * self.preview_max_age_s}
        pending = []
        for raw_id, payload in raw.items():
            request_id = raw_id.decode(errors="replace")
            try:
                request = PreviewRequest.from_json(payload)
            except (ValueError, KeyError, TypeError) as exc:  # a request no shard can read must not fail the batch
                self.redis.hdel(self.keys.previews, raw_id)
                log.warning("malformed_preview_request_dropped", request_id=request_id,
                            reason=f"{type(exc).__name__}: {exc}")
                continue
            if request.condition.stream != stream:
                continue  # the query of the stream the condition names answers it
            if now - request.at > self.preview_max_age_s or (stream, shard, request_id) in self._answered:
                continue
            pending.append((request_id, request))
        return pending

    def answered(self, shard: int, request_id: str, stream: str = TRADES) -> None:
        """``shard`` stored its answer to ``request_id`` (or its error): :meth:`previews` no longer lists it."""
        self._answered[(stream, shard, request_id)] = time.time()

    def current(self) -> Catalog:
        now = time.monotonic()
        if now - self._checked >= self.refresh_s:
            self._checked = now
            reached = self.outage.ride_out(lambda: reach(self.catalog_log, self._catalog, self.keep))
            self._catalog = reached.catalog
            self.outage.ride_out(lambda: self._report(reached))
        return self._catalog

    def share(self, stream: str = TRADES, shape: StreamShape | None = None) -> Catalog:
        """The current catalog's subscriptions on ``stream`` that its query can evaluate exactly (see
        ``evaluator.streams``); the others are logged once per reason."""
        share = self._shares.share(self.current(), stream, shape)
        refused = self._shares.refused
        if refused != self._refusals_logged:
            for sid, reason in refused.items():
                if self._refusals_logged.get(sid) != reason:
                    log.warning("subscription_not_evaluated", subscription_id=sid, stream=stream, reason=reason)
            self._refusals_logged = dict(refused)
            shown = dict(sorted(refused.items())[:REFUSALS_SHOWN])  # for operators: which, and why
            self.outage.ride_out(lambda: self.redis.hset(self.keys.evaluator_stats, NOT_EVALUATED, json.dumps(shown)))
        return share

    def _report(self, reached: Reach) -> None:
        """Tell the dead man's switch (``web.watchdog``, rule ``catalog``) that edits no longer reach evaluation,
        or that they do again.

        The mark is shared by every worker, and workers may disagree (a rolling deploy: one decodes what another
        cannot). So a stuck worker rewrites it every ``reassert_s`` (``seen_at``), with the start it saw itself:
        a worker that is past clears it, but cannot hide for longer than that that another one is still stuck.
        A new worker that is past clears only a mark nobody keeps fresh (one left by workers that are gone).
        """
        now = time.time()
        stats = self.keys.evaluator_stats
        if reached.problem is None:
            if self._reported is None:
                return
            first, self._reported, self._stuck_since = self._reported is _UNREPORTED, None, None
            if first and self._kept_fresh(now):
                return
            self.redis.hdel(stats, CATALOG_STUCK_SINCE, CATALOG_STUCK)
            return
        if reached.problem == self._reported and now - self._asserted < self.reassert_s:
            return
        if self._stuck_since is None:
            self._stuck_since = now
        pipe = self.redis.pipeline()
        pipe.hsetnx(stats, CATALOG_STUCK_SINCE, self._stuck_since)  # the first stuck worker's start stays
        pipe.hset(stats, CATALOG_STUCK, json.dumps({"held": reached.catalog.version, "published": reached.published,
                                                    "problem": reached.problem, "seen_at": now,
                                                    "every_s": self.reassert_s}))
        pipe.execute()
        self._reported, self._asserted = reached.problem, now

    def _kept_fresh(self, now: float) -> bool:
        """Whether a stuck worker rewrote the mark lately."""
        raw = self.redis.hget(self.keys.evaluator_stats, CATALOG_STUCK)
        try:
            mark = json.loads(raw) if raw else {}
            return now - float(mark["seen_at"]) < 2 * float(mark["every_s"])
        except (ValueError, TypeError, KeyError):
            return False  # none, or written before marks were rewritten: nobody keeps it


_SHARED: dict[tuple[str, str], CatalogSource] = {}


def shared_catalog_source(settings: Settings) -> CatalogSource:
    """One catalog reader (and Redis client) per worker process and deployment."""
    key = (settings.redis_url, settings.redis_prefix)
    if key not in _SHARED:
        _SHARED[key] = CatalogSource(settings)
    return _SHARED[key]
