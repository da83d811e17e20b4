"""Request bodies read within a bound, and the CRD's conversion endpoint.

An AdmissionReview carries one object (and, on UPDATE, the old one): etcd takes objects up
to 1.5 MB, so it is bounded at a little more than twice that. A ConversionReview carries
every object of a list the API server serves in another version: `kubectl get aw -A -o
yaml` as v1beta2 over 10,000 wrappers is one review of some 15 MB (1.5 KB a wrapper), and
one with larger templates several times that. It gets its own bound, and the work on a
large one runs in a thread, one at a time, so that it neither stalls the event loop (the
dispatcher's own, inside `dispatcher run`) nor holds several lists in memory at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from dispatcher.api.conversion_review import conversion_response

#: The most an AdmissionReview may carry.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: The most a ConversionReview may carry: 40,000 wrappers of 1.5 KB, 10,000 of 6 KB. What
#: the webhook holds for one (the body, its objects and their conversion) is about five
#: times that, and only one such review is worked on at a time.
MAX_CONVERSION_BYTES = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request is larger than {limit // (1024 * 1024)} MiB")
        self.limit = limit


async def read_capped(request: web.Request, limit: int) -> bytes:
    """The request's body; TooLarge past `limit` bytes, read no further than that."""
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(limit)
    parts: list[bytes] = []
    size = 0
    while chunk := await request.content.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise TooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


def too_large(e: TooLarge, what: str) -> web.Response:
    return web.Response(status=413, text=f"{e} ({what} are taken up to that)\n")


class Conversions:
    """Answers ConversionReviews (apiextensions.k8s.io/v1)."""

    def __init__(self, limit: int = MAX_CONVERSION_BYTES) -> None:
        self.limit = limit
        self._large = asyncio.Semaphore(1)

    async def answer(self, request: web.Request) -> tuple[web.Response, bool | None]:
        """The response, and whether every object converted (None: not a review)."""
        try:
            raw = await read_capped(request, self.limit)
        except TooLarge as e:
            return too_large(e, "ConversionReviews"), None
        if len(raw) <= MAX_REQUEST_BYTES:
            answer = _convert(raw)
        else:
            async with self._large:
                answer = await asyncio.to_thread(_convert, raw)
        if answer is None:
            return web.Response(status=400, text="expected a ConversionReview with a request "
                                "(apiextensions.k8s.io/v1)\n"), None
        body, converted = answer
        return web.Response(body=body, content_type="application/json"), converted


def _convert(raw: bytes) -> tuple[bytes, bool] | None:
    """The encoded ConversionReview answering `raw`, and whether it is a success; None
    when `raw` is no ConversionReview."""
    try:
        body: Any = json.loads(raw)
        review = body["request"]
        if not isinstance(review, dict):
            raise TypeError("request is not a mapping")
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    response = conversion_response(review)
    out = {"apiVersion": body.get("apiVersion") or "apiextensions.k8s.io/v1",
           "kind": "ConversionReview", "response": response}
    return json.dumps(out).encode(), response["result"]["status"] == "Success"
