"""The manager's Clusters view in headless Chromium, as a person uses it: the workers,
one not answering with why, the waiting AppWrappers with why they wait, where the sent ones
went; labels and contrast; markup in a reason shown as text. The manager here is the unit
tests' (stand-in API servers for the manager cluster and its workers); the cluster test
(tests/cluster/test_multicluster.py) reads the same view from a real one.

Screenshots go to $DASHBOARD_SCREENSHOTS (docs/images/ refreshes the documentation's),
else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dispatcher.controller.dashboard.clusters_view import Fleet, WorkerFacts
from dispatcher.controller.manager import clusters_facts
from tests import browser

from . import test_manager
from .test_clusters_view import serving
from .test_manager import Fleet as Stand
from .test_manager import Worker

HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


def cells(driver: Any, table: str) -> list[list[str]]:
    return list(driver.execute_script(
        f"return [...document.querySelectorAll('#{table} tbody tr')].map("
        "(r) => [...r.cells].map((c) => c.textContent))"))


def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@contextmanager
def page(loop: asyncio.AbstractEventLoop, facts: Callable[[], Fleet | str]) -> Iterator[str]:
    """The Clusters view's address, served on `loop`, run in a thread of its own."""
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, port = asyncio.run_coroutine_threadsafe(serving(facts), loop).result(60)
    try:
        yield f"http://127.0.0.1:{port}/dashboard/"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def a_fleet_with_one_worker_down() -> Stand:
    """Two workers; `a` sent to w1, `huge` waits; then w2 stops answering."""
    stand = Stand(Worker("w1"), Worker("w2", gpus=4))
    test_manager.FLEETS.remove(stand)  # closed here, once its loop is stopped
    stand.submit("a", gpus=6)
    stand.submit("huge", gpus=16)
    stand.cycle(2)
    stand.workers["w2"].down = True
    stand.now += 95
    stand.cycle()
    return stand


def test_an_administrator_sees_the_workers_one_down_with_why(tmp_path: Path) -> None:
    browser.skip_or_fail()
    stand = a_fleet_with_one_worker_down()
    try:
        with page(stand.loop, clusters_facts.source(stand.process, lambda: None)) as url, \
                browser.chromium() as driver:
            driver.get(url)
            assert browser.wait_until("the sign-in prompt", lambda: browser.problem(driver)) \
                == "Enter a bearer token to see the clusters."
            driver.find_element("id", "token").send_keys("alice-token")
            driver.find_element("css selector", "#login button[type=submit]").click()
            refusal = browser.wait_until("the refusal", lambda: browser.problem(
                driver).startswith("403") and browser.problem(driver))
            assert refusal == "403: alice may not list appwrappers in all namespaces"
            driver.find_element("id", "forget").click()
            driver.find_element("id", "token").send_keys("admin-token")
            driver.find_element("css selector", "#login button[type=submit]").click()
            workers = browser.wait_until("the workers", lambda: cells(driver, "workers-table"))
            check_workers(workers)
            check_queue(driver)
            assert driver.execute_script(browser.UNLABELLED) == []
            worst = driver.execute_script(browser.CONTRAST)
            assert all(ratio >= 4.5 for _, ratio in worst), worst
            driver.save_screenshot(str(shots(tmp_path) / "dashboard-clusters.png"))
    finally:
        stand.close()


def check_workers(workers: list[list[str]]) -> None:
    w1, w2 = workers
    assert (w1[0], w1[1], w1[2], w1[3]) == ("w1", "yes", "1", "2 of 8")
    assert w1[5] == "1 just sent"
    assert w2[0] == "w2" and w2[1].startswith("no for 1m35s: nodes: not watching")
    assert "connection refused" in w2[1]
    assert w2[3] == "4 of 4"  # as last seen


def check_queue(driver: Any) -> None:
    [huge] = cells(driver, "waiting-table")
    assert huge[:5] == ["1", "team/huge", "0", "16", huge[4]]
    assert "w1: 2 of 16 nvidia.com/gpu free on one node; w2: unreachable" in huge[5]
    assert cells(driver, "sent-table") == [["team/a", "w1", "just sent"]]
    summary = driver.find_element("id", "clusters-summary").text
    assert summary.startswith("2 worker clusters, 1 not answering; 1 waiting, 1 sent")


def test_markup_in_a_workers_reason_is_shown_as_text() -> None:
    """What a worker's API server says when it refuses is any text: the page shows it and
    runs none of it."""
    browser.skip_or_fail()
    facts = Fleet([WorkerFacts("w1", False, 5.0, HOSTILE, listed=False)], [], [], 1, 0.0,
                  0.0)
    loop = asyncio.new_event_loop()
    try:
        with page(loop, lambda: facts) as url, browser.chromium() as driver:
            driver.get(url + "#token=admin-token")
            [w1] = browser.wait_until("the worker", lambda: cells(driver, "workers-table"))
            assert w1[1] == f"no for 5s: {HOSTILE}"
            assert driver.title != "pwned" and "token" not in driver.current_url
            assert not driver.find_elements("css selector", "#workers-table img")
    finally:
        loop.close()
