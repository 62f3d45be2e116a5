"""The evaluator's SparkSession: our settings, then the operator's ``TOCSIN_SPARK_CONF`` on top."""

from __future__ import annotations


def test_state_commits_write_changelogs(spark) -> None:
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled") == "true"


def test_spark_conf_setting_reaches_the_session(spark) -> None:
    # tests/conftest.py's session is built with spark_conf={"spark.tocsin.origin": "TOCSIN_SPARK_CONF"}
    assert spark.conf.get("spark.tocsin.origin") == "TOCSIN_SPARK_CONF"
