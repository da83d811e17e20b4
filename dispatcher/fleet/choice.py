"""Which worker cluster takes a wrapper: the manager's choice, from each worker's free room.

A worker can take a gang when the gang fits there whole, now, per node (the same placement
as a single cluster's admission, topology levels included: a pod set that requires a rack
goes only to a worker with such a rack free), within the worker's quota trees (its
QuotaSubtrees, with the usage its own dispatcher counts, borrowing as they allow), and the
worker is reachable and carries the labels the wrapper asks for (and is not one where a
copy of it waited without starting, while others are tried first). Of those, best fit: the one
left with the least free of the resources the gang asks beyond cpu and memory (its GPUs),
so big free clusters stay whole for big gangs; ties go to the least free cpu, then to the
worker with the fewest wrappers sent (gangs that ask for no room spread out), then name.
When none can, the answer names every worker and the best it has.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import GangPodSet, Placement, Placer, Shortfall, demand, place
from dispatcher.fit.rules import NO_TOPOLOGY, Fit, fit_rules
from dispatcher.fit.topology import Topology
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.quota import QuotaConsumer, QuotaLedger
from dispatcher.quota.forest import Labels
from dispatcher.resources import format_amount

#: On an AppWrapper: the worker clusters it may go to, as equality terms over their labels
#: (``region=eu,gpu=a100``): every term must hold.
CLUSTER_SELECTOR_ANNOTATION = "workload.codeflare.dev/cluster-selector"

_COMMON = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})
#: Why a worker is passed over for a wrapper whose copy never started there.
NOT_STARTED_THERE = "a copy of it did not start there in time: the others are tried first"


class SelectorError(ValueError):
    pass


@dataclass(frozen=True)
class Worker:
    """A worker cluster as the manager sees it now."""

    name: str
    capacity: Capacity  # free room now, per node
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The worker's quota trees and what its admitted wrappers use of them; None: no trees.
    #: A wrapper chosen for the worker is counted in it (``charge``).
    quota: QuotaLedger | None = None
    reachable: bool = True
    #: Wrappers the manager has sent there and that have not finished.
    sent: int = 0
    #: Why the manager cannot use what the worker holds now (an error reading it), or "":
    #: such a worker takes nothing.
    problem: str = ""


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
           selector: Mapping[str, str] | None = None, labels: Labels = (),
           placer: Placer = place, avoid: Collection[str] = ()) -> Chosen | NoneFits:
    """The worker that takes the whole gang now (best fit), or why none can. `labels`:
    the wrapper's, naming its quota leaves; `placer`: how pods are placed (``fit_rules``);
    `avoid`: workers where a copy of it waited without starting, passed over for now.

    Nothing is taken from any worker's capacity or quota: the caller takes the placements
    from the chosen worker's (``take``) and counts the wrapper in its quota (``charge``)."""
    fits: list[tuple[tuple[int, int, int, str], Chosen]] = []
    why: list[str] = []
    wanted = demand(gang)
    for w in sorted(workers, key=lambda w: w.name):
        refusal = NOT_STARTED_THERE if w.name in avoid else \
            _refusal(w, wanted, selector or {}, labels)
        if refusal is not None:
            why.append(f"{w.name}: {refusal}")
            continue
        trial = w.capacity.copy()
        try:
            result = placer(gang, trial)
        except Exception as e:  # one worker's room, or this gang, cannot be worked with
            why.append(f"{w.name}: the gang cannot be placed there ({type(e).__name__}: "
                       f"{str(e)[:200]})")
            continue
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


def charge(ledger: QuotaLedger | None, w: QueuedWrapper, now: float,
           force: bool = False) -> None:
    """Count `w` in a worker's quota, as that worker's dispatcher will once it admits it
    (`force`: wherever it can go, for one sent already)."""
    if ledger is not None:
        ledger.add(QuotaConsumer(w.key, w.labels, w.demand, w.effective_priority(now), now),
                   force=force)


def _refusal(w: Worker, wanted: Mapping[str, int], selector: Mapping[str, str],
             labels: Labels) -> str | None:
    if not w.reachable:
        return "unreachable"
    if w.problem:
        return "the manager cannot use what it holds (its WorkerCluster's status says why)"
    if not selects(selector, w.labels):
        terms = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return f"its labels do not match {terms}"
    if w.quota is not None:
        check = w.quota.check(labels, wanted)
        if not check.fits:
            return f"its quota: {check.message}"
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
             selectors: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
             fit: Fit = "per-node", topology: Topology = NO_TOPOLOGY,
             avoid: Mapping[tuple[str, str], Collection[str]] | None = None
             ) -> list[tuple[QueuedWrapper, Chosen | NoneFits]]:
    """One cycle: each valid wrapper in queue order goes to a worker or is told why not;
    the room and quota a chosen one takes are gone for the wrappers after it (taken from
    its worker's capacity and ledger). `avoid`: per wrapper, the workers it is not sent to
    now (``choose``)."""
    placer, _ = fit_rules(fit, topology)
    sent = {w.name: w.sent for w in workers}
    out: list[tuple[QueuedWrapper, Chosen | NoneFits]] = []
    # A gang no worker takes gets the same answer for the same ask until something is
    # taken (room and quota only shrink in a cycle): a long queue of like gangs behind a
    # full fleet costs one try per kind of ask, not one per wrapper.
    refused: dict[tuple[object, ...], NoneFits] = {}
    for w in order(queue, now):
        invalid = w.invalid or (topology.problem(w.gang) if w.asks_topology else None)
        if invalid is not None:
            out.append((w, NoneFits(invalid)))
            continue
        selector = (selectors or {}).get(w.key)
        passed_over = (avoid or {}).get(w.key, ())
        ask = (*_ask(w, selector), tuple(sorted(passed_over)))
        answer: Chosen | NoneFits | None = refused.get(ask)
        if answer is None:
            current = [replace(x, sent=sent[x.name]) for x in workers]
            answer = choose(w.gang, current, selector, w.labels, placer, passed_over)
            if isinstance(answer, Chosen):
                picked = next(x for x in current if x.name == answer.cluster)
                take(picked, answer)
                charge(picked.quota, w, now)
                sent[answer.cluster] += 1
                refused.clear()
            else:
                refused[ask] = answer
        out.append((w, answer))
    return out


def _ask(w: QueuedWrapper, selector: Mapping[str, str] | None) -> tuple[object, ...]:
    """What decides a wrapper's answer in a cycle, but for what was taken before it."""
    gang = tuple((g.item, g.pod_set.name, g.pod_set.key) for g in w.gang)
    return gang, tuple(sorted((selector or {}).items())), w.labels
