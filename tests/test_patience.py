"""One factor scales every deadline a test waits on, and pytest-timeout's limit with it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devstack.patience import ENV, patient

ROOT = Path(__file__).resolve().parents[1]


def test_the_factor_scales_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert patient(60) == 60
    monkeypatch.setenv(ENV, "2.5")
    assert patient(60) == 150


@pytest.mark.parametrize("bad", ["0", "-1", "slow", "nan"])
def test_a_factor_that_is_not_a_positive_number_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(ValueError, match=ENV):
        patient(1)


@pytest.mark.slow  # CI: a whole pytest run of its own (~14 s)
def test_pytest_timeout_grows_with_the_factor(tmp_path: Path) -> None:
    """A test that sleeps past the configured limit passes once the factor stretches it (the ini limit and a mark)."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_collection_modifyitems\n")
    (tmp_path / "test_sleeps.py").write_text(textwrap.dedent("""
        import time
        import pytest

        def test_ini_limit():
            time.sleep(1.5)

        @pytest.mark.timeout(1)
        def test_mark_limit():
            time.sleep(1.5)
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\n")

    def run(factor: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=patient(120),
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), ENV: factor})

    assert "2 failed" in run("1").stdout
    assert "2 passed" in run("4").stdout
