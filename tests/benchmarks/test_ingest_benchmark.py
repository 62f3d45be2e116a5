"""The ingest benchmark still runs end to end: parsing at one size, reading every record through the source."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick
from tests.benchmarks.test_pipeline_benchmark import number, table_rows


@pytest.mark.spark  # a Tansu broker and the source module (no SparkSession), ~10 s; 4 partitions: one slice each
def test_quick_run_parses_and_reads_every_record() -> None:
    stdout = run_quick("ingest.py", timeout_s=300)
    [parse] = table_rows(stdout, "Parse + pane pre-aggregation")
    assert parse[0] == "10,000" and number(parse[2]) > 0, parse
    reads = {cells[0]: cells[1:] for cells in table_rows(stdout, "Read from Tansu by the source")}
    assert list(reads) == ["new per slice", "pooled"]
    for consumer, (slices, per_second, cpu) in reads.items():
        assert number(slices) == 4 and number(per_second) > 0 and number(cpu) > 0, (consumer, reads[consumer])
