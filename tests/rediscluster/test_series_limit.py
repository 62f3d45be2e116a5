"""A stream's series limit with publisher tokens on a Redis Cluster: the stream's set and its tokens' share a slot,
so one script admits a batch against both."""

from __future__ import annotations

import redis

from core.series_limit import Refusal, SeriesLimit
from core.settings import Settings

T = 1_700_000_000_000


def test_a_token_share_and_the_stream_limit_in_one_script_on_the_cluster(cluster_settings: Settings,
                                                                          cluster_client: redis.Redis) -> None:
    limit = SeriesLimit(cluster_client, cluster_settings.model_copy(
        update={"stream_max_series": 3, "publish_token_series_share": 0.34}))  # 1 series per token
    assert limit.refusals("hosts", ["a", "b"], [T, T], token=1) == {1: Refusal.TOKEN}
    assert limit.refusals("hosts", ["b", "c", "d"], [T] * 3, token=2) == {1: Refusal.TOKEN, 2: Refusal.TOKEN}
    assert limit.refusals("hosts", ["c"], [T], token=3) == {}
    assert limit.refusals("hosts", ["d"], [T], token=4) == {0: Refusal.STREAM}
    assert limit.active("hosts") == 3
    limit.forget("hosts")
    assert cluster_client.exists(limit.keys.token_series("hosts", 1)) == 0
    assert limit.refusals("hosts", ["d"], [T], token=4) == {}
