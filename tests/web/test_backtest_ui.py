"""The subscription form's backtest panel in a real browser: history on the topic, a worker of the backtests lane,
the panel's progress, its counts, and a uPlot chart per key with the firings marked."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect

from core.settings import Settings
from tests.notifier.test_backtests import publish_history, worker
from tests.processes import running
from tests.users import PASSWORD
from tests.web.test_ui import browser, page, server  # the fixtures

__all__ = ["browser", "page", "server"]


@pytest.mark.jvm  # a worker process beside the browser: one such test at a time
@pytest.mark.parametrize(("condition", "explained"), [
    ("SUM(volume) OVER 5s > 40", "is above 40"),
    ("SUM(volume) OVER 5s IN TOP 1", "is the highest of all keys with events in that window"),  # a rank
])
def test_backtest_a_condition_from_the_form(settings: Settings, server: str, page: Page, tmp_path, condition: str,
                                            explained: str) -> None:
    publish_history(settings, (int(time.time() * 1000) - 1_800_000) // 1000 * 1000, 90)
    with running(settings, tmp_path / "logs", worker(settings)):
        page.goto(server + "/signup")
        page.get_by_label("E-mail").fill("lin@example.com")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign up").click()
        page.get_by_role("link", name="Create your first subscription").click()
        page.locator("#condition").fill(condition)
        expect(page.locator("#condition-check")).to_contain_text(explained)  # the form explains it as typed
        page.get_by_label("Backtest over the last").select_option("1")
        page.get_by_role("button", name="How often would it have fired?").click()
        done = page.locator('#backtest .backtest[data-state="done"]')
        expect(done).to_be_visible(timeout=120_000)
        expect(done.locator(".backtest-summary")).to_contain_text("firings")
        expect(done.locator(".backtest-keys")).to_contain_text("AAA")
        expect(done.locator(".backtest-chart canvas").first).to_be_visible()
        assert page.evaluate("window.tocsinBacktestPlots.length") >= 1
