"""Which worker cluster takes a wrapper: the manager's choice, from each worker's free room.

A worker can take a gang when the gang fits there whole, now, per node (the same placement
as a single cluster's admission), within what the worker's quota still allows, and the
worker is reachable and carries the labels the wrapper asks for. Of those, best fit: the one
left with the least free of the resources the gang asks beyond cpu and memory (its GPUs),
so big free clusters stay whole for big gangs; ties go to the least free cpu, then to the
worker with the fewest wrappers sent (gangs that ask for no room spread out), then name.
When none can, the answer names every worker and the best it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import GangPodSet, Placement, Shortfall, demand, place
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.resources import format_amount

#: On an AppWrapper: the worker clusters it may go to, as equality terms over their labels
#: (``region=eu,gpu=a100``): every term must hold.
CLUSTER_SELECTOR_ANNOTATION = "workload.codeflare.dev/cluster-selector"

_COMMON = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})


class SelectorError(ValueError):
    pass


@dataclass(frozen=True)
class Worker:
    """A worker cluster as the manager sees it now."""

    name: str
    capacity: Capacity  # free room now, per node
    labels: Mapping[str, str] = field(default_factory=dict)
    #: What the worker's quota still lets in, per resource; None: no limit.
    quota: Mapping[str, int] | None = None
    reachable: bool = True
    #: Wrappers the manager has sent there and that have not finished.
    sent: int = 0


@dataclass(frozen=True)
class Chosen:
    cluster: str
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class NoneFits:
    message: str


def parse_selector(text: str) -> dict[str, str]:
    """``key=value,key2=value2`` -> a dict; raises SelectorError saying what is wrong."""
    terms: dict[str, str] = {}
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        key, eq, value = term.partition("=")
        if not eq or not key.strip() or "!" in key or "=" in value:
            raise SelectorError(
                f"{CLUSTER_SELECTOR_ANNOTATION}: {term!r} is not key=value; write "
                "the labels a worker cluster must have, e.g. region=eu,gpu=a100")
        terms[key.strip()] = value.strip()
    return terms


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def choose(gang: Sequence[GangPodSet], workers: Iterable[Worker],
           selector: Mapping[str, str] | None = None) -> Chosen | NoneFits:
    """The worker that takes the whole gang now (best fit), or why none can.

    Nothing is taken from any worker's capacity: the caller takes the placements from the
    chosen worker's (``take``)."""
    fits: list[tuple[tuple[int, int, int, str], Chosen]] = []
    why: list[str] = []
    wanted = demand(gang)
    for w in sorted(workers, key=lambda w: w.name):
        refusal = _refusal(w, wanted, selector or {})
        if refusal is not None:
            why.append(f"{w.name}: {refusal}")
            continue
        trial = w.capacity.copy()
        result = place(gang, trial)
        if isinstance(result, Shortfall):
            why.append(f"{w.name}: {_best(gang, w.capacity, result)}")
            continue
        fits.append((_leftover(trial, wanted, w), Chosen(w.name, tuple(result))))
    if fits:
        return min(fits, key=lambda f: f[0])[1]
    if not why:
        return NoneFits("no worker cluster is registered")
    return NoneFits("no worker cluster can take the whole gang now: " + "; ".join(why))


def take(worker: Worker, chosen: Chosen) -> None:
    """Take the chosen placements from the worker's capacity (and quota is the caller's)."""
    for p in chosen.placements:
        if p.node is not None:
            worker.capacity.take(p.node, p.request)


def _refusal(w: Worker, wanted: Mapping[str, int], selector: Mapping[str, str]) -> str | None:
    if not w.reachable:
        return "unreachable"
    if not selects(selector, w.labels):
        terms = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return f"its labels do not match {terms}"
    if w.quota is not None:
        for r, v in sorted(wanted.items()):
            if r in w.quota and v > w.quota[r]:
                return (f"its quota leaves {max(w.quota[r], 0)} of the "
                        f"{format_amount(r, v)} the gang needs")
    return None


def _best(gang: Sequence[GangPodSet], cap: Capacity, short: Shortfall) -> str:
    """The worker's best for this gang: its freest node against the largest pod, in the
    resource the gang is scarcest in; or the placement's own reason."""
    for r, need in _largest_asks(gang):
        best = max(cap.max_free(r), 0)
        if best < need:
            return f"{best} of {format_amount(r, need)} free on one node"
    return short.message


def _largest_asks(gang: Sequence[GangPodSet]) -> list[tuple[str, int]]:
    asks: dict[str, int] = {}
    for g in gang:
        if g.pod_set.count <= 0:
            continue
        for r, v in g.pod_set.request.items():
            if v > 0:
                asks[r] = max(asks.get(r, 0), v)
    # Scarce resources (GPUs) first: that is what a user counts.
    return sorted(asks.items(), key=lambda a: (a[0] in _COMMON, a[0]))


def _leftover(after: Capacity, wanted: Mapping[str, int], w: Worker
              ) -> tuple[int, int, int, str]:
    scarce = [r for r in wanted if r not in _COMMON]
    return (sum(after.free_total.get(r, 0) for r in scarce),
            after.free_total.get("cpu", 0), w.sent, w.name)


def unbound(gang: Sequence[GangPodSet], bound: int) -> list[GangPodSet]:
    """The gang less `bound` of its pods (taken from the last pod sets first): what a
    wrapper sent to a worker still needs room for there until all its pods are bound."""
    out: list[GangPodSet] = []
    left = bound
    for g in reversed(gang):
        drop = min(left, g.pod_set.count)
        left -= drop
        if g.pod_set.count - drop > 0:
            out.append(GangPodSet(g.item, replace(g.pod_set, count=g.pod_set.count - drop)))
    return out[::-1]


def order(queue: Iterable[QueuedWrapper], now: float) -> list[QueuedWrapper]:
    """The manager's queue order: highest effective priority, then first come."""
    return sorted(queue, key=lambda w: (-w.effective_priority(now), w.first_seen, w.key))


def dispatch(queue: Iterable[QueuedWrapper], workers: Sequence[Worker], now: float,
             selectors: Mapping[tuple[str, str], Mapping[str, str]] | None = None
             ) -> list[tuple[QueuedWrapper, Chosen | NoneFits]]:
    """One cycle: each valid wrapper in queue order goes to a worker or is told why not;
    the room (and quota) a chosen one takes is gone for the wrappers after it."""
    quotas = {w.name: dict(w.quota) if w.quota is not None else None for w in workers}
    sent = {w.name: w.sent for w in workers}
    out: list[tuple[QueuedWrapper, Chosen | NoneFits]] = []
    for w in order(queue, now):
        if w.invalid is not None:
            out.append((w, NoneFits(w.invalid)))
            continue
        current = [Worker(x.name, x.capacity, x.labels, quotas[x.name], x.reachable,
                          sent[x.name]) for x in workers]
        answer = choose(w.gang, current, (selectors or {}).get(w.key))
        if isinstance(answer, Chosen):
            picked = next(x for x in current if x.name == answer.cluster)
            take(picked, answer)
            sent[answer.cluster] += 1
            left = quotas[answer.cluster]
            if left is not None:
                for r, v in w.demand.items():
                    if r in left:
                        left[r] -= v
        out.append((w, answer))
    return out
