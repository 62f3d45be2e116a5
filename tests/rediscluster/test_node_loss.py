"""A Redis Cluster node SIGKILLed mid-stream, with real dispatcher and Celery worker processes delivering to a real
receiver and the web app answering: with a replica per primary it fails over and nothing is lost or sent twice;
without replicas every process waits and resumes once the node is back (empty), what was lost is exactly the
lost node's keys, and the resolutions of alerts delivered before the loss are still sent, marked ``state_unknown``
(the policy state that said they were went with the node; docs/redis.md, "Node loss, replicas and persistence")."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from structlog.testing import capture_logs

from core.redis_schema import RedisKeys
from core.settings import Settings
from evaluator.spark.sink import RedisAlertSink
from tests.evaluator.spark.test_sink import transition
from tests.processes import running, worker_args
from tests.rediscluster.conftest import PARTITIONS
from tests.rediscluster.test_delivery import DISPATCHER, KEYS, Deployment, _deployment, _eventually, _settled
from tests.servers import LocalCluster, cluster_nodes
from tests.users import api_client

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODE_TIMEOUT_MS = 1_000  # a primary is taken for failed (and its replica promoted) about this long after it dies
T1, T2, T3 = 1_700_000_060_000, 1_700_000_120_000, 1_700_000_180_000


def _victim(cluster: LocalCluster, settings: Settings) -> int:
    """The port of the primary that serves partition 0's alert stream."""
    client = RedisCluster.from_url(cluster.url)
    try:
        return int(client.get_node_from_key(RedisKeys(settings).alerts_stream_of(0)).port)
    finally:
        client.close()


def _settings(cluster: LocalCluster, settings: Settings, redis_url: str, victim: int) -> Settings:
    """Tocsin on ``cluster``, reached through a node that is not ``victim`` (so clients made later still find it)."""
    other = next(port for port in cluster.primaries() if port != victim)
    return settings.model_copy(update={
        "redis_url": f"redis://127.0.0.1:{other}/0", "redis_cluster": True, "celery_broker_url": redis_url,
        "redis_partitions": PARTITIONS, "redis_outage_backoff_cap_s": 1.0})


def _fire(d: Deployment, sink: RedisAlertSink, state: str, at: int) -> list[str]:
    """One evaluation's transitions (``state``) for every subscription and key, through the sink; their ids."""
    batch = [transition(sid, key, state, at) for sid in d.subscriptions for key in KEYS]
    sink.write(batch)  # rides out an outage; a write retried after a partial one counts only what was new
    return [t["alert_id"] for t in batch]


def _on_victim(d: Deployment, victim: int) -> list[int]:
    """The subscriptions whose keys (their partition's slot) the ``victim`` node serves."""
    keys = RedisKeys(d.settings)
    served = {p for p in range(keys.partitions)
              if int(d.client.get_node_from_key(keys.alerts_stream_of(p)).port) == victim}  # type: ignore[attr-defined]
    return [sid for sid in d.subscriptions if keys.partition(sid) in served]


def _log_count(logs: Path, name: str, event: str) -> int:
    return (logs / f"{name}.log").read_text().count(f'"event": "{event}"')


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[LocalCluster]:
    with cluster_nodes(tmp_path / "cluster", masters=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        yield cluster


@pytest.fixture
def unreplicated(tmp_path: Path) -> Iterator[LocalCluster]:
    with cluster_nodes(tmp_path / "cluster", masters=3, node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        yield cluster


def test_a_primary_killed_mid_stream_fails_over_and_every_alert_is_delivered_once(
        replicated: LocalCluster, settings: Settings, redis_url: str, tmp_path: Path) -> None:
    cluster = replicated
    victim = _victim(cluster, settings)
    with contextmanager(_deployment)(_settings(cluster, settings, redis_url, victim)) as d:
        logs = tmp_path / "logs"
        sink = RedisAlertSink(d.settings)
        with running(d.settings, logs, ("worker", worker_args()), ("dispatcher", DISPATCHER)) as processes, \
                api_client(d.settings, d.token) as api, capture_logs() as sink_logs:
            on_victim = _on_victim(d, victim)
            first = _fire(d, sink, "firing", T1)
            # The stream is on the replica before its primary dies: what asynchronous replication had not copied
            # yet would be lost with it (docs/redis.md).
            stream_node = d.client.get_node_from_key(RedisKeys(d.settings).alerts_stream_of(0))
            assert d.client.execute_command("WAIT", 1, 10_000, target_nodes=stream_node) == 1
            cluster.nodes[victim].kill()  # mid-stream: the first evaluation is being dispatched and delivered
            second = _fire(d, sink, "resolved", T2)  # waits out the failover
            third = _fire(d, sink, "firing", T3)
            everything = first + second + third
            _eventually(_settled(d, everything), "every alert delivered and acknowledged after the failover")
            assert victim not in cluster.primaries()
            sid = on_victim[0]
            firing = api.get(f"/api/subscriptions/{sid}/firing")
            assert firing.status_code == 200 and set(firing.json()["firing"]) == set(KEYS)
            assert all(p.process.poll() is None for p in processes), "a process exited"
        assert d.delivered() == Counter(dict.fromkeys(everything, 1)), "an alert lost or sent twice"
        keys = RedisKeys(d.settings)
        assert {sid: d.client.xlen(keys.history(sid)) for sid in d.subscriptions} == dict.fromkeys(
            d.subscriptions, 3 * len(KEYS)), "the histories on the failed primary lost entries"
        sink_events = [e["event"] for e in sink_logs if e.get("component") == "sink"]
        assert sink_events in ([], ["redis_outage", "redis_recovered"]), sink_events  # once per outage
        for name in ("dispatcher", "worker"):
            assert _log_count(logs, name, "redis_outage") <= 1, f"{name} logged its outage per retry"


def test_without_replicas_every_process_waits_for_the_node_and_resumes_and_only_its_keys_are_lost(
        unreplicated: LocalCluster, settings: Settings, redis_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOCSIN_LOG_LEVEL", "INFO")  # the processes' redis_recovered lines are info
    cluster = unreplicated
    victim = _victim(cluster, settings)
    with contextmanager(_deployment)(_settings(cluster, settings, redis_url, victim)) as d:
        logs = tmp_path / "logs"
        sink = RedisAlertSink(d.settings)
        lost = _on_victim(d, victim)
        kept = [sid for sid in d.subscriptions if sid not in lost]
        assert lost and kept, "the subscriptions span the lost node and the others"
        with running(d.settings, logs, ("worker", worker_args()), ("dispatcher", DISPATCHER)) as processes, \
                api_client(d.settings, d.token) as api:
            first = _fire(d, sink, "firing", T1)
            _eventually(_settled(d, first), "the first evaluation delivered")
            cluster.nodes[victim].kill()
            live = redis.Redis(port=next(p for p in cluster.nodes if p != victim), decode_responses=True)
            _eventually(lambda: "cluster_state:fail" in live.execute_command("CLUSTER", "INFO"),
                        "the cluster down without the node")
            second: list[str] = []
            writing = threading.Thread(target=lambda: second.extend(_fire(d, sink, "resolved", T2)))
            writing.start()  # waits for the node
            # The web app answers 503 while the cluster is down (never a 500), and readiness names Redis.
            assert api.get(f"/api/subscriptions/{kept[0]}/firing").status_code == 503
            assert api.get("/readyz").json()["checks"]["redis"] != "ok"
            _eventually(lambda: _log_count(logs, "dispatcher", "redis_outage") == 1, "the dispatcher's outage logged")
            assert writing.is_alive(), "the sink wrote to a cluster that is down"
            assert all(p.process.poll() is None for p in processes), "a process exited during the outage"
            cluster.start(victim)  # back without its data
            cluster.wait_ok()
            writing.join(timeout=120)
            assert not writing.is_alive(), "the sink did not resume"
            try:
                _eventually(_settled(d, first + second), "the second evaluation delivered after the node came back")
            except AssertionError as exc:
                missing = sorted({sid for sid in d.subscriptions for key in KEYS
                                  if not d.delivered()[transition(sid, key, "resolved", T2)["alert_id"]]})
                raise AssertionError(f"{exc}; undelivered subscriptions {missing}, those on the lost node {lost}, "
                                     f"pending {d.pending()}") from exc
            assert api.get(f"/api/subscriptions/{kept[0]}/firing").status_code == 200
            _eventually(lambda: api.get("/readyz").json()["checks"]["redis"] == "ok", "readiness sees Redis again")
            assert all(p.process.poll() is None for p in processes), "a process exited"
        assert d.delivered() == Counter(dict.fromkeys(first + second, 1)), "an alert lost or sent twice"
        # The resolutions of the keys whose policy state went with the node are sent all the same, marked so; the
        # others are not marked (notifier.policy).
        marked = {a["alert_id"] for r in list(d.receiver.received) for a in r.json["alerts"] if a.get("state_unknown")}
        assert marked == {transition(sid, key, "resolved", T2)["alert_id"] for sid in lost for key in KEYS}
        # What was lost: the node's keys as they were. Its subscriptions' histories hold only what came after.
        keys = RedisKeys(d.settings)
        assert {sid: d.client.xlen(keys.history(sid)) for sid in d.subscriptions} == {
            sid: len(KEYS) if sid in lost else 2 * len(KEYS) for sid in d.subscriptions}
        assert _log_count(logs, "dispatcher", "redis_outage") == 1, "the outage logged once, not per retry"
        assert _log_count(logs, "dispatcher", "redis_recovered") == 1
        assert _log_count(logs, "dispatcher", "consumer_group_missing") >= 1  # the lost stream's group made again
