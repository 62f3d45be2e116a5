"""The suite's own layout: on pytest-xdist with ``--dist loadgroup`` (infra/test), each JVM test is in one of the two
JVM groups (tests/suite_plan.py), whose tests run one at a time on one worker.

Two causes each stopped the grouping silently, and this test failed with each: ``tests/conftest.py`` marked the
tests after pytest-xdist had read the marks (its hook now runs first), and pytest 9.2 keeps node ids where
pytest-xdist 3.8 cannot add the group (pytest is held below 9.2). The JVM suites then ran two at a time on two
cores, the CI run took twice as long and timing-bound tests failed."""

from __future__ import annotations

import pytest


@pytest.mark.jvm
def test_a_jvm_test_is_in_a_jvm_group(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on pytest-xdist with --dist loadgroup: nothing is grouped")
    assert request.node.nodeid.endswith(("@jvm", "@jvm-2")), request.node.nodeid


def test_the_first_group_takes_half_of_all_the_work_and_runs_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import suite_plan

    known = {"a.py::t1": 400.0, "a.py::t2": 200.0, "b.py::t": 300.0, "c.py::t": 200.0, "d.py::t": 100.0,
             "f.py::t": 399.0}
    monkeypatch.setattr(suite_plan, "durations", lambda: known)
    others = ["f.py::t", "g.py::t"]  # g unlisted: OTHER_UNLISTED_S
    groups = suite_plan.split([*(f"{k}@jvm" for k in list(known)[:5]), "e.py::t[x]"], others)  # e: UNLISTED_S
    cost = {"a.py": 600.0, "b.py": 300.0, "c.py": 200.0, "d.py": 100.0, "e.py": suite_plan.UNLISTED_S}
    first = sum(cost[m] for m, g in groups.items() if g == suite_plan.FIRST)
    assert groups["a.py"] == suite_plan.FIRST and set(groups.values()) == {suite_plan.FIRST, suite_plan.SECOND}
    assert first == 800.0  # (1230 + 399 + 1) / 2 = 815: a and c; b would overshoot, d and e go second
    assert suite_plan.order([suite_plan.SECOND, None, suite_plan.FIRST, None]) == [2, 1, 3, 0]


def test_quick_is_measured_at_most_heavy_s_or_not_measured_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import suite_plan

    monkeypatch.setattr(suite_plan, "durations", lambda: {"a.py::light": suite_plan.HEAVY_S, "a.py::heavy": 40.0})
    assert suite_plan.quick("a.py::light") and suite_plan.quick("a.py::new[1]")
    assert not suite_plan.quick("a.py::heavy") and not suite_plan.quick("a.py::heavy@jvm")


def test_quick_marks_the_inner_loop(request: pytest.FixtureRequest) -> None:
    """This test is neither JVM nor slow and measured light: conftest marked it (``infra/test -m quick``)."""
    assert request.node.get_closest_marker("quick") is not None


def test_the_durations_are_read_from_a_junit_report_over_the_previous_ones(tmp_path) -> None:
    from tests import suite_plan

    report = tmp_path / "report.xml"
    report.write_text("""<testsuites><testsuite>
      <testcase classname="tests.devstack.test_runner" name="test_a[x]@jvm-2" time="12.344"/>
      <testcase classname="tests.web.test_ui.TestPages" name="test_b" time="1.0"/>
      <testcase classname="tests.web.test_ui" name="test_c" time="3.0"/>
      <testcase classname="tests.web.test_ui" name="test_d" time="0.0"><skipped/></testcase>
    </testsuite></testsuites>""")
    for module in ("tests/devstack/test_runner.py", "tests/web/test_ui.py", "tests/test_kept.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).touch()
    previous = {"tests/web/test_ui.py::test_c": 9.0, "tests/test_kept.py::test_slow": 50.0,
                "tests/test_gone.py::test_x": 1.0}
    assert suite_plan.from_junit(report, previous, tmp_path) == {"seconds": {
        "tests/devstack/test_runner.py::test_a[x]": 12.34, "tests/test_kept.py::test_slow": 50.0,
        "tests/web/test_ui.py::test_b": 1.0, "tests/web/test_ui.py::test_c": 3.0}}


def test_property_tests_draw_every_example_in_ci_and_a_third_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import examples

    monkeypatch.setattr(examples, "FULL", True)
    assert examples.examples(120) == 120
    monkeypatch.setattr(examples, "FULL", False)
    assert (examples.examples(120), examples.examples(12)) == (40, 10)
