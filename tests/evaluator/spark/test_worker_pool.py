"""The shard operator's own Python worker pool: a variable in the environment its function is defined with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evaluator.spark.job import POOL_VARIABLE, _worker_pool


def test_functions_defined_inside_get_the_pool_variable_and_it_is_gone_after() -> None:
    environment = {"OTHER": "1"}
    spark = SimpleNamespace(sparkContext=SimpleNamespace(environment=environment))  # what _worker_pool touches
    with _worker_pool(spark, "shard-operator"):  # type: ignore[arg-type]
        assert environment == {"OTHER": "1", POOL_VARIABLE: "shard-operator"}
    assert environment == {"OTHER": "1"}
    with pytest.raises(RuntimeError), _worker_pool(spark, "shard-operator"):  # type: ignore[arg-type]
        raise RuntimeError
    assert environment == {"OTHER": "1"}
    with _worker_pool(spark, None):  # type: ignore[arg-type]
        assert environment == {"OTHER": "1"}  # the shared pool: nothing set
