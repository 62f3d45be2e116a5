"""The evaluator's SparkSession: our settings, then the operator's ``TOCSIN_SPARK_CONF`` on top."""

from __future__ import annotations


def test_state_commits_write_changelogs(spark) -> None:
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled") == "true"


def test_spark_conf_setting_reaches_the_session(spark) -> None:
    # tests/conftest.py's session is built with spark_conf={"spark.tocsin.origin": "TOCSIN_SPARK_CONF"}
    assert spark.conf.get("spark.tocsin.origin") == "TOCSIN_SPARK_CONF"


def test_a_local_checkpoint_is_written_without_starting_a_process_per_file(spark, settings) -> None:
    """Spark's default checkpoint file manager (Hadoop's FileContext) starts ``readlink`` and ``chmod`` processes for
    every checkpoint file on a local disk without Hadoop's native library; the session uses FileSystem's instead."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
        jvm.org.apache.hadoop.fs.Path(settings.checkpoint_location), conf)
    assert manager.getClass().getSimpleName() == "FileSystemBasedCheckpointFileManager"
