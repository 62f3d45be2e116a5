"""The local standalone cluster: workers register, a killed worker takes its executor and Python workers with it,
a restarted one registers again, and nothing outlives the cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devstack.services import spawn
from devstack.spark_cluster import SparkCluster, processes_under
from tests.evaluator.streams import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: An application that starts an executor on every worker, runs Python on each, and waits to be killed.
APPLICATION = """
import sys, time
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[1]).config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.enabled", "false").getOrCreate())
while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < int(sys.argv[2]) + 1:  # + the driver
    time.sleep(0.2)
spark.sparkContext.parallelize(range(8), 8).map(lambda x: x * x).collect()
print("ready", flush=True)
time.sleep(600)
"""


def _python_under(directory: Path) -> list[int]:
    return [pid for pid in processes_under(directory)
            if Path(f"/proc/{pid}/exe").resolve().name.startswith("python")]


def test_kill_and_restart_a_worker_with_its_executor_and_python_workers(tmp_path: Path) -> None:
    work = tmp_path / "cluster"
    script = tmp_path / "app.py"
    script.write_text(APPLICATION)
    log = tmp_path / "app.log"
    with SparkCluster(workers=2, cores_per_worker=1, memory="1g", work_dir=work) as cluster:
        assert cluster.alive_workers() == 2
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        driver = spawn("driver", [sys.executable, str(script), cluster.master_url, "2"], log,
                       env={"PYSPARK_PYTHON": sys.executable})
        try:
            wait_until(lambda: "ready" in log.read_text() or driver.process.poll() is not None)
            assert driver.process.poll() is None, log.read_text()[-2000:]
            for i in (0, 1):  # an executor JVM and its Python daemon on each worker
                assert _python_under(work / f"worker-{i}"), f"no Python worker on worker {i}"
            cluster.kill_worker(1)
            assert processes_under(work / "worker-1") == [], "the killed worker's executor or Python workers live on"
            assert _python_under(work / "worker-0"), "the other worker's Python workers were killed too"
            assert cluster.alive_workers() == 1
            cluster.restart_worker(1)
            assert cluster.alive_workers() == 2
        finally:
            driver.kill()
        wait_until(lambda: not cluster.app_processes(), 60)  # the master ends the executors of a dead driver
    assert processes_under(work) == [], "the cluster left processes behind"
