"""The backtest benchmark still runs: its three tables, with an evaluation that produced transitions and a read that
found every record it published."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def row_of(lines: list[str], title: str) -> list[str]:
    """The first row of the table titled ``title...`` (title, header, dashes, row)."""
    [at] = [i for i, line in enumerate(lines) if line.startswith(title)]
    return [cell.replace(",", "") for cell in lines[at + 3].split()]


def test_quick_run_prints_the_tables() -> None:
    lines = run_quick("backtest.py").splitlines()
    evaluated = row_of(lines, "Backtest, evaluate")
    assert evaluated[:2] == ["0.25", "h"] and int(evaluated[4]) > 100_000 and int(evaluated[8]) > 0  # "2 s" is two cells
    records, *_, rate = row_of(lines, "Backtest, read")
    assert int(records) >= 20_000 and float(rate) > 0
    day, evaluate_s, read_s, total_s, _ = row_of(lines, "Backtest, a day")
    assert int(day) == 300 * 86_400
    # each figure is rounded as printed (3 significant digits, whole from 100 up: 1,220 + 1,420 printed a total of 2,639)
    unit = max(10.0 ** -len(cell.partition(".")[2]) for cell in (evaluate_s, read_s, total_s))
    assert abs(float(total_s) - float(evaluate_s) - float(read_s)) <= 1.5 * unit + 1e-9
