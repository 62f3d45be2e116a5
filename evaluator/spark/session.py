"""Building the SparkSession the evaluator job and the tests use, in local mode or on a standalone cluster.

On a cluster (``TOCSIN_SPARK_MASTER=spark://host:port``, see docs/cluster.md) executors are JVMs
the workers start, with Python workers of their own that do not inherit the driver's
environment. What they need is passed here: the driver's interpreter (``spark.pyspark.python``,
so the same virtualenv with the same libraries), the project's code on their ``PYTHONPATH``
(``spark.executorEnv.PYTHONPATH``; the functions Spark ships refer to it by module), and the
address they reach the driver at. The settings themselves travel inside the functions (every
stage holds its :class:`~core.settings.Settings`), so executors read no ``TOCSIN_*`` variable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from core.settings import Settings
from evaluator.spark.source import KafkaDataSource

#: Where this project's packages are imported from: executors' Python workers import them from there too.
PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: How Spark writes a checkpoint on a local (or mounted) disk. Its default goes through Hadoop's FileContext, whose
#: rename asks for each file's link status and, without Hadoop's native library (pip's pyspark has none), starts a
#: ``readlink`` process for each file and its checksum (and a ``chmod`` for each file created): ~20 processes a
#: micro-batch for the offsets, the commits and every shard's state changelog. Through FileSystem a rename is one
#: ``rename(2)``: a small-batch drain 15,684 -> 19,665 events/s (docs/benchmarks.md). Checkpoints elsewhere (HDFS,
#: S3) keep Spark's default; ``TOCSIN_SPARK_CONF`` overrides either.
LOCAL_CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def executor_pythonpath() -> str:
    """The project root, then the driver's own ``PYTHONPATH``: executors import what the driver imports."""
    entries = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(entries))


def spark_session(settings: Settings, app_name: str = "tocsin-evaluator") -> SparkSession:
    """A session with our Kafka source registered; the same Python runs driver and workers."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", settings.spark_driver_bind_address)
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", settings.spark_driver_host)
        .config("spark.driver.bindAddress", settings.spark_driver_bind_address)
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.executorEnv.PYTHONPATH", executor_pythonpath())
        .config("spark.executor.memory", settings.spark_executor_memory)
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        # A commit writes the batch's changes, not a RocksDB snapshot copied into the checkpoint (snapshots are
        # taken in the background): the state store's share of every micro-batch (docs/benchmarks.md: floor).
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
    )
    if settings.local_checkpoint_dir is not None:
        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINT_FILE_MANAGER)
    for key, value in settings.spark_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(KafkaDataSource)
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop the state stores, then the session. Spark's state-store maintenance thread runs on a timer and, if it
    fires while ``spark.stop()`` is tearing SparkEnv down, logs "SparkEnv not active" with a Java stack trace
    into an otherwise clean shutdown (seen in CI). Stopping the stores first ends that thread and closes every
    loaded store; the queries must already be stopped."""
    jvm = spark._jvm  # no public handle in PySpark
    if jvm is not None:
        jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
    spark.stop()
