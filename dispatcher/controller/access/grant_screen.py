"""Which queued AppWrappers admission may consider: those granted what they claim.

A wrapper that claims a quota node or a priority (grants.py) is considered only once its
recorded creator is known to hold every grant it needs. Until then it is left out of the
cycle: it cannot dispatch, hold room or preempt anyone. When a grant is missing it waits,
saying which. The admission webhook refused such a wrapper at ``kubectl apply`` already;
this catches one applied while the webhook was not installed, and a grant revoked since.

Answers are kept per (creator, namespace, grants), so a team's many wrappers share one,
and asked again after :data:`RECHECK_SECONDS` (a grant given or revoked is seen within
that time), at most :data:`MAX_ASKING` at a time; the dispatch itself asks again
(:meth:`GrantScreen.check`), so nothing is dispatched on a revoked grant.

Whose grants: the recorded creator's (creator.py). A wrapper without a recorded creator
gets none when creators are required (``--require-creator``, as deploy/ runs it);
otherwise (an install without the webhook, which checks nobody's rights) its labels and
priority are taken as written, as its items are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.api.messages import problems_message
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.record.tracked import Key
from dispatcher.queue import QueuedWrapper

from .creator import CREATOR, NO_CREATOR, Access, UserInfo
from .grants import Grant, denials, needed

log = logging.getLogger("dispatcher")

RECHECK_SECONDS = 60.0
RETRY_SECONDS = 5.0  # after the API server did not answer
MAX_ASKING = 8

Signature = tuple[UserInfo, str, tuple[Grant, ...]]  # (creator, namespace, grants)


@dataclass(frozen=True)
class _Answer:
    denials: tuple[str, ...] | None  # None: not known yet (the API server did not answer)
    due: float  # when to ask again


class GrantScreen:
    def __init__(self, kube: Kube, require_creator: bool, clock: Callable[[], float],
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 wake: Callable[[], None]) -> None:
        self.access = Access(kube)
        self.require_creator = require_creator
        self.clock = clock
        self.spawn = spawn  # runs a check as a task of its own
        self.wake = wake  # a check finished: the next cycle can use its answer
        self._answers: dict[Signature, _Answer] = {}
        self._asking: set[Signature] = set()

    def _claim(self, w: QueuedWrapper, annotations: Mapping[str, str],
               trees: Collection[str]) -> Signature | str | None:
        """What to ask for ``w``: nothing (None), a refusal outright (str), or whose
        grants."""
        grants = needed(dict(w.labels), trees, w.priority, w.priority_slope)
        if not grants:
            return None
        try:
            creator = UserInfo.from_annotations(annotations)
        except ValueError as e:
            return str(e)
        if creator is None:
            return NO_CREATOR.format(key=CREATOR) if self.require_creator else None
        return (creator, w.namespace, grants)

    def screen(self, ordered: Sequence[QueuedWrapper],
               annotations: Callable[[Key], Mapping[str, str]], trees: Collection[str],
               now: float) -> tuple[list[QueuedWrapper], dict[Key, str]]:
        """The wrappers admission may consider now, in their order, and why each of those
        refused is refused. A wrapper whose answer is not known yet is in neither: its
        question is asked, and it is considered once the answer is in."""
        kept: list[QueuedWrapper] = []
        refused: dict[Key, str] = {}
        used: set[Signature] = set()
        for w in ordered:
            claim = self._claim(w, annotations(w.key), trees)
            if claim is None:
                kept.append(w)
                continue
            if isinstance(claim, str):
                refused[w.key] = claim
                continue
            used.add(claim)
            answer = self._answers.get(claim)
            if answer is None or answer.due <= now:
                self._ask(claim)
            if answer is None or answer.denials is None:
                continue
            if answer.denials:
                refused[w.key] = problems_message(answer.denials)
            else:
                kept.append(w)
        for stale in [s for s in self._answers if s not in used]:
            del self._answers[stale]
        return kept, refused

    async def check(self, w: QueuedWrapper, annotations: Mapping[str, str],
                    trees: Collection[str]) -> list[str]:
        """The grants ``w`` lacks, asked now (just before it is dispatched). Raises
        :class:`ApiError` when the API server cannot answer."""
        claim = self._claim(w, annotations, trees)
        if claim is None:
            return []
        if isinstance(claim, str):
            return [claim]
        found = await denials(self.access, *claim)
        self._answers[claim] = _Answer(tuple(found), self.clock() + RECHECK_SECONDS)
        return found

    def _ask(self, claim: Signature) -> None:
        if claim in self._asking or len(self._asking) >= MAX_ASKING:
            return  # asked when one under way is done (it wakes the loop)
        self._asking.add(claim)
        self.spawn(self._asked(claim))

    async def _asked(self, claim: Signature) -> None:
        try:
            found = await denials(self.access, *claim)
        except ApiError as e:
            log.warning("could not ask whether %s holds the grants of its AppWrappers in "
                        "namespace %s: %s; asking again in %.0f s", claim[0].username,
                        claim[1], e, RETRY_SECONDS)
            before = self._answers.get(claim)
            self._answers[claim] = _Answer(before.denials if before else None,
                                           self.clock() + RETRY_SECONDS)
        else:
            self._answers[claim] = _Answer(tuple(found), self.clock() + RECHECK_SECONDS)
        finally:
            self._asking.discard(claim)
            self.wake()
