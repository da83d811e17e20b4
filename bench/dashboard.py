"""The dashboard with a long queue: what a refresh costs the controller, and how long the
page takes to show its first rows in headless Chromium.

One process: a dispatcher (the unit tests' stand-in API server, so that nothing but the
dashboard is measured) holding --wrappers waiting AppWrappers in --namespaces namespaces,
one admission cycle run, then the dashboard served on a local port. Prints, side by side:

- CPU per refresh of /dashboard/api/queue (a page of 100 rows), measured in the server's
  handler with the token check answered from its cache: a refresh that gathers the rows
  from memory again (a new numbering, or every 5 s), one that reuses them (another viewer,
  another filter or page within those 5 s), and one answered "unchanged" (the page's own
  poll every 5 s while nothing changed); each the median of --rounds;
- the answer's size;
- the page in Chromium: from navigation to the first 100 rows drawn, median of --loads
  fresh browser profiles (Debian's chromium; skipped, saying so, when not installed).

Usage: python bench/dashboard.py [--wrappers 10000] [--namespaces 50] [--rounds 20]
       [--loads 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiohttp import ClientSession  # noqa: E402

from dispatcher.controller.dashboard.api import DashboardApi  # noqa: E402
from dispatcher.controller.loop.runtime import Dispatcher  # noqa: E402
from dispatcher.controller.metrics.prometheus import PrometheusObserver  # noqa: E402
from dispatcher.controller.metrics.server import MetricsServer  # noqa: E402
from dispatcher.queue import Policy  # noqa: E402
from tests import browser  # noqa: E402
from tests.unit.fake_authz import FakeApi  # noqa: E402
from tests.unit.fake_kube import FakeKube  # noqa: E402
from tests.unit.test_metrics_auth import auth  # noqa: E402
from tests.unit.test_runtime import Clock, appwrapper, job, node  # noqa: E402

TOKEN = "admin-token"
PAGE_ROWS = 100


async def long_queue(wrappers: int, namespaces: int) -> Dispatcher:
    clock = Clock()
    kube = FakeKube(clock)
    for i in range(4):
        kube.put(node(f"n{i}"))  # 32 GPUs: four 8-GPU gangs run, the rest wait
    for i in range(wrappers):
        obj = appwrapper(f"w{i:05d}", job(f"w{i:05d}", 1, 8), created=i % 60, priority=i % 7)
        obj["metadata"]["namespace"] = f"ns{i % namespaces:02d}"
        kube.put(obj)
    d = Dispatcher(kube, Policy("priority", order="priority"), clock=clock)  # type: ignore[arg-type]
    for obj in kube.of_kind("Node"):
        d.on_node("ADDED", obj)
    for obj in kube.of_kind("AppWrapper"):
        d.on_appwrapper("ADDED", obj)
    await d.cycle()
    d.ready = True
    return d


async def fetch(port: int, query: str) -> tuple[float, int, dict[str, Any]]:
    """The server's CPU for one answer (this process runs only the server meanwhile:
    the client's share, reading the socket, is small and counted), its size, its body."""
    async with ClientSession() as s:
        start = time.process_time()
        async with s.get(f"http://127.0.0.1:{port}/dashboard/api/queue?{query}",
                         headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            body = await r.read()
            cpu = time.process_time() - start
            assert r.status == 200, body[:200]
            return cpu, len(body), json.loads(body)


async def refresh_costs(api: DashboardApi, port: int, rounds: int
                        ) -> dict[str, tuple[float, int]]:
    await fetch(port, "limit=100")  # the token checked, the rows gathered once
    costs: dict[str, list[float]] = {"gathered again": [], "rows reused": [], "unchanged": []}
    sizes: dict[str, int] = {}
    for _ in range(rounds):
        api._gathered = None  # as after a new numbering
        cpu, size, _ = await fetch(port, "limit=100")
        costs["gathered again"].append(cpu)
        sizes["gathered again"] = size
        cpu, size, body = await fetch(port, "limit=100&offset=5000")
        costs["rows reused"].append(cpu)
        sizes["rows reused"] = size
        cpu, size, _ = await fetch(port, f"limit=100&since={body['version']}")
        costs["unchanged"].append(cpu)
        sizes["unchanged"] = size
    return {k: (statistics.median(v), sizes[k]) for k, v in costs.items()}


def first_rows_ms(address: str) -> float:
    """From navigation to 100 rows in the table, as the page's own clock says."""
    with browser.chromium() as driver:
        driver.get(f"{address}#token={TOKEN}")
        return float(browser.wait_until("the first rows", lambda: driver.execute_script(
            f"return document.querySelectorAll('#queue-table tbody tr').length >= {PAGE_ROWS}"
            " && performance.now()"), timeout=120))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wrappers", type=int, default=10_000)
    ap.add_argument("--namespaces", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--loads", type=int, default=3)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    started = time.monotonic()
    d = run(long_queue(args.wrappers, args.namespaces))
    print(f"{args.wrappers} AppWrappers taken in and one cycle run in "
          f"{time.monotonic() - started:.1f}s; {len(d.positions.snapshot.entries)} numbered")
    api = DashboardApi(lambda: d, auth(FakeApi({"admin": {
        "list appwrappers.workload.codeflare.dev"}}, {TOKEN: {"username": "admin"}})))
    server = MetricsServer(PrometheusObserver(), 0, "127.0.0.1", dashboard=api)
    run(server.start())
    port = server.addresses()[0][1]
    costs = run(refresh_costs(api, port, args.rounds))
    loads = []
    why = browser.missing()
    if why is None:
        loads = [first_rows_ms(f"http://127.0.0.1:{port}/dashboard/") for _ in range(args.loads)]
    run(server.stop())
    print(f"\n{'refresh of /dashboard/api/queue':34} {'CPU ms (median)':>16} {'bytes':>9}")
    for what, (cpu, size) in costs.items():
        print(f"{what:34} {cpu * 1000:16.1f} {size:9d}")
    if loads:
        print(f"\npage in Chromium, navigation to {PAGE_ROWS} rows drawn: median "
              f"{statistics.median(loads):.0f} ms (each: "
              f"{', '.join(f'{x:.0f}' for x in loads)})")
    else:
        print(f"\npage in Chromium: not measured: {why}")


if __name__ == "__main__":
    main()
