"""The queue of AppWrappers waiting for dispatch, in the order a policy considers them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from sortedcontainers import SortedKeyList

from dispatcher.fit.gang import GangPodSet, demand
from dispatcher.kinds.elastic import ElasticSet
from dispatcher.queue.policy import Policy

WrapperKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class QueuedWrapper:
    namespace: str
    name: str
    uid: str
    first_seen: float  # seconds since the epoch
    gang: tuple[GangPodSet, ...] = ()
    priority: int = 0
    priority_slope: float = 0.0
    invalid: str | None = None  # why the spec cannot be admitted, if it cannot
    # metadata.labels, sorted: a label whose key is a quota tree's name names its leaf.
    labels: tuple[tuple[str, str], ...] = ()
    # Pod sets that may run with fewer pods (dispatcher.elastic); `gang` has them at
    # their declared count.
    elastic: tuple[ElasticSet, ...] = ()

    @cached_property
    def key(self) -> WrapperKey:
        """(namespace, name): asked for many times per wrapper and cycle."""
        return (self.namespace, self.name)

    @cached_property
    def gang_key(self) -> tuple[object, ...]:
        """Identity of the demand: equal keys fit or not alike on the same capacity
        (asked for by every cycle: worked out once)."""
        return tuple(g.pod_set.key for g in self.gang)

    @cached_property
    def asks_topology(self) -> bool:
        """Whether a pod set asks for a topology domain (read by every cycle: worked out
        once)."""
        return any(g.pod_set.topology is not None for g in self.gang)

    @cached_property
    def demand(self) -> dict[str, int]:
        """The whole gang's requests: what it counts against its quota."""
        return demand(self.gang)

    def effective_priority(self, now: float) -> float:
        """spec.priority grown by spec.priorityslope per second queued (MCAD)."""
        if not self.priority_slope:
            return float(self.priority)
        return self.priority + self.priority_slope * max(0.0, now - self.first_seen)


def _static_key(policy: Policy, w: QueuedWrapper) -> tuple[float, float, str, str, str]:
    rank = 0.0 if policy.order == "arrival" else -float(w.priority)
    return (rank, w.first_seen, w.uid, w.namespace, w.name)


class AdmissionQueue:
    """Wrappers not yet dispatched, kept sorted for the policy.

    Without dynamic priorities the order is maintained as wrappers come and go; with
    any `priorityslope` the order depends on the time and is sorted when asked for.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._by_key: dict[WrapperKey, QueuedWrapper] = {}
        self._sorted: SortedKeyList = SortedKeyList(key=lambda w: _static_key(policy, w))
        self._sloped = 0
        self.version = 0  # changes whenever a wrapper comes or goes

    @property
    def moves_with_time(self) -> bool:
        """Whether the order depends on the time (dynamic priorities), not only on who
        is queued."""
        return self._sloped > 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def get(self, key: WrapperKey) -> QueuedWrapper | None:
        return self._by_key.get(key)

    def put(self, wrapper: QueuedWrapper) -> None:
        self.remove(wrapper.key)
        self.version += 1
        self._by_key[wrapper.key] = wrapper
        self._sorted.add(wrapper)
        if wrapper.priority_slope and self.policy.order == "priority":
            self._sloped += 1

    def remove(self, key: WrapperKey) -> QueuedWrapper | None:
        old = self._by_key.pop(key, None)
        if old is not None:
            self.version += 1
            self._sorted.remove(old)
            if old.priority_slope and self.policy.order == "priority":
                self._sloped -= 1
        return old

    def ordered(self, now: float) -> Sequence[QueuedWrapper]:
        if not self._sloped:
            return list(self._sorted)
        return sorted(
            self._by_key.values(),
            key=lambda w: (-w.effective_priority(now), w.first_seen, w.uid, w.namespace, w.name),
        )

    def lazily_ordered(self, now: float) -> Iterable[QueuedWrapper]:
        """As `ordered`, without a copy of the queue when its order does not depend on
        the time: for readers that stop early. The queue must not change meanwhile."""
        return self.ordered(now) if self._sloped else iter(self._sorted)

    def __iter__(self) -> Iterator[QueuedWrapper]:
        return iter(self._sorted)
