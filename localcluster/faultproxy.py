"""A fault-injecting proxy between one client and the local kube-apiserver, on loopback.

    python -m localcluster.faultproxy --kubeconfig ADMIN.yaml --out PROXIED.yaml \\
        [--rate 0.1] [--watch-cut-seconds 10] [--port 0] [--seed 1]

It serves plain HTTP on 127.0.0.1 and forwards every request to the API server over
TLS with the kubeconfig's credentials; `--out` is a kubeconfig that points a client at
it. A fraction `--rate` of ordinary requests gets a fault instead of, or after, its
answer, in equal shares:

- ``429`` Too Many Requests with ``Retry-After: 1`` (not forwarded);
- ``500`` Internal Server Error (not forwarded);
- a hang: nothing is forwarded and nothing answered until the client gives up;
- a lost answer: the request is forwarded and takes effect, then the connection is
  closed without an answer — the client cannot know its write landed.

Watch streams are forwarded and cut after a random time (exponential, mean
`--watch-cut-seconds`). Counts of each fault are printed to stdout every 10 s and at the
end, as JSON lines, so a test can check that faults were really injected.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import ssl
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
               "upgrade"}


def _credentials(kubeconfig: Path) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    config = yaml.safe_load(kubeconfig.read_text())
    context_name = config.get("current-context")
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    tls = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
    headers: dict[str, str] = {}
    if user.get("client-certificate"):
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    return str(cluster["server"]).rstrip("/"), tls, headers


def proxied_kubeconfig(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "faulty",
        "clusters": [{"name": "faulty", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "faulty", "user": {}}],
        "contexts": [{"name": "faulty", "context": {"cluster": "faulty", "user": "faulty"}}],
    }


class FaultProxy:
    def __init__(self, kubeconfig: Path, rate: float, watch_cut_seconds: float,
                 seed: int | None = None) -> None:
        self.upstream, self.tls, self.auth = _credentials(kubeconfig)
        self.rate = rate
        self.watch_cut_seconds = watch_cut_seconds
        self.random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.session: ClientSession | None = None

    async def start(self) -> None:
        self.session = ClientSession(connector=TCPConnector(ssl=self.tls, limit=0),
                                     auto_decompress=False)

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    def _fault(self) -> str | None:
        if self.random.random() >= self.rate:
            return None
        return self.random.choice(("429", "500", "hang", "lost"))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("1", "true")
        self.counts["watch" if watch else "request"] += 1
        fault = None if watch else self._fault()
        if fault == "429":
            self.counts["429"] += 1
            return web.json_response(_status(429, "TooManyRequests", "injected"),
                                     status=429, headers={"Retry-After": "1"})
        if fault == "500":
            self.counts["500"] += 1
            return web.json_response(_status(500, "InternalError", "injected"), status=500)
        if fault == "hang":
            self.counts["hang"] += 1
            await asyncio.sleep(3600)  # the client times out and closes
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers.update(self.auth)
        upstream = await self.session.request(
            request.method, self.upstream + request.path_qs, data=body or None,
            headers=headers, timeout=ClientTimeout(total=None, sock_connect=10))
        try:
            # The body goes through as it came (gzip included): Content-Encoding with it.
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            if fault == "lost":
                await upstream.read()
                self.counts["lost"] += 1
                assert request.transport is not None
                request.transport.close()  # the write landed; its answer never comes
                return response
            await response.prepare(request)
            if watch:
                await self._stream_then_cut(request, upstream, response)
            else:
                await response.write(await upstream.read())
                await response.write_eof()
            return response
        finally:
            upstream.release()

    async def _stream_then_cut(self, request: web.Request, upstream: Any,
                               response: web.StreamResponse) -> None:
        cut_after = self.random.expovariate(1.0 / self.watch_cut_seconds) \
            if self.watch_cut_seconds > 0 else float("inf")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cut_after
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.counts["watch-cut"] += 1
                upstream.close()
                if request.transport is not None:
                    request.transport.close()  # mid-stream, as a broken connection
                return
            try:
                chunk = await asyncio.wait_for(upstream.content.readany(), remaining)
            except TimeoutError:
                continue
            if not chunk:
                await response.write_eof()
                return
            await response.write(chunk)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": f"{message} by the fault proxy"}


async def serve(args: argparse.Namespace) -> None:
    proxy = FaultProxy(Path(args.kubeconfig), args.rate, args.watch_cut_seconds, args.seed)
    await proxy.start()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = runner.addresses[0][1]
    Path(args.out).write_text(yaml.safe_dump(proxied_kubeconfig(port)))
    print(json.dumps({"listening": port}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10)
        except TimeoutError:
            print(json.dumps(dict(proxy.counts)), flush=True)
    print(json.dumps(dict(proxy.counts)), flush=True)
    await runner.cleanup()
    await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localcluster.faultproxy",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True, help="credentials for the API server")
    p.add_argument("--out", required=True, help="write a kubeconfig pointing at the proxy")
    p.add_argument("--rate", type=float, default=0.1,
                   help="fraction of requests that get a fault (default 0.1)")
    p.add_argument("--watch-cut-seconds", type=float, default=10.0,
                   help="mean lifetime of a watch stream before it is cut (0: never)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int)
    args = p.parse_args(argv)
    if not 0 <= args.rate <= 1:
        print("--rate must be between 0 and 1", file=sys.stderr)
        return 2
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
