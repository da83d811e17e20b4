"""Protecting /metrics with Kubernetes credentials (``dispatcher run --metrics-auth
kubernetes``).

The scraper sends ``Authorization: Bearer <token>`` (Prometheus: its service account's
token). The token is checked with a TokenReview, then the API server is asked whether
that user may ``get`` the path (a SubjectAccessReview on a non-resource URL), the way
kube-apiserver and kubelet guard their own /metrics: grant it with a ClusterRole rule
``nonResourceURLs: ["/metrics"], verbs: ["get"]``. Answers are kept for a minute per
token, so a scrape every 30 s costs two API calls a minute.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable

from .access import SUBJECT_ACCESS_REVIEWS, UserInfo
from .kube import ApiError, Kube, Resource

TOKEN_REVIEWS = Resource("authentication.k8s.io/v1", "TokenReview", "tokenreviews", False)
CACHE_SECONDS = 60.0
MAX_CACHED = 1000

Refusal = tuple[int, str]


class TokenReviewAuth:
    def __init__(self, connect: Callable[[], Awaitable[Kube]],
                 ttl: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._connect = connect
        self._kube: Kube | None = None
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Refusal | None]] = {}

    async def check(self, authorization: str | None, path: str) -> Refusal | None:
        """None if the request may read ``path``, else (HTTP status, reason)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "send a bearer token (Authorization: Bearer ...) of a user allowed " \
                        f"to get {path}\n"
        key = (hashlib.sha256(token.strip().encode()).hexdigest(), path)
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            answer = await self._review(token.strip(), path)
        except ApiError as e:
            return 503, f"cannot check the token now: {e}\n"  # not cached: try again
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = (now + self.ttl, answer)
        return answer

    async def _review(self, token: str, path: str) -> Refusal | None:
        if self._kube is None:
            self._kube = await self._connect()
        review = await self._kube.request("POST", TOKEN_REVIEWS.path(), {
            "apiVersion": TOKEN_REVIEWS.api_version, "kind": "TokenReview",
            "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, "the token is not valid\n"
        user = UserInfo.from_request(status.get("user") or {})
        sar = await self._kube.request("POST", SUBJECT_ACCESS_REVIEWS.path(), {
            "apiVersion": SUBJECT_ACCESS_REVIEWS.api_version, "kind": "SubjectAccessReview",
            "spec": {**user.sar_subject(),
                     "nonResourceAttributes": {"path": path, "verb": "get"}}})
        if not (sar.get("status") or {}).get("allowed"):
            return 403, f"{user.username} may not get {path}\n"
        return None

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()
            self._kube = None
