"""A Spark standalone cluster (a master and two workers, each its own JVM) and one stream for the cluster tests.

The cluster is started once per module and stopped after it; nothing it started may be left
running (``processes_under`` its work directory). The stream (events, catalog, Kafka topic) is
published once; each run reads it with its own Redis prefix and checkpoint (``for_run``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.settings import Settings
from devstack.spark_cluster import SparkCluster, processes_under
from ingest.kafka import ensure_topics
from tests.conftest import isolated_settings
from tests.evaluator.streams import generated_stream, publish

WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    work = tmp_path_factory.mktemp("spark-cluster")
    with SparkCluster(workers=WORKERS, cores_per_worker=1, memory="1g", work_dir=work) as started:
        yield started
    assert processes_under(work) == [], "the cluster left processes behind"


@dataclass(frozen=True)
class Stream:
    settings: Settings  # submits to the cluster; runs derive their own prefix and checkpoint from it
    events: list[tuple[str, int, float, float]]
    last: int  # the last boundary to evaluate
    root: Path  # where runs keep their checkpoints and logs


@pytest.fixture(scope="module")
def stream(cluster: SparkCluster, kafka_bootstrap: str, redis_url: str,
           tmp_path_factory: pytest.TempPathFactory) -> Stream:
    root = tmp_path_factory.mktemp("cluster-runs")
    settings = isolated_settings(kafka_bootstrap, redis_url, root).model_copy(update={
        "spark_master": cluster.master_url,
        "evaluator_stop_timeout_s": 60.0,
    })
    ensure_topics(settings)
    events = generated_stream()
    return Stream(settings, events, publish(settings, events), root)
