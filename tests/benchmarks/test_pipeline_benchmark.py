"""The pipeline benchmark still runs end to end, Tocsin and its peers all process the stream, compared at equal
batch sizes; the live rows time alerts from their events."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from benchmarks.pipeline import QUIX_MISSING
from tests.benchmarks.quick import run_quick


def table_rows(stdout: str, title: str) -> list[list[str]]:
    """The cells of each row of the printed table whose title starts with ``title``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 3:]:  # title, header, dashes
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.spark
@pytest.mark.slow  # ~3 minutes idle (every row, the peers, the live rows): CI runs it, a developer's default run not
@pytest.mark.timeout(900)  # the subprocess's own deadline below, not the suite's 300 s
def test_quick_run_prints_every_table(tmp_path: Path) -> None:
    # run as a user would, from a directory of their own and without the suite's database and data settings
    stdout = run_quick("pipeline.py", timeout_s=900, cwd=tmp_path, unset=("TOCSIN_DATABASE_URL", "TOCSIN_DATA_DIR"))
    # its state stays in its own work directory: the deployment id's database was ./var/tocsin.db of the caller
    assert not (tmp_path / "var").exists()
    for title in ("Sustained throughput", "Where the time goes", "Peers at equal batch sizes", "Alert latency",
                  "records/s"):
        assert title in stdout

    throughput = table_rows(stdout, "Sustained throughput")
    assert [cells[0] for cells in throughput] == [  # the peers' mix at their other batch size (100) too
        "collective 300", "naive 300", "collective 300 cap 100", "high selectivity 300", "issue-16 mix 300",
        "issue-16 mix 300 naive", "key churn 300"]
    vs_naive = {cells[0]: cells[-1] for cells in throughput}
    assert number(vs_naive["issue-16 mix 300"]) > 0 and number(vs_naive["collective 300"]) > 0  # each against its mix
    assert all(number(cells[3]) > 0 for cells in throughput), throughput  # events/s from rows processed
    assert all(number(cells[13]) > 0 for cells in throughput), throughput  # peak RSS of the process tree
    assert all(number(cells[14]) > 0 for cells in throughput), throughput  # the first evaluation's batch, timed

    stages = {cells[0]: cells[1:] for cells in table_rows(stdout, "Where the time goes")}
    assert set(stages) == {cells[0] for cells in throughput}
    for name, (read, parse, _, evaluate, *_, total, share, steady, restore_ms, restores, per_boundary,
               transfer) in stages.items():
        assert number(per_boundary) > 0, (name, per_boundary)
        assert 0 < number(transfer) < number(evaluate), (name, transfer, evaluate)  # the host round trip, inside it
        assert all(number(c) > 0 for c in (read, parse, evaluate, total)), (name, stages[name])
        assert 0 <= number(share) <= 100 and len(restores.split("/")) == 3, (name, share, restores)
        assert steady == "nan" or 0 <= number(steady) <= number(share), (name, steady, share)  # rebuilds left out
        assert len(restore_ms.split("/")) == 3, (name, restore_ms)

    [two] = table_rows(stdout, "Two streams at once")
    name, trades_n, hosts_n, trades_rate, hosts_rate, total, single, finished, batches, *alerts, cpu, rss = two
    assert (name, trades_n, hosts_n, finished) == ("trades 300 + hosts 30", "300", "30", "yes/yes"), two
    assert all(number(c) > 0 for c in (trades_rate, hosts_rate, total, single, cpu, rss)), two
    assert all(int(b) >= 2 for b in batches.split("/")), two  # each stream drained in batches of the cap
    for verdict in alerts:  # each stream's transitions are the single-stream row's for the same subscriptions
        assert re.fullmatch(r"exact \(\d[\d,]*\)", verdict) and number(verdict[7:-1]) > 0, two

    rows = table_rows(stdout, "Peers at equal batch sizes")
    # quixstreams is a benchmark-only peer (the bench extra, .venv-bench): where it is missing the benchmark
    # says how to get it instead of failing
    quix = importlib.util.find_spec("quixstreams") is not None
    assert (QUIX_MISSING in stdout) != quix
    assert [cells[:3] for cells in rows] == [  # Tocsin and Spark at each batch size, then each at its best
        ["same batch", "Tocsin collective", "100"], ["same batch", "Spark window() 1 min", "100"],
        ["same batch", "Tocsin collective", "200"], ["same batch", "Spark window() 1 min", "200"],
        *[["per record", "quixstreams 1 min", "per record"]] * quix,
        ["each at its best", "Spark window() 1 min", rows[-1][2]],
    ], rows
    tocsin = {cells[2]: number(cells[3]) for cells in rows if cells[1] == "Tocsin collective"}
    for compared, name, batch, rate, rss, versus, ratio in rows:
        assert number(rate) > 0 and number(rss) > 0, (name, rate, rss)
        assert compared != "same batch" or versus == batch, (name, batch, versus)  # like with like
        assert abs(number(ratio) - tocsin[versus] / number(rate)) <= 0.02 * number(ratio), (name, ratio)  # as printed

    lives = table_rows(stdout, "Alert latency")
    assert [live[0] for live in lives] == ["alerts 100", "alerts 100, panes 250 ms"], lives
    for live, tick_wait in zip(lives, (1.99, 1.49), strict=True):  # panes of 1 s and of 250 ms, ticks every 1 s
        assert number(live[1]) > 0, live  # processed events/s after the warm-up
        assert number(live[8]) + number(live[9]) > 0, live  # alerts during and after the warm-up
        assert abs(number(live[14]) - number(live[4]) / 1000 - tick_wait) < 0.02, live  # tick floor: wait + batch
        if number(live[9]) > 0:  # timed from the deciding pane's first event, from its last, from the decision
            first_p99, last_p99, decision_p99 = number(live[12]), number(live[15]), number(live[17])
            assert first_p99 >= last_p99 - 0.01 and last_p99 >= decision_p99 + 0.5 - 0.01, live  # the 0.5 s delay
    profiles = table_rows(stdout, "Where a live batch's time goes")
    assert [profile[0] for profile in profiles] == [live[0] for live in lives], profiles
    assert all(number(profile[1]) > 0 and number(profile[5]) > 0 for profile in profiles), profiles  # addBatch
