"""The dashboard in headless Chromium, as a person uses it: what the page shows to a
tenant and to an administrator, a refusal shown in words, labels, contrast and the
keyboard. The controller here is the unit tests' (a stand-in API server); the cluster
test (tests/cluster/test_dashboard.py) does the same against a real one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.controller.loop.runtime import Dispatcher
from tests import browser

from .fake_kube import FakeKube
from .test_dashboard import queue_with_a_held_one, serving
from .test_runtime import Clock


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    """The dashboard's address, served on an event loop of its own."""
    browser.skip_or_fail()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def up() -> tuple[Any, int]:
        clock = Clock()
        d: Dispatcher = await queue_with_a_held_one(FakeKube(clock), clock)
        return await serving(d)

    server, port = asyncio.run_coroutine_threadsafe(up(), loop).result(60)
    try:
        yield f"http://127.0.0.1:{port}/dashboard/"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def sign_in(driver: Any, token: str, namespaces: str = "") -> None:
    driver.find_element("id", "token").send_keys(token)
    driver.find_element("id", "namespaces").send_keys(namespaces)
    driver.find_element("css selector", "#login button[type=submit]").click()


def test_a_tenant_sees_its_namespace_in_the_controllers_order(page: str,
                                                             tmp_path: Path) -> None:
    with browser.chromium() as driver:
        driver.get(page)
        assert browser.wait_until("the sign-in prompt", lambda: browser.problem(driver)) \
            == "Enter a bearer token to see the queue."
        sign_in(driver, "alice-token", "team-a")
        shown = browser.wait_until("alice's rows", lambda: browser.rows(driver))
        assert [(r[0], r[1], r[2]) for r in shown] == [
            ("2", "team-a/a-high", "waiting"), ("3", "team-a/a-low", "waiting"),
            ("-", "team-a/a-held", "held by carol")]
        assert shown[0][3] == "quota_gpu/gold" and shown[0][4] == "Job"
        assert "needs 16 nvidia.com/gpu, 8 nvidia.com/gpu free" in shown[0][8]  # in words
        assert shown[2][8].startswith("held by carol")
        summary = driver.find_element("id", "queue-summary").text
        assert summary.startswith("3 waiting shown of 3 in team-a")
        driver.save_screenshot(str(tmp_path / "tenant.png"))
        # Asking for a namespace it may not list: the refusal, in words; no rows change.
        driver.find_element("id", "namespaces").send_keys(",team-b")
        driver.find_element("css selector", "#login button[type=submit]").click()
        assert browser.wait_until("the refusal", lambda: browser.problem(driver)) == (
            "403: alice may not list appwrappers in namespace team-b")


def test_a_token_in_the_fragment_is_taken_and_dropped_from_the_address(page: str) -> None:
    with browser.chromium() as driver:
        driver.get(page + "#token=admin-token")
        shown = browser.wait_until("every namespace's rows",
                                   lambda: len(browser.rows(driver)) == 4
                                   and browser.rows(driver))
        assert [r[1] for r in shown] == ["team-b/b-high", "team-a/a-high", "team-a/a-low",
                                        "team-a/a-held"]
        assert "token" not in driver.current_url
        # Filter by state: only the held one.
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element("id", "f-state")).select_by_value("held")
        assert browser.wait_until("the held row", lambda: len(browser.rows(driver)) == 1
                                  and browser.rows(driver))[0][1] == "team-a/a-held"


def test_labels_contrast_and_keyboard(page: str) -> None:
    from selenium.webdriver.common.keys import Keys

    with browser.chromium() as driver:
        driver.get(page + "#token=admin-token")
        browser.wait_until("the rows", lambda: browser.rows(driver))
        assert driver.execute_script(browser.UNLABELLED) == []
        worst = driver.execute_script(browser.CONTRAST)
        assert all(ratio >= 4.5 for _, ratio in worst), worst
        # From the Queue tab, the arrow keys move between views.
        tab = driver.find_element("id", "tab-queue")
        tab.send_keys(Keys.ARROW_RIGHT)
        browser.wait_until("the timeline", lambda: driver.find_element(
            "id", "timeline").is_displayed())
        assert driver.switch_to.active_element.get_attribute("id") == "tab-timeline"
        driver.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
        browser.wait_until("the teams", lambda: "gold" in driver.find_element(
            "id", "teams-table").text)
        driver.switch_to.active_element.send_keys(Keys.HOME)
        browser.wait_until("the queue", lambda: browser.rows(driver))
        # Tab to the first AppWrapper and open it with Enter.
        for _ in range(40):
            driver.switch_to.active_element.send_keys(Keys.TAB)
            if driver.switch_to.active_element.text == "team-b/b-high":
                break
        driver.switch_to.active_element.send_keys(Keys.ENTER)
        detail = browser.wait_until("the AppWrapper's page", lambda: driver.find_element(
            "id", "detail-body").text)
        assert "team-b/b-high" in detail and "Conditions, in order" in detail
        # The administrator may list AppWrappers everywhere but Events in team-a only.
        assert "Events: shown to users who may list Events in namespace team-b" in detail


HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


def test_markup_an_attacker_puts_in_an_annotation_is_shown_as_text() -> None:
    """The held-by annotation is any text a user with patch rights writes: the page shows
    it, and runs none of it."""
    browser.skip_or_fail()

    async def up() -> tuple[Any, int]:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock, held_by=HOSTILE)
        return await serving(d)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, port = asyncio.run_coroutine_threadsafe(up(), loop).result(60)
    try:
        with browser.chromium() as driver:
            driver.get(f"http://127.0.0.1:{port}/dashboard/#token=admin-token")
            shown = browser.wait_until("the rows", lambda: len(browser.rows(driver)) == 4
                                       and browser.rows(driver))
            assert shown[3][2] == f"held by {HOSTILE}"
            assert driver.execute_script(
                "return document.querySelectorAll('#queue-table img').length") == 0
            assert driver.title == "dispatcher: the queue"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


# --- addresses: each view and each AppWrapper's page has its own -----------------------------

def shown_view(driver: Any) -> list[str]:
    """The views whose tab is selected."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll('[role=tab][aria-selected=true]')]"
        ".map((t) => t.getAttribute('aria-controls'))"))


def test_an_appwrappers_address_opens_its_page_for_a_tenant_sent_the_link(
        page: str, tmp_path: Path) -> None:
    """Alice was sent the address of her AppWrapper's page: she opens it, gives her token
    (no namespaces: the page asks as a viewer of the AppWrapper's own namespace) and sees
    that AppWrapper, at that address."""
    with browser.chromium() as driver:
        driver.get(page + "#/aw/team-a/a-high")
        assert browser.wait_until("the sign-in prompt", lambda: browser.problem(driver)) \
            == "Enter a bearer token to see the queue."
        sign_in(driver, "alice-token")
        detail = browser.wait_until("a-high's page", lambda: driver.find_element(
            "id", "detail-body").text)
        assert detail.startswith("team-a/a-high") and "Conditions, in order" in detail
        assert shown_view(driver) == ["detail"]
        assert driver.current_url == page + "#/aw/team-a/a-high"
        assert driver.title == "dispatcher: team-a/a-high"
        assert driver.find_element("id", "detail-address").text \
            == page + "#/aw/team-a/a-high"
        assert browser.problem(driver) == ""
        driver.save_screenshot(str(tmp_path / "detail.png"))


def test_views_change_the_address_and_back_and_forward_return(page: str,
                                                             tmp_path: Path) -> None:
    with browser.chromium() as driver:
        driver.get(page + "#token=admin-token")
        browser.wait_until("the rows", lambda: browser.rows(driver))
        driver.find_element("id", "tab-teams").click()
        browser.wait_until("the teams", lambda: "gold" in driver.find_element(
            "id", "teams-table").text)
        assert driver.current_url == page + "#/teams"
        driver.find_element("id", "tab-history").click()
        browser.wait_until("the history", lambda: driver.find_element(
            "id", "history").is_displayed())
        assert driver.current_url == page + "#/history"
        driver.find_element("id", "tab-queue").click()
        browser.wait_until("the rows", lambda: browser.rows(driver))
        assert driver.current_url == page + "#/queue"
        driver.find_element("link text", "team-b/b-high").click()
        browser.wait_until("b-high's page", lambda: "team-b/b-high" in driver.find_element(
            "id", "detail-body").text)
        assert driver.current_url == page + "#/aw/team-b/b-high"
        # A filter is part of the queue's address.
        driver.back()
        browser.wait_until("the queue again", lambda: shown_view(driver) == ["queue"])
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element("id", "f-state")).select_by_value("held")
        assert browser.wait_until("the held row", lambda: len(browser.rows(driver)) == 1
                                  and browser.rows(driver))[0][1] == "team-a/a-held"
        assert driver.current_url == page + "#/queue?state=held"
        driver.back()
        browser.wait_until("every row", lambda: len(browser.rows(driver)) == 4)
        assert driver.current_url == page + "#/queue"
        driver.back()
        browser.wait_until("the history again", lambda: shown_view(driver) == ["history"])
        assert driver.find_element("id", "history").is_displayed()
        assert not driver.find_element("id", "queue").is_displayed()
        driver.forward()
        browser.wait_until("the queue again", lambda: shown_view(driver) == ["queue"])
        driver.forward()
        browser.wait_until("the held row again", lambda: len(browser.rows(driver)) == 1)
        assert driver.current_url == page + "#/queue?state=held"
        # Opened afresh, an address with a filter shows the queue filtered.
        driver.get(page + "#/queue?state=held")
        assert browser.wait_until("the held row", lambda: len(browser.rows(driver)) == 1
                                  and browser.rows(driver))[0][1] == "team-a/a-held"
        assert driver.find_element("id", "f-state").get_attribute("value") == "held"
        driver.save_screenshot(str(tmp_path / "filtered.png"))


def test_an_address_that_names_nothing_says_so(page: str, tmp_path: Path) -> None:
    with browser.chromium() as driver:
        driver.get(page + "#token=admin-token")
        browser.wait_until("the rows", lambda: browser.rows(driver))
        driver.get(page + "#/aw/team-a/nope")
        said = browser.wait_until("not found", lambda: driver.find_element(
            "id", "detail-body").text)
        assert said == ("team-a/nope\nNot found: no AppWrapper team-a/nope is known to the "
                        "dispatcher. It may have been deleted, or the address names another "
                        "AppWrapper.")
        assert shown_view(driver) == ["detail"]
        driver.save_screenshot(str(tmp_path / "not-found.png"))
        # The page of one that exists, then an unknown one: nothing of the first remains.
        driver.get(page + "#/aw/team-a/a-low")
        browser.wait_until("a-low's page", lambda: "Conditions" in driver.find_element(
            "id", "detail-body").text)
        driver.get(page + "#/aw/team-b/gone")
        assert browser.wait_until("not found", lambda: "Not found" in driver.find_element(
            "id", "detail-body").text and driver.find_element("id", "detail-body").text) \
            .startswith("team-b/gone\nNot found: no AppWrapper team-b/gone")
        for nowhere in ("#/nowhere", "#/aw/team-a", "#/teams/x", "#/queue?colour=red"):
            driver.get(page + nowhere)
            assert browser.wait_until(nowhere, lambda: browser.problem(driver)) == (
                f"No page at this address ({nowhere}): the views are #/queue, #/timeline, "
                "#/teams, #/history and #/aw/NAMESPACE/NAME.")
            assert shown_view(driver) == []
            assert not driver.find_element("id", "queue").is_displayed()
        driver.save_screenshot(str(tmp_path / "nowhere.png"))
        driver.find_element("id", "tab-queue").click()
        browser.wait_until("the rows", lambda: browser.rows(driver))
        assert browser.problem(driver) == ""


LINKS = "return [location.href, ...[...document.querySelectorAll('a')].map((a) => a.href)]"


def test_no_address_the_page_builds_carries_the_token(page: str) -> None:
    with browser.chromium() as driver:
        driver.get(page + "#/aw/team-a/a-high?token=admin-token&namespaces=team-a")
        browser.wait_until("a-high's page", lambda: "Conditions" in driver.find_element(
            "id", "detail-body").text)
        assert driver.current_url == page + "#/aw/team-a/a-high"
        seen = driver.execute_script(LINKS)
        driver.find_element("id", "tab-queue").click()
        browser.wait_until("the rows", lambda: len(browser.rows(driver)) == 3)
        seen += driver.execute_script(LINKS)
        for tab in ("timeline", "history", "detail"):
            driver.find_element("id", f"tab-{tab}").click()
            browser.wait_until(tab, lambda: shown_view(driver) == [tab])  # noqa: B023
            seen += driver.execute_script(LINKS)
        assert page + "#/aw/team-a/a-high" in seen and page + "#/aw/team-a/a-held" in seen
        assert not [address for address in seen if "admin-token" in address
                    or "token=" in address]
        # Back through every address the tab visited: none carries it either.
        for _ in range(6):
            driver.back()
            assert "token" not in driver.current_url
