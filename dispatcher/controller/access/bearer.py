"""Protecting /metrics with Kubernetes credentials (``dispatcher run --metrics-auth
kubernetes``), and the queue's visibility endpoint always (metrics/visibility_api.py).

The scraper sends ``Authorization: Bearer <token>`` (Prometheus: its service account's
token). The token is checked with a TokenReview, then the API server is asked whether
that user may ``get`` the path (a SubjectAccessReview on a non-resource URL), the way
kube-apiserver and kubelet guard their own /metrics: grant it with a ClusterRole rule
``nonResourceURLs: ["/metrics"], verbs: ["get"]``. A grant is kept for a minute per
token, so a scrape every 30 s costs two API calls a minute; a refusal for 10 s. The
visibility endpoint asks about a resource instead (``list`` ``appwrappers`` in a namespace,
or in all of them): :meth:`TokenReviewAuth.allowed`.

Anyone who can reach the port can send tokens, so what they cost the API server is
bounded: tokens not known good are checked within the budgets of review_budget.py (per
source address, all strangers together, and each source known good its own, so that
neither strangers nor a tenant with a valid token of its own can lock out another's
new token — a scraper's rotated token); beyond that the answer is 429 without asking.
The tokens known good (a scraper's) are checked again, once their minute is up, within
their source's budget too (a budget shared by every source's renewals would let a tenant
who minted many valid tokens spend it), and are kept apart from the refusals, so a flood
of made-up tokens evicts none of them. Each kind of answer is kept for at most 1,000
tokens, the least recently used going first. A token granted something within its minute
asks about other things (the dashboard: one question per namespace a viewer picks, and
whether it may list Events) within a budget of its own.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.kube.pacing import TokenBucket

from .creator import SUBJECT_ACCESS_REVIEWS, UserInfo
from .review_budget import ReviewBudget

TOKEN_REVIEWS = Resource("authentication.k8s.io/v1", "TokenReview", "tokenreviews", False)
CACHE_SECONDS = 60.0
REFUSAL_SECONDS = 10.0  # short: a grant just given is seen soon
MAX_CACHED = 1000
# Questions a second, and at once, of a token granted something within its minute about
# something else (the dashboard asks once per namespace a viewer picks, up to 20): its own
# budget, since a token the API server vouched for is no stranger's.
QUESTIONS_PER_SECOND = 1.0
QUESTIONS_BURST = 25

Refusal = tuple[int, str]
BUSY: Refusal = (429, "too many tokens to check now; try again in a few seconds\n")


class Answers:
    """Answers per token until they expire, the least recently used dropped first when
    more than ``size`` are kept. An expired answer stays until it is dropped or replaced:
    it says who was known."""

    def __init__(self, size: int = MAX_CACHED) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, str], tuple[float, Refusal | None]] = OrderedDict()

    def get(self, key: tuple[str, str]) -> tuple[float, Refusal | None] | None:
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
        return found

    def put(self, key: tuple[str, str], until: float, answer: Refusal | None) -> None:
        self._kept[key] = (until, answer)
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def drop(self, key: tuple[str, str]) -> None:
        self._kept.pop(key, None)


class TokenReviewAuth:
    def __init__(self, connect: Callable[[], Awaitable[Kube]],
                 ttl: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 refusal_ttl: float = REFUSAL_SECONDS) -> None:
        self._connect = connect
        self._kube: Kube | None = None
        self.ttl = ttl
        self.refusal_ttl = refusal_ttl
        self.clock = clock
        self._granted: Answers = Answers()
        self._refused: Answers = Answers()
        self._new_tokens = ReviewBudget(clock)
        # Per token granted within its minute: until when, and its questions' budget.
        self._vouched: OrderedDict[str, tuple[float, TokenBucket]] = OrderedDict()

    async def check(self, authorization: str | None, path: str, source: str = ""
                    ) -> Refusal | None:
        """None if the request may read ``path``, else (HTTP status, reason)."""
        return await self.allowed(authorization, f"get {path}",
                                  {"nonResourceAttributes": {"path": path, "verb": "get"}},
                                  source)

    async def allowed(self, authorization: str | None, what: str,
                      attributes: Mapping[str, Any], source: str = "") -> Refusal | None:
        """None if the request's user may do `what` (words for the refusal, and the cache
        key), which a SubjectAccessReview asks with `attributes`; else (HTTP status,
        reason). `source`: the client's address (whose budget a new token is checked
        within)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "send a bearer token (Authorization: Bearer ...) of a user allowed " \
                        f"to {what}\n"
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        key = (digest, what)
        now = self.clock()
        granted = self._granted.get(key)
        if granted is not None and granted[0] > now:
            return None
        refused = self._refused.get(key)
        if refused is not None and refused[0] > now:
            return refused[1]
        if not self._within_budget(digest, source, now):
            return BUSY
        try:
            answer = await self._review(token.strip(), what, attributes)
        except ApiError as e:
            return 503, f"cannot check the token now: {e}\n"  # not kept: try again
        if answer is None:
            self._granted.put(key, now + self.ttl, None)
            self._refused.drop(key)
            self._new_tokens.vouch(source)
            self._vouch(digest, now)
        else:
            self._refused.put(key, now + self.refusal_ttl, answer)
            self._granted.drop(key)
        return answer

    def _within_budget(self, digest: str, source: str, now: float) -> bool:
        """Whether a review may be asked now: a question of a token vouched for within
        its minute within the token's own budget; any other (a new token, or a known one
        whose answer is out of date) within its source's (review_budget.py)."""
        vouched = self._vouched.get(digest)
        if vouched is not None and vouched[0] > now:
            return vouched[1].try_take()
        return self._new_tokens.take(source)

    def _vouch(self, digest: str, now: float) -> None:
        kept = self._vouched.get(digest)
        bucket = kept[1] if kept is not None else TokenBucket(
            QUESTIONS_PER_SECOND, QUESTIONS_BURST, self.clock)
        self._vouched[digest] = (now + self.ttl, bucket)
        self._vouched.move_to_end(digest)
        while len(self._vouched) > MAX_CACHED:
            self._vouched.popitem(last=False)

    async def _review(self, token: str, what: str,
                      attributes: Mapping[str, Any]) -> Refusal | None:
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
            "spec": {**user.sar_subject(), **attributes}})
        if not (sar.get("status") or {}).get("allowed"):
            return 403, f"{user.username} may not {what}\n"
        return None

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()
            self._kube = None
