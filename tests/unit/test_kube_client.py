"""The API client: what it takes from the environment, and when."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from dispatcher.controller.kube import Kube


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
