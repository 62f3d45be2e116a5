"""The catalog published to the evaluator stays proportional to the subscriptions, however they are edited."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from core.catalog_log import CatalogLog
from core.redis_schema import RedisKeys
from core.settings import Settings
from tests.web.api.test_api import published

MAX_KEY = "K" * 60


def _keys(n: int, tag: int) -> list[str]:
    return [f"{MAX_KEY}{tag:02d}{i:05d}"[-64:] for i in range(n)]


def test_published_catalog_stays_proportional_to_the_subscriptions(api: TestClient, settings: Settings) -> None:
    limit = settings.subscription_max_keys
    too_many = api.post("/api/subscriptions", json={"name": "x", "condition": "COUNT(*) OVER 1m > 1",
                                                    "keys": _keys(limit + 1, 0)})
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"][-1] == "keys"
    assert f"at most {limit} keys" in too_many.json()["detail"][0]["msg"]

    log = CatalogLog(redis.Redis.from_url(settings.redis_url), RedisKeys(settings))
    count = 12
    ids = []
    for n in range(count):
        body = {"name": f"s{n}", "condition": "SUM(volume) OVER 5m > 2e6", "keys": _keys(limit, n)}
        ids.append(api.post("/api/subscriptions", json=body).json()["id"])
    for _ in range(3):  # edits publish the edited subscription: the catalog is replaced, never grows
        for sid in ids:
            body = {"name": "edited", "condition": "SUM(volume) OVER 5m > 3e6", "keys": _keys(limit, sid % 50)}
            assert api.put(f"/api/subscriptions/{sid}", json=body).status_code == 200
    raw_per_subscription = limit * 67  # each key at its longest, quoted, with a comma
    changes = log.read(after=0).entries
    assert len(changes) == count * 4
    assert max(len(payload) for _, payload in changes) < raw_per_subscription / 2, "compact changes"
    catalog = published(settings)
    assert len(catalog.encode()) < count * raw_per_subscription / 2, "compact snapshots"
    assert len(catalog.subscriptions) == count
    assert all(len(s.keys) == limit for s in catalog.subscriptions)


def test_the_encoding_round_trips_and_reads_plain_snapshots() -> None:
    import json

    from evaluator.catalog import Catalog
    from evaluator.spec import SubscriptionSpec
    from subscriptions.language import parse_condition

    catalog = Catalog(3, (SubscriptionSpec(1, parse_condition("COUNT(*) OVER 1m >= 2"), frozenset({"A", "B"}), "t"),
                          SubscriptionSpec(2, parse_condition("QUANTILE(price, 0.9) OVER 1m > 5"), None, "u")))
    assert Catalog.decode(catalog.encode()) == catalog
    assert Catalog.decode(json.dumps(catalog.to_dict()).encode()) == catalog
