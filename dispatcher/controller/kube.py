"""A small async client for any kind the API server serves, by plain REST paths.

The wrapped objects can be of any kind (CRDs included), so the controller works with
dicts and paths rather than generated typed clients. Kinds are mapped to their REST
resources by API discovery, cached per group/version.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes_asyncio import client, config


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if subresource:
            base += f"/{subresource}"
        return base


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._discovered: dict[str, dict[str, Resource] | None] = {}

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster when running in a pod with no kubeconfig given, else kubeconfig."""
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ \
                and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return cls(client.ApiClient())
        conf = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
        return cls(client.ApiClient(configuration=conf))

    async def close(self) -> None:
        await self.api.close()

    async def request(self, method: str, path: str, body: Any = None,
                      query: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        response = await self.api.call_api(
            path, method, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"], _preload_content=False,
            _return_http_data_only=True,
        )
        try:
            raw = await response.read()
        finally:
            response.release()
        if response.status >= 400:
            # Unknown paths answer with plain text ("404 page not found"), not a Status.
            try:
                data = json.loads(raw) if raw else None
            except ValueError:
                data = None
            reason = data.get("reason", "") if isinstance(data, dict) else ""
            message = data.get("message", raw.decode(errors="replace")) \
                if isinstance(data, dict) else raw.decode(errors="replace")
            raise ApiError(response.status, reason or response.reason or "", message)
        return json.loads(raw) if raw else None

    async def resource(self, api_version: str, kind: str) -> Resource | None:
        """The REST resource serving `kind` in `api_version`, or None if not served."""
        if api_version not in self._discovered:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                listing = await self.request("GET", path)
            except ApiError as e:
                if e.status != 404:
                    raise
                self._discovered[api_version] = None
            else:
                self._discovered[api_version] = {
                    r["kind"]: Resource(api_version, r["kind"], r["name"], r["namespaced"])
                    for r in listing.get("resources", []) if "/" not in r["name"]
                }
        served = self._discovered[api_version]
        return None if served is None else served.get(kind)

    def forget(self, api_version: str) -> None:
        """Look the group/version up again next time (a CRD may have been installed)."""
        self._discovered.pop(api_version, None)

    async def list(self, resource: Resource, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query: dict[str, str] = {"limit": "500"}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", resource.path(), query=query)
            kind = resource.kind
            for item in page.get("items", []):
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items
            query["continue"] = token
