"""How infra/test spreads the suite over its two pytest-xdist workers (``--dist loadgroup --no-loadscope-reorder``).

The JVM tests once all ran on one worker, one at a time, while the other took the rest: on 2026-11-28 they
summed to 41.5 min of an idle CI-mode run and the rest to 35 min, so the JVM worker alone was the critical path,
and more so as the JVM suites grow. Now the JVM tests form
two groups, split by module: the *first* group is handed out first, to one worker; the other worker takes the
rest one test at a time, then the *second* group. Sized so both workers end together, at most two JVM suites
run at a time, never the one-JVM-test-per-worker free-for-all that once doubled a run (tests/test_suite_groups.py).

The sizes come from ``tests/suite_durations.json``: each JVM test's seconds (setup, call and teardown) and the
mean of the others, from a CI-mode run's JUnit report (``python -m tests.suite_plan report.xml`` rewrites it).
A test not listed counts :data:`UNLISTED_S`. Stale figures only unbalance the two workers, never change what runs.
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


@cache
def durations() -> dict:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {"jvm": {}, "other_mean_s": 2.0}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def test_key(nodeid: str) -> str:
    """A test's key in the durations: its node id without pytest-xdist's ``@group`` suffix."""
    return nodeid.split("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid


def split(jvm: Iterable[str], others: int) -> dict[str, str]:
    """The group of each module of the ``jvm`` tests (node ids): the first group gets about (JVM + other) / 2
    seconds, the second the rest, so the worker that runs the ``others`` tests, then the second group, ends with
    the one that runs the first."""
    known = durations()["jvm"]
    cost: dict[str, float] = {}
    for nodeid in jvm:
        cost[module_of(nodeid)] = cost.get(module_of(nodeid), 0.0) + known.get(test_key(nodeid), UNLISTED_S)
    target = (sum(cost.values()) + others * durations()["other_mean_s"]) / 2
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


def from_junit(report: Path) -> dict:
    """The durations file's content from a CI-mode run's ``--junitxml`` report."""
    jvm: dict[str, float] = {}
    others: list[float] = []
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and module[-1][:1].isupper():  # a test class: part of the name, not of the path
            module.pop()
        name = case.get("name", "")
        nodeid = "/".join(module) + ".py::" + name
        seconds = float(case.get("time", 0.0))
        if name.endswith(("@" + FIRST, "@" + SECOND)):
            jvm[test_key(nodeid)] = round(seconds, 1)
        elif case.find("skipped") is None:
            others.append(seconds)
    return {"jvm": dict(sorted(jvm.items())), "other_mean_s": round(sum(others) / max(len(others), 1), 2)}


if __name__ == "__main__":
    from core import cli

    args = cli.parser(f"Rewrite {DURATIONS.name} from a CI-mode run's JUnit report (pytest --junitxml=REPORT).",
                      "python -m tests.suite_plan")
    args.add_argument("report", type=Path, help="the run's --junitxml file")
    DURATIONS.write_text(json.dumps(from_junit(args.parse_args().report), indent=1) + "\n")
