"""Headless Chromium for the dashboard's browser tests and its benchmark: Debian's
``chromium`` and ``chromedriver`` packages (``make browser`` installs them), driven with
selenium. No browser is downloaded.

Outside CI a test skips, saying why, when they are not installed; under ``CI=true`` it
fails instead, so the browser tests cannot silently not run there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "images"
# As root in a container: no sandbox, no GPU, nothing fetched in the background.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,900")

# The contrast of each element's text with the background it is drawn on (WCAG's
# relative luminance), for the elements that show text: [text, ratio] of the worst ones.
CONTRAST = """
function lum(c) {
  const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => {
    v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
function background(node) {
  for (; node; node = node.parentElement) {
    const c = getComputedStyle(node).backgroundColor;
    if (c && !c.startsWith("rgba(0, 0, 0, 0)") && c !== "transparent") return c;
  }
  return "rgb(255, 255, 255)";
}
const out = [];
for (const node of document.querySelectorAll("body *")) {
  if (!node.offsetParent || ![...node.childNodes].some(
      (n) => n.nodeType === 3 && n.textContent.trim())) continue;
  const a = lum(getComputedStyle(node).color), b = lum(background(node));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  out.push([node.textContent.trim().slice(0, 40), Math.round(ratio * 100) / 100]);
}
return out.sort((x, y) => x[1] - y[1]).slice(0, 5);
"""

# Form controls with no label a screen reader can read.
UNLABELLED = """
return [...document.querySelectorAll("input, select, button")].filter((e) =>
  !(e.labels && e.labels.length) && !e.getAttribute("aria-label")
  && !e.textContent.trim()).map((e) => e.outerHTML.slice(0, 80));
"""


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (make browser installs Debian's chromium)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make setup installs it)"
    return None


def skip_or_fail() -> None:
    """Skip a browser test that cannot run here; fail it under CI."""
    import pytest

    why = missing()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser tests must run in CI: {why}")
    pytest.skip(why)


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium, with a user data directory of its own."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dashboard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`check()`'s first true answer; fails saying `what` did not come within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.1)


def rows(driver: Any) -> list[list[str]]:
    """The queue table's rows as the page shows them, cell by cell."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll('#queue-table tbody tr')].map("
        "(r) => [...r.cells].map((c) => c.textContent))"))


def problem(driver: Any) -> str:
    return str(driver.execute_script(
        "const p = document.getElementById('problem'); return p.hidden ? '' : p.textContent"))
