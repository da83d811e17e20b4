"""Queue positions: where each waiting AppWrapper stands in the dispatcher's own queue.

After each admission cycle the queue, in the order the cycle walks it, is numbered: the
position in the whole cluster (1: considered first) and, with quota trees, the position
among the waiting wrappers of the same leaf in each tree. They are

- published in each waiting wrapper's status (``queuePosition``, ``queuePolicy``,
  ``quotaPositions``), only where they changed; the head leaving moves everyone behind
  it, so a move alone is written like a message, within a minute, paced with the other
  minor writes (status.py), while a first position and reaching the front are written
  within seconds;
- kept as a :class:`QueueSnapshot`, which the visibility endpoint serves as it is
  (metrics/visibility_api.py).

Nothing is numbered again while the queue holds the same wrappers and its order cannot
move with the clock (no ``priorityslope``), but for a look every half minute (a status
write that failed puts back what the API has).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dispatcher.api.models import AppWrapperStatus, QuotaPosition
from dispatcher.queue import AdmissionQueue, QueuedWrapper
from dispatcher.quota import QuotaForest

from .status import StatusWriter
from .tracked import Key, Tracked

REFRESH_SECONDS = 30.0


@dataclass(frozen=True)
class Entry:
    """A waiting wrapper as numbered by the last cycle."""

    namespace: str
    name: str
    position: int  # in the whole cluster's queue
    priority: int
    effective_priority: float
    first_seen: float
    quota: tuple[QuotaPosition, ...] = ()  # its leaf in each quota tree, and its place there

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class QueueSnapshot:
    """The queue as the last cycle numbered it."""

    policy: str
    at: float  # when it was numbered (the dispatcher's clock)
    entries: tuple[Entry, ...] = ()
    forest: QuotaForest | None = None  # the quota trees it was numbered with
    parents: Mapping[tuple[str, str], str] = field(default_factory=dict)

    def under(self, tree: str, node: str) -> list[Entry]:
        """The entries whose leaf in `tree` is `node` or below it, in queue order."""
        return [e for e in self.entries if any(
            q.tree == tree and node in self._path(tree, q.node) for q in e.quota)]

    def _path(self, tree: str, leaf: str) -> list[str]:
        path = [leaf]
        while (parent := self.parents.get((tree, path[-1]))) is not None:
            path.append(parent)
        return path


def clear_position(status: AppWrapperStatus) -> None:
    """A wrapper that leaves the queue (dispatched, failed, held) has no position."""
    status.queuePosition = None
    status.queuePolicy = None
    status.quotaPositions = None


class Positions:
    def __init__(self, writer: StatusWriter, policy: str) -> None:
        self.writer = writer
        self.policy = policy
        self.snapshot = QueueSnapshot(policy, 0.0)
        self._numbered: tuple[int, QuotaForest | None] | None = None  # queue version, trees
        self._published: set[Key] | None = None  # None: not looked for yet (a restart)

    def publish(self, queue: AdmissionQueue, tracked: Mapping[Key, Tracked],
                forest: QuotaForest | None, now: float) -> None:
        """Number the queue (in the order `queue` gives at `now`) and put the positions
        into the statuses of those whose position changed."""
        numbered = (queue.version, forest)
        if numbered == self._numbered and not queue.moves_with_time \
                and now - self.snapshot.at < REFRESH_SECONDS:
            return
        self._numbered = numbered
        entries = _number(queue.lazily_ordered(now), forest, now)
        self.snapshot = QueueSnapshot(self.policy, now, tuple(entries), forest,
                                      _parents(forest))
        if self._published is None:
            # After a restart: what an earlier run published for wrappers now gone from
            # the queue is taken back too.
            self._published = {k for k, t in tracked.items()
                               if t.status.queuePosition is not None}
        present: set[Key] = set()
        for e in entries:
            t = tracked.get(e.key)
            if t is None:
                continue
            present.add(e.key)
            self._show(t, e.position, self.policy, list(e.quota) or None)
        for key in self._published - present:
            t = tracked.get(key)
            if t is not None:
                self._show(t, None, None, None)
        self._published = present

    def _show(self, t: Tracked, position: int | None, policy: str | None,
              quota: list[QuotaPosition] | None) -> None:
        s = t.status
        if (s.queuePosition, s.queuePolicy, s.quotaPositions) == (position, policy, quota):
            return  # most of a long queue, most of the time: nothing to write
        s.queuePosition, s.queuePolicy, s.quotaPositions = position, policy, quota
        self.writer.owe_position(t)


def _number(ordered: Iterable[QueuedWrapper], forest: QuotaForest | None,
            now: float) -> list[Entry]:
    entries: list[Entry] = []
    in_leaf: dict[tuple[str, str], int] = {}
    for w in ordered:
        if w.invalid is not None:
            continue  # failing, not waiting
        quota: list[QuotaPosition] = []
        if forest is not None:
            for tree, leaf in forest.resolve(w.labels).leaves:
                place = in_leaf[(tree, leaf)] = in_leaf.get((tree, leaf), 0) + 1
                quota.append(QuotaPosition(tree=tree, node=leaf, position=place))
        entries.append(Entry(w.namespace, w.name, len(entries) + 1, w.priority,
                             w.effective_priority(now), w.first_seen, tuple(quota)))
    return entries


def _parents(forest: QuotaForest | None) -> dict[tuple[str, str], str]:
    if forest is None:
        return {}
    return {(name, n.name): n.parent.name for name, tree in forest.trees.items()
            for n in tree.order if n.parent is not None}
