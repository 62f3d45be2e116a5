"""How infra/test spreads the suite over its two pytest-xdist workers (``--dist loadgroup --no-loadscope-reorder``).

The JVM tests once all ran on one worker, one at a time, while the other took the rest: on 2026-11-28 they
summed to 41.5 min of an idle CI-mode run and the rest to 35 min, so the JVM worker alone was the critical path,
and more so as the JVM suites grow. Now the JVM tests form
two groups, split by module: the *first* group is handed out first, to one worker; the other worker takes the
rest one test at a time, then the *second* group. Sized so both workers end together, at most two JVM suites
run at a time, never the one-JVM-test-per-worker free-for-all that once doubled a run (tests/test_suite_groups.py).

The sizes come from ``tests/suite_durations.json``: each test's seconds (setup, call and teardown) in a run's
JUnit report (``python -m tests.suite_plan report.xml`` writes those it ran over the old figures). A JVM test not
listed counts :data:`UNLISTED_S`, another :data:`OTHER_UNLISTED_S`. Stale figures only unbalance the workers
or move a test in or out of ``quick``.

The same figures mark the inner loop's tests ``quick`` (``infra/test -m quick``): neither JVM nor slow, and not
measured above :data:`HEAVY_S` (a test not measured yet is quick: it is most likely the one being written).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

FIRST, SECOND = "jvm", "jvm-2"
DURATIONS = Path(__file__).with_name("suite_durations.json")
UNLISTED_S = 30.0
OTHER_UNLISTED_S = 1.0
HEAVY_S = 2.0  # the inner loop leaves out the tests measured above: ~110 tests, ~70 % of the non-JVM work


@cache
def durations() -> dict[str, float]:
    """Each measured test's seconds, by node id (no pytest-xdist group suffix)."""
    return json.loads(DURATIONS.read_text())["seconds"] if DURATIONS.exists() else {}


def quick(nodeid: str) -> bool:
    """Measured at most :data:`HEAVY_S`, or not measured yet (the caller leaves out JVM and slow tests)."""
    return durations().get(test_key(nodeid), 0.0) <= HEAVY_S


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def test_key(nodeid: str) -> str:
    """A test's key in the durations: its node id without pytest-xdist's ``@group`` suffix."""
    return nodeid.split("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid


def split(jvm: Iterable[str], others: Iterable[str]) -> dict[str, str]:
    """The group of each module of the ``jvm`` tests (node ids): the first group gets about (JVM + other) / 2
    seconds, the second the rest, so the worker that runs the ``others`` tests, then the second group, ends with
    the one that runs the first."""
    known = durations()
    cost: dict[str, float] = {}
    for nodeid in jvm:
        cost[module_of(nodeid)] = cost.get(module_of(nodeid), 0.0) + known.get(test_key(nodeid), UNLISTED_S)
    target = (sum(cost.values()) + sum(known.get(test_key(n), OTHER_UNLISTED_S) for n in others)) / 2
    groups: dict[str, str] = {}
    first = 0.0
    for module in sorted(cost, key=lambda m: (-cost[m], m)):  # largest first: a greedy fill close to the target
        group = FIRST if first == 0.0 or first + cost[module] <= target else SECOND
        first += cost[module] if group == FIRST else 0.0
        groups[module] = group
    return groups


def order(groups: Sequence[str | None]) -> list[int]:
    """Indexes of the tests (each one's JVM group, or None) in run order: the first JVM group, then the rest, then
    the second JVM group (with ``--no-loadscope-reorder`` pytest-xdist hands out the work in this order)."""
    rank = {FIRST: 0, None: 1, SECOND: 2}
    return sorted(range(len(groups)), key=lambda i: rank[groups[i]])


def from_junit(report: Path, previous: dict[str, float], root: Path) -> dict:
    """The durations file's content: each test the ``--junitxml`` report ran (not skipped), over the ``previous``
    figures of the tests it did not run (a default run leaves the slow ones out) whose modules still exist."""
    measured = {nodeid: seconds for nodeid, seconds in previous.items() if (root / module_of(nodeid)).exists()}
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and module[-1][:1].isupper():  # a test class: part of the name, not of the path
            module.pop()
        if case.find("skipped") is None:
            measured[test_key("/".join(module) + ".py::" + case.get("name", ""))] = round(float(case.get("time", 0)), 2)
    return {"seconds": dict(sorted(measured.items()))}


if __name__ == "__main__":
    from core import cli

    args = cli.parser(f"Write the seconds of the tests a run's JUnit report (pytest --junitxml=REPORT) holds into "
                      f"{DURATIONS.name}; the other tests keep theirs.", "python -m tests.suite_plan")
    args.add_argument("report", type=Path, help="the run's --junitxml file")
    written = from_junit(args.parse_args().report, durations(), DURATIONS.parents[1])
    DURATIONS.write_text(json.dumps(written, indent=1) + "\n")
