"""The subscription form with lifecycle clauses, in a real browser: help lists them, live validation shows their
errors with the column, and a subscription with a pending period is created."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.users import PASSWORD
from tests.web.test_ui import browser, page, server  # the fixtures

__all__ = ["browser", "page", "server"]


def test_create_a_subscription_with_a_pending_period_from_the_form(server: str, page: Page) -> None:
    page.goto(server + "/signup")
    page.get_by_label("E-mail").fill("ada@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    page.get_by_role("link", name="Create your first subscription").click()
    page.locator("details.help summary").click()
    expect(page.locator("dl.lifecycle")).to_contain_text("KEEP FIRING FOR d")

    page.get_by_label("Name").fill("Held volume")
    condition = page.locator("#condition")
    condition.fill("SUM(volume) OVER 5m > 2e6 FOR 2m FOR 3m")
    live_error = page.locator('#condition-check [data-field="condition"]')
    expect(live_error).to_contain_text("FOR is given twice")
    expect(live_error).to_contain_text("column 34")

    condition.fill("sum(volume) over 5m > 2e6 for 2m keep firing for 5m")
    expect(page.locator("#condition-check .condition-ok")).to_contain_text(
        "SUM(volume) OVER 5m > 2000000 FOR 2m KEEP FIRING FOR 5m")
    expect(page.locator("#condition-check")).to_contain_text("once that has held for 2m")
    page.get_by_role("button", name="Create subscription").click()
    expect(page.get_by_role("heading", name="Held volume")).to_be_visible()
    expect(page.get_by_text("FOR 2m KEEP FIRING FOR 5m").first).to_be_visible()
