"""Quota usage of admitted wrappers, and whether a candidate fits its quota or may borrow.

The model (MCAD's quota manager, restated): in each tree a wrapper is *placed* at one node
on the path from its leaf to the root, and counts against the quota of that node and of
every node above it, not against the nodes below it. It is placed at its leaf when the
leaf and every node above have room for its demand; otherwise it *borrows*: it is placed
at the lowest node above which every node has room, which is the node just above the
highest node on its path that would overflow. A node with ``hardLimit: true`` does not let
the wrapper rise above it, so a wrapper can never borrow past a hard node. A wrapper fits
when it can be placed in every tree. Only the resources it requests are checked: a team
over its GPU quota may still run a CPU-only job.

Admitted wrappers are placed in the order they were admitted (ties: higher priority
first), so that counting them again -- every cycle, from what the API says is admitted --
finds each the room it was admitted into: it is the later wrappers of a full leaf that
borrow. (Placing higher priorities first, as MCAD's slide-up does, can leave no room for an
earlier, lower-priority wrapper under a hard limit and overfill a node; priority acts
through preemption instead.) Admission order is not always the order the quota was taken
in (a preemptor's quota is counted from its hold, a borrower may be admitted around it
before it dispatches, wrappers admitted in one cycle tie, and a borrower counted again
after others have gone sits lower than it did, as does an elastic gang shrunk back to
the size it was admitted at): a wrapper that no longer fits when counted again is
counted before the wrappers that use the nodes of its path, and they are placed again
after it, in turn moved up when they no longer fit -- when then every one of them fits.
A wrapper admitted before its quota existed (or before the quota was lowered) may not fit
at all: it is then placed as high as it may rise and its usage is counted anyway, so the
node shows as over its quota and the wrapper as borrowing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher.quota.forest import Labels, QuotaForest, QuotaNode, QuotaTree, Resolution
from dispatcher.resources import CPU, amount_number, format_amount

WrapperKey = tuple[str, str]
Usage = dict[str, dict[int, list[int]]]  # per tree, per node index: amounts per resource


@dataclass(frozen=True)
class QuotaPlacement:
    """Where a wrapper sits (or would sit) in one tree; node None: it does not fit there."""

    tree: str
    leaf: str
    node: str | None

    @property
    def borrows(self) -> bool:
        return self.node is not None and self.node != self.leaf

    def describe(self) -> str:
        if self.node is None:
            return f"{self.leaf} (tree {self.tree}): no room"
        if self.borrows:
            return f"{self.leaf} (tree {self.tree}) borrowing from {self.node}"
        return f"{self.leaf} (tree {self.tree})"


@dataclass(frozen=True)
class QuotaCheck:
    """A candidate's answer: its placement in each tree, or why it does not fit."""

    placements: tuple[QuotaPlacement, ...] = ()
    unknown: tuple[str, ...] = ()  # labels naming no usable node: waits for a fix
    shortfalls: tuple[str, ...] = ()  # trees without room for it
    notes: tuple[str, ...] = ()
    # (tree, node) per tree without room: the highest node of its path that is full for it
    full: tuple[tuple[str, str], ...] = ()

    @property
    def fits(self) -> bool:
        return not self.unknown and not self.shortfalls

    @property
    def borrows(self) -> bool:
        return any(p.borrows for p in self.placements)

    @property
    def message(self) -> str:
        return "; ".join(self.unknown or self.shortfalls)

    def describe(self) -> str:
        """Where it sits, for a dispatch message: 'quota gold (tree t) borrowing from root'."""
        if not self.placements:
            return ""
        return "quota " + ", ".join(p.describe() for p in self.placements)


@dataclass(frozen=True)
class QuotaConsumer:
    """What the ledger needs of an admitted (or held) wrapper."""

    key: WrapperKey
    labels: Labels
    demand: Mapping[str, int] = field(hash=False)
    priority: float = 0.0
    since: float = 0.0  # when it was admitted: the earlier keeps its leaf


@dataclass(frozen=True)
class NodeUsage:
    """One row of the usage table: a node's nominal quota and what its wrappers use.

    used: the demand of every wrapper whose leaf is at or under the node, wherever it is
    placed; borrowed: the part of it placed above the node, on quota lent from above.
    """

    tree: str
    name: str
    parent: str | None
    depth: int
    hard: bool
    nominal: Mapping[str, int] = field(hash=False)
    used: Mapping[str, int] = field(hash=False)
    borrowed: Mapping[str, int] = field(hash=False)


@dataclass
class _Entry:
    consumer: QuotaConsumer
    spots: list[tuple[QuotaTree, int, tuple[int, ...], tuple[int, ...]]]  # tree, at, path, d
    # Counted though it fits nowhere (over a hard limit: pods that ask more than their gang
    # declared, a quota lowered under it): it uses what is not its own, as a borrower does,
    # and reclaim may take it back.
    over: bool = False

    @property
    def borrows(self) -> bool:
        return self.over or any(at != path[0] for _, at, path, _ in self.spots)


def admission_order(c: QuotaConsumer) -> tuple[float, float, WrapperKey]:
    return (c.since, -c.priority, c.key)


def _vector(tree: QuotaTree, demand: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(demand.get(r, 0) for r in tree.resources)


class QuotaLedger:
    """The usage of every quota node; each dispatch adds to it, each removal gives back."""

    def __init__(self, forest: QuotaForest) -> None:
        self.forest = forest
        self._quota: dict[str, list[tuple[int, ...]]] = {
            name: [tuple(n.quota.get(r, 0) for r in t.resources) for n in t.order]
            for name, t in forest.trees.items()
        }
        self._used: dict[str, list[list[int]]] = {
            name: [[0] * len(t.resources) for _ in t.order] for name, t in forest.trees.items()
        }
        self._entries: dict[WrapperKey, _Entry] = {}

    @classmethod
    def of(cls, forest: QuotaForest, consumers: Iterable[QuotaConsumer]) -> QuotaLedger:
        """The usage of `consumers`, placed in the order they were admitted."""
        ledger = cls(forest)
        hopeless: set[tuple[Labels, tuple[tuple[str, int], ...]]] = set()
        for c in sorted(consumers, key=admission_order):
            if ledger.add(c).fits:
                continue
            shape = (c.labels, tuple(sorted(c.demand.items())))
            # Not tried again for the same shape in this count: that bounds the work when
            # a lowered quota leaves many wrappers over it.
            if shape in hopeless or not ledger._make_way(c):
                hopeless.add(shape)
                ledger.add(c, force=True)
        return ledger

    def _make_way(self, consumer: QuotaConsumer) -> bool:
        """Count `consumer` before the wrappers counted so far that use a node of its path
        below the root, if then every one of them fits again after it.

        Admission order is not always the order the quota was taken in: a preemptor's
        quota is counted from its hold, but it is admitted (and counted again) only when
        it dispatches; wrappers admitted in one cycle tie; and a borrower admitted before
        a wrapper was, counted again once others have gone, sits lower than it did then.
        Such a wrapper counted first takes room below where it sat when the consumer was
        admitted, and the consumer, under a hard limit, has nowhere to go. Placed again
        after it, they rise to where they were. (What counts against the root does not
        depend on the order, so only the nodes below it are worth the trouble.)

        The same holds among those placed again: one of them that then does not fit (under
        a hard limit too, behind an earlier one that could rise) is moved up to just after
        the consumer and the ones moved before it, and all are placed again -- each moved
        at most once. An elastic gang shrunk back to the size it was admitted at is such an
        earlier one: it had risen above the wrappers admitted while it was larger.
        """
        res = self.forest.resolve(consumer.labels)
        below_root = {(tree, x) for tree, leaf in res.leaves
                      for x in self.path(tree, leaf)[:-1]}
        if res.problems or not below_root:
            return False
        ahead = sorted((e.consumer for e in self._entries.values()
                        if any((t.name, x) in below_root
                               for t, at, path, _ in e.spots for x in path[path.index(at):])),
                       key=admission_order)
        if not ahead:
            return False
        before = [self._entries[c.key] for c in ahead]
        for c in ahead:
            self.remove(c.key)
        moved, rest = [consumer], ahead
        while True:
            short = next((c for c in (*moved, *rest) if not self.add(c).fits), None)
            if short is None:
                return True
            for c in (*moved, *rest):
                self.remove(c.key)
            if all(c.key != short.key for c in rest):  # moved up already: no way
                break
            moved, rest = [*moved, short], [c for c in rest if c.key != short.key]
        for entry in before:
            self._apply(entry, 1)
            self._entries[entry.consumer.key] = entry
        return False

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def active(self) -> bool:
        return bool(self.forest.trees)

    def consumers(self) -> list[QuotaConsumer]:
        return [e.consumer for e in self._entries.values()]

    def placements(self, key: WrapperKey) -> tuple[QuotaPlacement, ...]:
        entry = self._entries.get(key)
        if entry is None:
            return ()
        return tuple(QuotaPlacement(t.name, t.order[path[0]].name, t.order[at].name)
                     for t, at, path, _ in entry.spots)

    def borrows(self, key: WrapperKey) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.borrows

    def over(self, key: WrapperKey) -> bool:
        """Counted though it fits nowhere: over a hard limit on its path."""
        entry = self._entries.get(key)
        return entry is not None and entry.over

    def spots(self, key: WrapperKey) -> dict[str, tuple[int, tuple[int, ...]]]:
        """Per tree: the index of the node it is placed at, and its leaf's path to the root."""
        entry = self._entries.get(key)
        return {} if entry is None else {t.name: (at, path) for t, at, path, _ in entry.spots}

    def path(self, tree: str, leaf: str) -> tuple[int, ...]:
        return self.forest.trees[tree].nodes[leaf].path

    # --- asking -------------------------------------------------------------------------

    def check(self, labels: Labels, demand: Mapping[str, int],
              without: Iterable[WrapperKey] = (), less: Usage | None = None) -> QuotaCheck:
        """Would a wrapper with these labels and demand fit, were `without` gone?

        `less` is ``usage_of(without)`` computed beforehand (it then replaces `without`),
        for callers that try many sets differing by one wrapper.
        """
        res = self.forest.resolve(labels)
        if res.problems:
            return QuotaCheck(unknown=res.problems, notes=res.notes)
        if less is None:
            less = self.usage_of(without)
        placements: list[QuotaPlacement] = []
        shortfalls: list[str] = []
        full: list[tuple[str, str]] = []
        for tree_name, leaf in res.leaves:
            tree = self.forest.trees[tree_name]
            d = _vector(tree, demand)
            path = tree.nodes[leaf].path
            at, short, top = self._place(tree, path, d, less.get(tree_name))
            placements.append(QuotaPlacement(tree_name, leaf, None if at is None else
                                             tree.order[at].name))
            if short is not None and top is not None:
                shortfalls.append(short)
                full.append((tree_name, tree.order[top].name))
        return QuotaCheck(tuple(placements), shortfalls=tuple(shortfalls), notes=res.notes,
                          full=tuple(full))

    def within_quota(self, labels: Labels, demand: Mapping[str, int]) -> bool:
        """Would it fit at its own leaf in every tree, were every borrower gone?

        That is the wrapper's guaranteed share: what reclaiming borrowed quota gives back.
        """
        borrowers = [k for k, e in self._entries.items() if e.borrows]
        check = self.check(labels, demand, without=borrowers)
        return check.fits and not check.borrows

    def usage_of(self, keys: Iterable[WrapperKey]) -> Usage:
        """Per tree and node, the usage `keys` account for there."""
        less: Usage = {}
        for key in keys:
            self.shift(less, key, 1)
        return less

    def shift(self, less: Usage, key: WrapperKey, sign: int) -> None:
        """Add (sign 1) or take away (-1) the usage of `key` to or from `less`."""
        entry = self._entries.get(key)
        if entry is None:
            return
        for tree, at, path, d in entry.spots:
            nodes = less.setdefault(tree.name, {})
            for x in path[path.index(at):]:
                row = nodes.setdefault(x, [0] * len(d))
                for j, v in enumerate(d):
                    row[j] += sign * v

    def shift_part(self, less: Usage, key: WrapperKey, demand: Mapping[str, int]) -> None:
        """Add to `less` part of the usage of `key`: `demand`, where `key` is counted (what
        it gives back when it shrinks; dispatcher.elastic)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        for tree, at, path, _ in entry.spots:
            d = _vector(tree, demand)
            nodes = less.setdefault(tree.name, {})
            for x in path[path.index(at):]:
                row = nodes.setdefault(x, [0] * len(d))
                for j, v in enumerate(d):
                    row[j] += v

    def _place(self, tree: QuotaTree, path: tuple[int, ...], d: tuple[int, ...],
               less: Mapping[int, list[int]] | None = None
               ) -> tuple[int | None, str | None, int | None]:
        """The node it would be placed at (an index), or None, why not, and the highest
        node of its path that is full for it (an index)."""
        used, quota = self._used[tree.name], self._quota[tree.name]
        top = -1  # position on the path of the highest node that would overflow
        for i, x in enumerate(path):
            u, q = used[x], quota[x]
            minus = less.get(x) if less else None
            for j, v in enumerate(d):
                if v and u[j] - (minus[j] if minus else 0) + v > q[j]:
                    top = i
                    break
        rise = top + 1
        blocker = next((i for i in range(min(rise, len(path) - 1)) if tree.order[path[i]].hard),
                       None)
        if rise < len(path) and blocker is None:
            return path[rise], None, None
        return None, self._shortfall(tree, path, d, less, blocker), path[top]

    def _shortfall(self, tree: QuotaTree, path: tuple[int, ...], d: tuple[int, ...],
                   less: Mapping[int, list[int]] | None, blocker: int | None) -> str:
        def over(i: int) -> str | None:
            x = path[i]
            minus = less.get(x) if less else None
            for j, v in enumerate(d):
                u = self._used[tree.name][x][j] - (minus[j] if minus else 0)
                q = self._quota[tree.name][x][j]
                if v and u + v > q:
                    return _would_use(tree.resources[j], u + v, q)
            return None

        leaf = tree.order[path[0]].name
        head = f"{leaf} (tree {tree.name})"
        own = over(0)
        top = max(i for i in range(len(path)) if over(i) is not None)
        if top == len(path) - 1 == 0:
            return f"{head} {own}"
        if own is not None and blocker == 0:
            return f"{head} {own} and cannot borrow: hardLimit"
        lead = f"{head} {own} and cannot borrow: " if own else f"{head} fits its own quota, but "
        why = f"{tree.order[path[top]].name} {over(top)}"
        if top < len(path) - 1 and blocker is not None:  # rising above `top` is forbidden
            why += (f", and {leaf} has hardLimit" if blocker == 0 else
                    f", and {leaf} may not borrow beyond {tree.order[path[blocker]].name}: "
                    "hardLimit")
        return lead + why

    # --- changing -----------------------------------------------------------------------

    def add(self, consumer: QuotaConsumer, force: bool = False) -> QuotaCheck:
        """Account `consumer` (replacing an earlier entry of its key).

        Without `force` nothing is added unless it fits (see the returned check). With
        `force` -- a wrapper already admitted -- it is counted wherever it can go: in each
        tree at the node it would be placed at, else as high as it may rise. Trees whose
        leaf its labels do not resolve do not count it.
        """
        self.remove(consumer.key)
        check = self.check(consumer.labels, consumer.demand)
        if not force and not check.fits:
            return check
        res = self.forest.resolve(consumer.labels)
        spots: list[tuple[QuotaTree, int, tuple[int, ...], tuple[int, ...]]] = []
        known = {p.tree: p for p in check.placements}
        for tree_name, leaf in res.leaves if not res.problems else _resolvable(self.forest,
                                                                                 consumer.labels):
            tree = self.forest.trees[tree_name]
            path = tree.nodes[leaf].path
            placement = known.get(tree_name)
            if placement is not None and placement.node is not None:
                at = tree.nodes[placement.node].index
            else:
                at = next((x for x in path if tree.order[x].hard), path[-1])
            spots.append((tree, at, path, _vector(tree, consumer.demand)))
        entry = _Entry(consumer, spots, over=not check.fits)
        self._apply(entry, 1)
        self._entries[consumer.key] = entry
        return check

    def remove(self, key: WrapperKey) -> QuotaConsumer | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._apply(entry, -1)
        return entry.consumer

    def _apply(self, entry: _Entry, sign: int) -> None:
        for tree, at, path, d in entry.spots:
            used = self._used[tree.name]
            for x in path[path.index(at):]:
                row = used[x]
                for j, v in enumerate(d):
                    row[j] += sign * v

    def rebalance(self) -> None:
        """Let borrowers move down to their leaf (or closer to it) where room has freed.

        Removals leave borrowers where they are; a caller that keeps one ledger across
        cycles (the simulator) calls this once completions have been removed, so that a
        borrower whose own quota has room again stops counting as borrowing.
        """
        borrowers = sorted((e.consumer for e in self._entries.values() if e.borrows),
                           key=admission_order)
        for consumer in borrowers:
            before = self._entries[consumer.key]
            self.remove(consumer.key)
            after = self.add(consumer, force=True)
            if not after.fits:  # over quota: keep it where it was
                self.remove(consumer.key)
                self._apply(before, 1)
                self._entries[consumer.key] = before

    # --- reporting ----------------------------------------------------------------------

    def usage(self) -> list[NodeUsage]:
        """Every node of every tree, in tree order: nominal, used and borrowed."""
        used: dict[str, list[list[int]]] = {}
        borrowed: dict[str, list[list[int]]] = {}
        for name, tree in self.forest.trees.items():
            used[name] = [[0] * len(tree.resources) for _ in tree.order]
            borrowed[name] = [[0] * len(tree.resources) for _ in tree.order]
        for entry in self._entries.values():
            for tree, at, path, d in entry.spots:
                placed = path.index(at)
                for i, x in enumerate(path):
                    for j, v in enumerate(d):
                        used[tree.name][x][j] += v
                        if i < placed:
                            borrowed[tree.name][x][j] += v
        rows: list[NodeUsage] = []
        for name, tree in self.forest.trees.items():
            for node in tree.order:
                rows.append(NodeUsage(
                    name, node.name, node.parent.name if node.parent else None,
                    len(node.path) - 1, node.hard, dict(node.quota),
                    _named(tree, used[name][node.index]),
                    _named(tree, borrowed[name][node.index])))
        return rows

    def over_quota(self) -> list[str]:
        """Nodes whose usage exceeds their quota (only ever by wrappers counted by force)."""
        out: list[str] = []
        for name, tree in self.forest.trees.items():
            for node in tree.order:
                for j, r in enumerate(tree.resources):
                    u, q = self._used[name][node.index][j], self._quota[name][node.index][j]
                    if u > q:
                        out.append(f"{node.name} (tree {name}) "
                                   + _would_use(r, u, q).replace("would use", "uses"))
        return out

    def node_usage(self, tree: str, node: str) -> dict[str, int]:
        """What counts against `node`'s quota: wrappers placed at it or below it."""
        t = self.forest.trees[tree]
        return _named(t, self._used[tree][t.nodes[node].index])


def _named(tree: QuotaTree, values: Sequence[int]) -> dict[str, int]:
    return {r: v for r, v in zip(tree.resources, values, strict=True) if v}


def _resolvable(forest: QuotaForest, labels: Labels) -> list[tuple[str, str]]:
    """The trees in which the labels do name a leaf, when some other tree's do not."""
    out: list[tuple[str, str]] = []
    for name, tree in forest.trees.items():
        if tree.broken is not None:
            continue
        single: Resolution = forest.resolve(tuple((k, v) for k, v in labels if k == name))
        found = [leaf for t, leaf in single.leaves if t == name]
        if found:
            out.append((name, found[0]))
    return out


def _would_use(resource: str, used: int, quota: int) -> str:
    """'would use 1200m of its 1075m cpu': both amounts in the same unit."""
    if resource == CPU and (used % 1000 or quota % 1000):
        return f"would use {used}m of its {quota}m cpu"
    return f"would use {amount_number(resource, used)} of its {format_amount(resource, quota)}"


__all__ = [
    "NodeUsage",
    "QuotaCheck",
    "QuotaConsumer",
    "QuotaLedger",
    "QuotaNode",
    "QuotaPlacement",
]
