"""Key names: the default ones are a single Redis's as they always were; tagged ones share a slot where they must."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from redis.crc import key_slot

from core.redis_client import limits_storage
from core.redis_schema import RedisKeys
from core.settings import Settings


def _settings(**changes: object) -> Settings:
    return Settings(redis_prefix="tocsin", deployment_id="d1", **changes)  # type: ignore[arg-type]


def test_the_default_names_carry_no_tag_and_did_not_move() -> None:
    keys = RedisKeys(_settings())
    assert (keys.alerts_stream, keys.alerts_dead, keys.alert_mark(7, "a1"), keys.firing(7), keys.history(7),
            keys.counters(7), keys.key_states(7), keys.decision(7, "a1"), keys.delivery_log(7),
            keys.delivered("n1", 3), keys.sending("n1", 3), keys.inflight_endpoint(5, 3), keys.inflight_owner(5),
            keys.catalog_version, keys.catalog_changes) == (
        "tocsin:d1:alerts", "tocsin:d1:alerts:dead", "tocsin:d1:alert:a1", "tocsin:d1:firing:7",
        "tocsin:d1:history:7", "tocsin:d1:counters:7", "tocsin:d1:policy:7", "tocsin:d1:decision:a1",
        "tocsin:d1:deliveries:7", "tocsin:d1:delivered:n1:3", "tocsin:d1:sending:n1:3",
        "tocsin:d1:inflight:endpoint:3", "tocsin:d1:inflight:owner:5", "tocsin:d1:subscriptions:version",
        "tocsin:d1:subscriptions:changes")
    assert keys.alerts_streams == [keys.alerts_stream] and keys.mark_prefix(0) + "a1" == keys.alert_mark(7, "a1")
    assert keys.seen(7, 19_675) == keys.seen_prefix(0) + "19675" == "tocsin:d1:seen:19675"


@pytest.mark.parametrize("changes", [{"redis_partitions": 8},
                                     {"redis_cluster": True, "celery_broker_url": "redis://broker:6379/0"}])
def test_what_one_script_or_transaction_touches_is_in_one_slot(changes: dict) -> None:
    keys = RedisKeys(_settings(**changes))
    for sid in range(1, 40):
        p = keys.partition(sid)
        together = {keys.alerts_stream_of(p), keys.alerts_dead_of(p), keys.alert_mark(sid, "a"), keys.firing(sid),
                    keys.history(sid), keys.counters(sid), keys.key_states(sid), keys.decision(sid, "a"),
                    keys.delivery_log(sid), keys.mark_prefix(p) + "b", keys.firing_prefix(p) + str(sid),
                    keys.history_prefix(p) + str(sid), keys.counters_prefix(p) + str(sid), keys.seen(sid, 19_675),
                    keys.seen_prefix(p) + "19676"}
        assert len({key_slot(k.encode()) for k in together}) == 1
    assert len({key_slot(k.encode()) for k in (keys.delivered("n", 1), keys.sending("n", 1))}) == 1
    assert len({key_slot(k.encode()) for k in (keys.inflight_endpoint(4, 1), keys.inflight_owner(4),
                                                keys.attempt_time(4, 1), keys.endpoint_turn(4, 1))}) == 1
    assert len({key_slot(k.encode()) for k in (keys.catalog_version, keys.catalog_changes, keys.catalog_snapshot,
                                                keys.catalog_snapshot_version)}) == 1
    assert len({key_slot(s.encode()) for s in keys.alerts_streams}) == keys.partitions  # partitions spread


def test_one_alert_stream_name_is_refused_when_there_are_several() -> None:
    with pytest.raises(ValueError, match="partitioned"):
        RedisKeys(_settings(redis_partitions=2)).alerts_stream  # noqa: B018 - the property raises


def test_a_cluster_needs_a_broker_of_its_own() -> None:
    with pytest.raises(ValidationError, match="TOCSIN_CELERY_BROKER_URL"):
        _settings(redis_cluster=True)
    settings = _settings(redis_cluster=True, celery_broker_url="redis://broker:6379/0",
                         redis_url="redis://:secret@node-1:7000/0")
    assert settings.broker_url == "redis://broker:6379/0"
    assert limits_storage(settings) == ("redis+cluster://:secret@node-1:7000", {})
    assert limits_storage(_settings()) == (_settings().redis_url, {})
