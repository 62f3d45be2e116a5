"""The settings object's own behaviour: what the environment can say, and what a child process inherits."""

from __future__ import annotations

import pytest

from core.settings import Settings


def test_null_unsets_an_optional_setting_and_a_child_process_inherits_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting whose default is a value (the sink's and the admission's limits) can be unset from the environment,
    and ``to_env`` passes the unset on: a child started from it does not fall back to the default."""
    monkeypatch.setenv("TOCSIN_EVALUATOR_ADMISSION_TRANSITIONS", "null")
    parent = Settings(_env_file=None, sink_batch_transitions=None)
    assert parent.evaluator_admission_transitions is None and parent.sink_batch_transitions is None
    monkeypatch.delenv("TOCSIN_EVALUATOR_ADMISSION_TRANSITIONS")
    env = parent.to_env()
    assert env["TOCSIN_SINK_BATCH_TRANSITIONS"] == "null"
    assert "TOCSIN_EVALUATOR_SHARDS" not in env  # unset by default: nothing to pass
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings(_env_file=None)
    assert child.evaluator_admission_transitions is None and child.sink_batch_transitions is None
    assert child.to_env() == env
