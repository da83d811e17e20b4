"""Start-up failures a user can see: no kubeconfig, an API server that does not answer, a
grant missing. Each is one clear line (what, where, what to do), in the log at once and
then less and less often, in /healthz, and a stop signal always stops the process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from dispatcher import cli
from dispatcher.controller.kube.client import Request
from dispatcher.controller.kube.explain import permission
from dispatcher.controller.kube.kubeconfig import KubeconfigError, load
from dispatcher.controller.kube.startup import Trouble
from dispatcher.controller.operator import Settings, operate
from dispatcher.queue import Policy

REPO = Path(__file__).resolve().parents[2]
FIFO = Policy("fifo", order="arrival")
# A generous bound on anything that should take a second: only a hang exceeds it.
HANG = 60.0


def free_port() -> int:
    """A port nothing listens on (bound, then closed): connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_kubeconfig(tmp_path: Path, server: str, **extra: Any) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": server}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}], **extra}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user with no ~/.kube/config, no $KUBECONFIG, outside a pod."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / ".kube" / "config"


# --- no kubeconfig ---------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "webhook"])
def test_no_kubeconfig_is_one_line_saying_where_and_what_to_do(
        no_kubeconfig: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert cli.main([command]) == 2
    assert capsys.readouterr().err == (
        f"dispatcher {command}: no kubeconfig: {no_kubeconfig} does not exist; pass "
        "--kubeconfig FILE, set KUBECONFIG, or run in a pod with a ServiceAccount "
        "(in-cluster)\n")


def test_queue_without_a_kubeconfig_says_the_file_does_not_exist(
        no_kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["queue"]) == 1
    assert capsys.readouterr().err.startswith(
        f"dispatcher queue: no kubeconfig: {no_kubeconfig} does not exist; ")


def test_queue_against_a_dead_server_says_it_cannot_reach_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = f"https://127.0.0.1:{free_port()}"
    kubeconfig = write_kubeconfig(tmp_path, server)
    assert cli.main(["queue", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dispatcher queue: cannot list AppWrappers: cannot reach the API "
                          f"server at {server} (ClientConnectorError: ")
    assert err.endswith("is it running, and is the kubeconfig's server address right?\n")


def test_every_unusable_kubeconfig_is_named_with_what_to_do(
        tmp_path: Path, no_kubeconfig: Path) -> None:
    def problem(kubeconfig: str | None, context: str | None = None,
                **environ: str) -> str:
        with pytest.raises(KubeconfigError) as e:
            asyncio.run(load(kubeconfig, context, environ=environ))
        return str(e.value)

    missing = tmp_path / "missing"
    assert problem(str(missing)) == (f"kubeconfig {missing} does not exist: pass the path "
                                     "of a kubeconfig file (kubectl config view --raw > FILE)")
    assert problem(str(tmp_path)) .startswith(f"kubeconfig {tmp_path} is not a file")
    assert problem(None, KUBECONFIG=f"{missing}:{missing}2").startswith(
        f"no kubeconfig: $KUBECONFIG ({missing}:{missing}2) does not exist; pass")
    plain = write_kubeconfig(tmp_path, "https://127.0.0.1:6443")
    assert problem(str(plain), "other") == (
        f"kubeconfig {plain}: Expected object with name other in {plain}/contexts list")
    doc = yaml.safe_load(plain.read_text())
    del doc["current-context"]
    plain.write_text(yaml.safe_dump(doc))
    assert problem(str(plain)) == (f"kubeconfig {plain}: it sets no current-context: choose "
                                   "one with kubectl config use-context NAME")
    plain.write_text("")
    assert problem(str(plain)) == (f"kubeconfig {plain}: not a kubeconfig (expected "
                                   "clusters, users, contexts and a current-context)")
    assert problem(None, KUBERNETES_SERVICE_HOST="10.0.0.1").startswith(
        "in-cluster configuration: ")


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                   ) -> None:
    kubeconfig = write_kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["run", "--kubeconfig", str(kubeconfig), "--metrics-host",
                         "127.0.0.1", "--metrics-port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dispatcher run: ") and "address already in use" in err
    assert len(err.splitlines()) == 1


# --- the API server does not answer, or forbids --------------------------------------------

async def healthz_until(port: int, wanted: Callable[[str], bool]) -> str:
    """/healthz's text once `wanted` says yes (the server may not be up yet)."""
    deadline = time.monotonic() + HANG
    text = ""
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                    text = await r.text()
                    if r.status == 503 and wanted(text):
                        return text
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"/healthz never said it; last: {text!r}")


@asynccontextmanager
async def forbidding_api() -> AsyncIterator[str]:
    """An API server that knows the user (GET /version) and forbids everything else, as
    kube-apiserver does when RBAC grants nothing."""
    async def version(request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "31"})

    async def forbidden(request: web.Request) -> web.Response:
        return web.json_response({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
            "code": 403, "message": f"{request.path.split('/')[-1]} is forbidden: User "
            "\"system:serviceaccount:dispatcher-system:dispatcher\" cannot do this"},
            status=403)

    app = web.Application()
    app.router.add_get("/version", version)
    app.router.add_route("*", "/{tail:.*}", forbidden)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def run_until_healthz(kubeconfig: Path, wanted: Callable[[str], bool],
                            leader_election: bool = False) -> str:
    port = free_port()
    stop = asyncio.Event()
    settings = Settings(policy=FIFO, kubeconfig=str(kubeconfig), metrics_port=port,
                        metrics_host="127.0.0.1", leader_election=leader_election,
                        lease_namespace="dispatcher-system")
    running = asyncio.create_task(operate(settings, stop))
    try:
        return await healthz_until(port, wanted)
    finally:
        stop.set()
        assert await asyncio.wait_for(running, HANG) == 0  # stopped mid start-up


def test_an_unreachable_api_server_is_said_at_once_and_in_healthz(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = f"https://127.0.0.1:{free_port()}"
    kubeconfig = write_kubeconfig(tmp_path, server)
    caplog.set_level(logging.INFO, "dispatcher")
    text = asyncio.run(run_until_healthz(
        kubeconfig, lambda t: "cannot reach" in t))
    assert text.startswith(f"starting: cannot reach the API server at {server} "
                           "(ClientConnectorError: ")
    assert text.rstrip().endswith("is it running, and is the kubeconfig's server address "
                                  "right?")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said and said[0].startswith(f"reaching the API server: cannot reach the API "
                                       f"server at {server}")
    assert "stopped before start-up finished" in caplog.text


@pytest.mark.parametrize(("leader_election", "said"), [
    (False, "listing and watching nodes: forbidden (403): GET /api/v1/nodes: nodes is "
            "forbidden: User \"system:serviceaccount:dispatcher-system:dispatcher\" cannot "
            "do this; the dispatcher's ServiceAccount needs RBAC verb 'list' on 'nodes' "
            "(apiGroup '') cluster-wide (deploy/'s roles grant all it needs)"),
    (True, "leader election (Lease dispatcher-system/dispatcher): forbidden (403): GET "
           "/apis/coordination.k8s.io/v1/namespaces/dispatcher-system/leases/dispatcher: "
           "dispatcher is forbidden: User \"system:serviceaccount:dispatcher-system:"
           "dispatcher\" cannot do this; the dispatcher's ServiceAccount needs RBAC verb "
           "'get' on 'leases' (apiGroup 'coordination.k8s.io') in namespace "
           "dispatcher-system (deploy/'s roles grant all it needs)"),
])
def test_a_missing_grant_names_the_request_and_the_grant(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, leader_election: bool,
        said: str) -> None:
    caplog.set_level(logging.INFO, "dispatcher")

    async def scenario() -> str:
        async with forbidding_api() as server:
            kubeconfig = write_kubeconfig(tmp_path, server)
            return await run_until_healthz(kubeconfig, lambda t: "forbidden" in t,
                                           leader_election)

    assert asyncio.run(scenario()) == f"starting: {said}\n"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0] == f"{said}; retrying"


# --- a stop signal stops it -------------------------------------------------------------

@pytest.mark.parametrize(("command", "sig"), [
    (["run", "--metrics-port", "0"], signal.SIGTERM),
    (["run", "--metrics-port", "0"], signal.SIGINT),
    (["run", "--metrics-port", "0", "--namespace", "dispatcher-system", "--webhook-port"],
     signal.SIGTERM),
    (["webhook", "--namespace", "dispatcher-system", "--port"], signal.SIGTERM),
])
def test_a_stop_signal_stops_it_while_the_api_server_is_unreachable(
        tmp_path: Path, command: list[str], sig: signal.Signals) -> None:
    kubeconfig = write_kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")
    if command[-1].endswith("port"):
        command = [*command, str(free_port())]
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", *command, "--kubeconfig", str(kubeconfig)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HANG
        while "cannot reach the API server" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(sig)
        assert proc.wait(timeout=HANG) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


# --- the parts ---------------------------------------------------------------------------

def test_a_lasting_problem_is_logged_at_once_then_less_and_less_often(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    trouble = Trouble(logging.getLogger("dispatcher.test"), "reaching the API server",
                      lambda: now[0], first_repeat=10, max_repeat=40)
    caplog.set_level(logging.INFO, "dispatcher.test")
    logged_at = []
    for second in range(200):
        now[0] = float(second)
        before = len(caplog.records)
        trouble.report("down" if second < 150 else "forbidden")
        if len(caplog.records) > before:
            logged_at.append(second)
    assert logged_at == [0, 10, 30, 70, 110, 150, 160, 180]
    assert caplog.records[1].getMessage() == ("reaching the API server: down; still "
                                              "retrying (for 10s)")
    assert trouble.current == "forbidden"
    trouble.clear()
    assert trouble.current is None
    assert caplog.records[-1].getMessage() == "reaching the API server: resolved after 3m19s"


@pytest.mark.parametrize(("method", "path", "rule"), [
    ("GET", "/api/v1/nodes", ("list", "nodes", "", None)),
    ("WATCH", "/api/v1/pods", ("watch", "pods", "", None)),
    ("GET", "/api/v1/namespaces/t/secrets/s", ("get", "secrets", "", "t")),
    ("PATCH", "/api/v1/namespaces/t/pods/p", ("patch", "pods", "", "t")),
    ("PUT", "/apis/workload.codeflare.dev/v1beta1/namespaces/t/appwrappers/a/status",
     ("update", "appwrappers/status", "workload.codeflare.dev", "t")),
    ("POST", "/apis/batch/v1/namespaces/t/jobs", ("create", "jobs", "batch", "t")),
    ("DELETE", "/apis/batch/v1/namespaces/t/jobs/j", ("delete", "jobs", "batch", "t")),
    ("GET", "/api/v1/namespaces/t", ("get", "namespaces", "", None)),
])
def test_the_grant_a_request_needs(method: str, path: str,
                                   rule: tuple[str, str, str, str | None]) -> None:
    needed = permission(Request(method, path, "https://k"))
    assert needed is not None
    assert (needed.verb, needed.resource, needed.group, needed.namespace) == rule
    assert permission(Request("GET", "/version", "https://k")) is None
