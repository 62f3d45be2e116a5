"""Ingest micro-benchmark: parsing records into panes, and reading them from Tansu.

    python benchmarks/ingest.py                 # parse at 100k and 1M records; read 200k records
    python benchmarks/ingest.py --quick         # smoke run

- *Parse*: ``PaneParser.parse`` + pane pre-aggregation on one batch of plain events
  (``Event.to_json``, 5,000 Zipf-popular keys), per record (``vectorised=False``: every
  record through ``parse_record``) against the vectorised pass; and, for reference only,
  ``pyarrow.json`` on the same bytes (not used: it is lenient where ``parse_record`` is strict,
  e.g. duplicate fields, strings for numbers).
- *Log ends*: the question the source asks before every micro-batch (``LogEndProbe``), over its one client and
  over a fresh client a question (what /readyz does), on the same backlog.
- *Read*: records/s of ``KafkaStreamReader.read`` (Arrow batches, librdkafka) over the whole topic
  in slices of ``--slice`` records, as Spark tasks would, with a new consumer per slice or the
  worker's pooled one, and the reading process's CPU per record (librdkafka's threads included;
  the wall rate is also the broker's: Tansu serves the fetches on the same cores).

Numbers are printed, never asserted.
"""

from __future__ import annotations

import io
import itertools
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import add_markdown_option, markdown_run, table
from core import cli
from core.settings import Settings
from evaluator.spark.parse import PaneParser
from ingest.model import Event

NOW = 1_700_000_000_000


def records(n: int, keys: int = 5_000, seed: int = 14) -> list[bytes]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 0.8 for i in range(keys)]
    names = rng.choices([f"S{i:05d}" for i in range(keys)], weights, k=n)
    return [Event(key=k, ts=NOW - 60_000 + i * 60_000 // n, price=round(rng.uniform(1, 500), 2),
                  volume=rng.randrange(1, 10_000)).to_json() for i, k in enumerate(names)]


def raw_frame(values: list[bytes]) -> pd.DataFrame:
    return pd.DataFrame({"topic": "bench", "partition": np.zeros(len(values), dtype=np.int32),
                         "offset": np.arange(len(values)), "value": pd.Series(values, dtype=object),
                         "value_bytes": [len(v) for v in values], "value_sha256": pd.Series([None] * len(values)),
                         "now": NOW})


def panes_per_second(parser: PaneParser, raw: pd.DataFrame, clock: Callable[[], float] = time.perf_counter) -> float:
    """Records/s through the parser and pane pre-aggregation, by wall time (or ``clock``'s)."""
    start = clock()
    parsed = parser.parse(raw)
    parser._frame(parsed.events(), parsed.progress)
    seconds = clock() - start
    assert not parsed.dead and len(parsed.rows) == len(raw)
    return len(raw) / seconds


def parse_rows(sizes: list[int]) -> list[list[object]]:
    settings = Settings()
    rows: list[list[object]] = []
    for n in sizes:
        raw = raw_frame(records(n))
        panes_per_second(PaneParser(settings, (0, 1)), raw.head(1_000))  # warm up: imports, regex compilation
        old = panes_per_second(PaneParser(settings, (0, 1), vectorised=False), raw)
        new = panes_per_second(PaneParser(settings, (0, 1)), raw)
        ndjson = io.BytesIO(b"\n".join(raw["value"]))
        start = time.perf_counter()
        pa_json.read_json(ndjson)
        lenient = n / (time.perf_counter() - start)
        rows.append([f"{n:,}", old, new, lenient, f"{new / old:.1f}x"])
    return rows


def produce(settings: Settings, n: int) -> None:
    from kafka import KafkaProducer

    from ingest.kafka import ensure_topics

    ensure_topics(settings)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=50, batch_size=1 << 20,
                             max_request_size=8 << 20)
    partitions = settings.event_partitions
    for i, value in enumerate(records(n)):
        producer.send(settings.events_topic, value=value, partition=i % partitions)
    producer.flush()
    producer.close()


def read_all(bootstrap: str, topic: str, slice_rows: int, pooled: bool) -> dict:
    """Read the whole topic in slices as Spark tasks would: rows, wall seconds and this process's CPU seconds
    (librdkafka's threads included)."""
    from evaluator.spark import source
    from evaluator.spark.source import KafkaStreamReader

    source._CONSUMERS = source._ConsumerPool(max_idle_s=300.0 if pooled else -1.0)  # -1: a new consumer per slice
    reader = KafkaStreamReader({"bootstrap": bootstrap, "topic": topic})
    start, end = reader.initialOffset(), reader._log_ends()
    cuts = {p: [*range(start[p], end[p], slice_rows), end[p]] for p in end}
    slices = [source.KafkaSlice(topic, int(p), a, b, NOW) for p, c in cuts.items() for a, b in itertools.pairwise(c)]
    began, cpu = time.perf_counter(), time.process_time()
    rows = sum(batch.num_rows for part in slices for batch in reader.read(part))
    source._CONSUMERS.close()  # the pooled readers, before their broker stops: no reconnect errors at exit
    reader.stop()  # its log-end client, likewise
    return {"rows": rows, "seconds": time.perf_counter() - began, "cpu_s": time.process_time() - cpu,
            "slices": len(slices)}


def read_rows(settings: Settings, n: int, slice_rows: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for pooled in (False, True):
        got = read_all(settings.kafka_bootstrap, settings.events_topic, slice_rows, pooled)
        assert got["rows"] == n, got
        rows.append(["pooled" if pooled else "new per slice", got["slices"], got["rows"] / got["seconds"],
                     got["cpu_s"] * 1e6 / got["rows"]])
    return rows


#: Between two log-end questions, as a micro-batch at least is: back to back, a fetch the broker still held from
#: the question before (up to fetch.wait.max.ms, 5 ms) delayed the next one's ListOffsets.
QUESTIONS_APART_S = 0.05


def log_end_rows(settings: Settings, questions: int) -> list[list[object]]:
    """"Where do the logs end?", asked ``questions`` times over the backlog: over one long-lived client (the source
    asks before every micro-batch) and over a fresh client each time (readiness): ms per question, CPU ms."""
    from ingest.kafka import LogEndProbe, topic_end_offsets

    probe = LogEndProbe(settings.kafka_bootstrap, settings.events_topic, wait_for_topic=True, keep_client=True)
    ends = topic_end_offsets(settings, settings.events_topic)
    rows: list[list[object]] = []
    try:
        for name, ask in (("one client (the source's)", probe.ends),
                          ("a fresh client each (readiness)", lambda: topic_end_offsets(settings, settings.events_topic))):
            took, cpu = [], time.process_time()
            for _ in range(questions):
                time.sleep(QUESTIONS_APART_S)
                began = time.perf_counter()
                assert ask() == ends
                took.append((time.perf_counter() - began) * 1000)
            p50, p90 = np.percentile(took, [50, 90])
            rows.append([name, questions, p50, p90, max(took), (time.process_time() - cpu) * 1000 / questions])
    finally:
        probe.close()
    return rows


def main() -> None:
    parser = cli.parser(__doc__, "python -m benchmarks.ingest")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--read-records", type=int, default=200_000)
    parser.add_argument("--slice", type=int, default=10_000, help="records per source task")
    parser.add_argument("--questions", type=int, default=50, help="log-end questions per client")
    add_markdown_option(parser)
    args = parser.parse_args()
    sizes = [10_000] if args.quick else [100_000, 1_000_000]
    read_n = 20_000 if args.quick else args.read_records
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} on {os.cpu_count()} cores")

    table("Parse + pane pre-aggregation, one batch of plain events (records/s)",
          ["records", "per record", "vectorised", "pyarrow.json alone (lenient, not used)", "speed-up"], parse_rows(sizes))

    from devstack.services import free_port, start_tansu

    work = Path(tempfile.mkdtemp(prefix="tocsin-bench-ingest-"))
    port = free_port()
    broker = start_tansu("127.0.0.1", port, work / "tansu.log")
    try:
        settings = Settings(kafka_bootstrap=f"127.0.0.1:{port}", events_topic="bench-ingest", event_partitions=4,
                            data_dir=work)
        produce(settings, read_n)
        table(f"Read from Tansu by the source (librdkafka), {read_n:,} records in slices of {args.slice:,}",
              ["consumer", "slices", "records/s", "CPU µs per record (reader process)"],
              read_rows(settings, read_n, args.slice))
        table(f"Log ends of the same topic (4 partitions), asked {args.questions} times "
              f"{QUESTIONS_APART_S * 1000:.0f} ms apart: ms per question",
              ["client", "questions", "p50", "p90", "max", "CPU ms per question (asking process)"],
              log_end_rows(settings, args.questions))
    finally:
        broker.stop()
    print(f"\nload: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    pa.set_cpu_count(1)  # like one Spark task: the other core runs the other task
    with markdown_run():
        main()
