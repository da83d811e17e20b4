"""How many tokens not known good the bearer check (bearer.py) may send to the API server,
and from whom.

Anyone who can reach the port can send made-up tokens, and each costs a TokenReview. A
single budget for all of them would let one flood lock every new token out, a scraper's
rotated token among them. So each source address has its own small budget, and all the
strangers together one larger one that bounds what they cost the API server. A source that
has shown a token granted lately (a scraper's pod, a viewer's browser) is known good: its
new tokens are checked within a budget of its own, which neither strangers' tokens nor
another known-good source's use up. Known-good sources share nothing: a tenant whose one
valid token made its address known good spends, with made-up tokens, only its own
address's budget, never a returning viewer's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from dispatcher.controller.kube.pacing import TokenBucket

#: Reviews a second, and at once, of the new tokens of one source.
PER_SOURCE_PER_SECOND = 1.0
PER_SOURCE_BURST = 5
#: ... and of all strangers together (what they may cost the API server).
STRANGERS_PER_SECOND = 10.0
STRANGERS_BURST = 20
#: ... and of one source known good (each its own).
KNOWN_PER_SECOND = 1.0
KNOWN_BURST = 5
#: How long a source stays known good after the last token of it that was granted.
KNOWN_SECONDS = 3600.0
#: Sources remembered (each kind), the least recently used forgotten first.
MAX_SOURCES = 1000
V = TypeVar("V")


class ReviewBudget:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._sources: OrderedDict[str, TokenBucket] = OrderedDict()
        # source -> (known good until, its own budget)
        self._known: OrderedDict[str, tuple[float, TokenBucket]] = OrderedDict()
        self._strangers = TokenBucket(STRANGERS_PER_SECOND, STRANGERS_BURST, clock)

    def take(self, source: str) -> bool:
        """Whether a token from `source` not known good may be reviewed now (taken from
        its budget)."""
        known = self._known.get(source)
        if known is not None and known[0] > self.clock():
            self._known.move_to_end(source)
            return known[1].try_take()
        bucket = self._sources.get(source)
        if bucket is None:
            bucket = self._sources[source] = TokenBucket(PER_SOURCE_PER_SECOND,
                                                         PER_SOURCE_BURST, self.clock)
            _bound(self._sources)
        self._sources.move_to_end(source)
        # Its own budget first: a single flooder then spends none of the strangers'.
        return bucket.try_take() and self._strangers.try_take()

    def vouch(self, source: str) -> None:
        """A token from `source` was granted: the source is known good for a while. Its
        budget is kept, not filled again: a tenant cannot refill its own by showing its
        valid token between floods."""
        kept = self._known.get(source)
        bucket = kept[1] if kept is not None else TokenBucket(KNOWN_PER_SECOND, KNOWN_BURST,
                                                              self.clock)
        self._known[source] = (self.clock() + KNOWN_SECONDS, bucket)
        self._known.move_to_end(source)
        _bound(self._known)


def _bound(kept: OrderedDict[str, V]) -> None:
    while len(kept) > MAX_SOURCES:
        kept.popitem(last=False)
