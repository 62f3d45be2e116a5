"""Run a stateful streaming query to its end, then stop the session as the evaluator does: a child process of
tests/evaluator/spark/test_stop.py (a JVM's SparkSession cannot be stopped and built again beside the suite's)."""

from __future__ import annotations

import sys
from pathlib import Path

from core.settings import Settings
from evaluator.spark.session import spark_session, stop_session

#: Printed once the query has stopped: what the session's stop logs comes after it.
STOPPING = "stopping the session"


def main(workdir: Path) -> None:
    # Maintenance every 50 ms, not every minute: the state stores' timer thread is sure to fire while the session
    # stops (and, before the first commit, to warn of state directories not written yet: not this test's matter).
    spark = spark_session(Settings(spark_conf={"spark.sql.streaming.stateStore.maintenanceInterval": "50ms"}),
                          "tocsin-stop-test")
    (workdir / "in").mkdir()
    (workdir / "in" / "rows.json").write_text("".join(f'{{"key": "k{i % 3}"}}\n' for i in range(30)))
    counts = spark.readStream.schema("key STRING").json(str(workdir / "in")).groupBy("key").count()
    query = (counts.writeStream.format("memory").queryName("counts").outputMode("complete")
             .option("checkpointLocation", str(workdir / "checkpoint")).start())
    query.processAllAvailable()
    assert sorted(r["count"] for r in spark.sql("SELECT * FROM counts").collect()) == [10, 10, 10]
    query.stop()
    print(STOPPING, file=sys.stderr, flush=True)
    stop_session(spark)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
