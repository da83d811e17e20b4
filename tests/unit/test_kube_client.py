"""The API client: what it takes from the environment, and when."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from dispatcher.controller.kube import client as kube_module
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.operator import Settings


def kubeconfig(tmp_path: Path) -> str:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443",
                                                  "insecure-skip-tls-verify": True}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def connect(path: str) -> tuple[Any, bool]:
    """(the proxy requests go through, whether the environment is read per request)"""
    async def go() -> tuple[Any, bool]:
        kube = await Kube.connect(path)
        try:
            rest = kube.api.rest_client
            return rest.proxy, rest.pool_manager.trust_env
        finally:
            await kube.close()
    return asyncio.run(go())


def test_the_proxy_the_environment_names_is_used_and_looked_up_once(
        tmp_path: Path, monkeypatch: Any) -> None:
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    proxy, per_request = connect(kubeconfig(tmp_path))
    assert proxy == "http://proxy.example:3128"
    assert per_request is False  # no lookup of the environment and ~/.netrc per request


def test_no_proxy_for_the_api_server_when_no_proxy_names_it(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    proxy, per_request = connect(kubeconfig(tmp_path))
    assert proxy is None
    assert per_request is False


class Overloaded(Kube):
    """Answers 429 with the API server's Retry-After `wait` (priority and fairness shedding
    load) `times` times, then the object."""

    def __init__(self, wait: float, times: int = 1) -> None:
        super().__init__(cast(Any, None))
        self.wait, self.times = wait, times

    async def _once(self, *args: Any) -> Any:
        if self.times:
            self.times -= 1
            raise ApiError(429, "TooManyRequests", "too many requests", retry_after=self.wait)
        return {"kind": "ConfigMap"}


def test_the_api_servers_retry_after_is_waited_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(kube_module.asyncio, "sleep", sleep)
    for _ in range(20):  # whatever the jitter draws
        assert asyncio.run(Overloaded(7.0).request("GET", "/api/v1/x")) == {"kind": "ConfigMap"}
    assert len(pauses) == 20
    assert all(7.0 <= p <= 7.0 * 1.2 for p in pauses)


def test_a_retry_after_past_the_retry_budget_surfaces_as_transient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s instead of giving up")

    monkeypatch.setattr(kube_module.asyncio, "sleep", sleep)
    with pytest.raises(ApiError) as raised:
        asyncio.run(Overloaded(60.0).request("GET", "/api/v1/x"))
    assert raised.value.transient and raised.value.retry_after == 60.0


def run_settings(monkeypatch: pytest.MonkeyPatch, *argv: str) -> list[Settings]:
    """The Settings `dispatcher run argv` starts the operator with (none: refused)."""
    from dispatcher import cli
    from dispatcher.controller import operator

    seen: list[Settings] = []

    async def operate(settings: Settings, stop: object = None, made: object = None) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(operator, "operate", operate)
    cli.main(["run", *argv])
    return seen


def test_dispatcher_run_leaves_the_pace_to_the_api_server_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    (settings,) = run_settings(monkeypatch)
    assert (settings.qps, settings.burst) == (1000.0, 1000)
