"""Quota trees assembled from QuotaSubtree nodes, and the leaf an AppWrapper names in each.

A tree is usable only when it has exactly one root and every node reaches it; otherwise it
is *broken*: it stays known by name (so wrappers that belong to it wait with the reason
instead of slipping past their quota) and the problem is reported. A node whose parent is
not in its tree, or that sits in a cycle, is left out with a problem line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.quota.subtree import NodeSpec, parse_subtrees

DEFAULT_NODE = "default"  # the leaf MCAD gives a wrapper without a label for a tree
# MCAD's trees and examples are all named quota_<something>: a label with that prefix that
# names no tree is almost certainly a typo or a deleted tree, worth a note.
QUOTA_LABEL_PREFIX = "quota_"

Labels = tuple[tuple[str, str], ...]


@dataclass(eq=False)
class QuotaNode:
    tree: str
    name: str
    quota: dict[str, int]
    hard: bool
    source: str
    parent: QuotaNode | None = None
    children: list[QuotaNode] = field(default_factory=list)
    index: int = 0  # position in the tree's node list (pre-order)
    path: tuple[int, ...] = ()  # indexes from this node up to the root

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(eq=False)
class QuotaTree:
    name: str
    nodes: dict[str, QuotaNode]
    order: list[QuotaNode]  # pre-order from the root, children by name
    resources: tuple[str, ...]  # every resource any node of the tree sets a quota for
    broken: str | None = None  # why the tree cannot be used, if it cannot

    @property
    def root(self) -> QuotaNode:
        return self.order[0]

    @property
    def leaves(self) -> list[str]:
        return sorted(n.name for n in self.order if n.is_leaf)

    def nominal(self, node: QuotaNode, resource: str) -> int:
        return node.quota.get(resource, 0)


@dataclass(frozen=True)
class Resolution:
    """The leaf a wrapper's labels name in each usable tree, or why they name none."""

    leaves: tuple[tuple[str, str], ...]  # (tree, leaf), trees in name order
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # labels that look like quota labels but name no tree


class QuotaForest:
    """Every quota tree, by name (the ``tree`` label of its QuotaSubtrees)."""

    def __init__(self, specs: Iterable[NodeSpec], problems: Sequence[str] = ()) -> None:
        self.problems: list[str] = list(problems)
        by_tree: dict[str, list[NodeSpec]] = {}
        for spec in specs:
            by_tree.setdefault(spec.tree, []).append(spec)
        self.trees: dict[str, QuotaTree] = {
            name: self._assemble(name, by_tree[name]) for name in sorted(by_tree)
        }
        self._resolved: dict[Labels, Resolution] = {}

    @classmethod
    def from_objects(cls, objs: Iterable[Mapping[str, Any]]) -> QuotaForest:
        """From QuotaSubtree objects as read from the API or YAML (see subtree)."""
        specs, problems = parse_subtrees(objs)
        return cls(specs, problems)

    def __bool__(self) -> bool:
        return bool(self.trees)

    # --- assembling -----------------------------------------------------------------

    def _assemble(self, name: str, specs: list[NodeSpec]) -> QuotaTree:
        nodes: dict[str, QuotaNode] = {}
        for spec in sorted(specs, key=lambda s: s.source):
            if spec.name in nodes:
                self.problems.append(
                    f"{spec.source}: tree {name} already has a node {spec.name} (from "
                    f"{nodes[spec.name].source}); this one is ignored")
                continue
            nodes[spec.name] = QuotaNode(name, spec.name, dict(spec.quota), spec.hard,
                                         spec.source)
        parents = {s.name: s.parent for s in specs}
        roots = sorted(n for n in nodes if parents[n] is None)
        for node in nodes.values():
            parent = parents[node.name]
            if parent is None:
                continue
            if parent not in nodes:
                self.problems.append(
                    f"{node.source}: parent {parent} is not a node of tree {name}; node "
                    f"{node.name} and the nodes under it are ignored")
                continue
            node.parent = nodes[parent]
            nodes[parent].children.append(node)
        resources = tuple(sorted({r for n in nodes.values() for r in n.quota}))
        broken: str | None = None
        if len(roots) != 1:
            broken = (f"it has {len(roots)} roots ({', '.join(roots)}): exactly one QuotaSubtree "
                      "of a tree has no spec.parent" if roots else
                      "it has no root: exactly one QuotaSubtree of a tree has no spec.parent")
            self.problems.append(f"quota tree {name} cannot be used: {broken}")
            return QuotaTree(name, {}, [], resources, broken)
        order: list[QuotaNode] = []
        stack = [nodes[roots[0]]]
        while stack:
            node = stack.pop()
            node.index = len(order)
            node.path = (node.index, *(node.parent.path if node.parent else ()))
            order.append(node)
            stack.extend(sorted(node.children, key=lambda c: c.name, reverse=True))
        reached = {n.name for n in order}
        for node in nodes.values():
            if node.name not in reached and _in_cycle(node):
                self.problems.append(
                    f"{node.source}: node {node.name} does not reach the root of tree "
                    f"{name}: its parents form a cycle; ignored")
        return QuotaTree(name, {n.name: n for n in order}, order, resources)

    # --- reading a wrapper's labels ---------------------------------------------------

    def resolve(self, labels: Labels) -> Resolution:
        """The leaf named in each tree by the labels `(key, value)` (MCAD's rules).

        A label whose key is a tree's name names the wrapper's node in that tree; a tree
        the labels do not mention gives the wrapper its ``default`` node. Other labels
        are not about quota and are ignored.
        """
        cached = self._resolved.get(labels)
        if cached is None:
            cached = self._resolved[labels] = self._resolve(dict(labels))
        return cached

    def _resolve(self, labels: Mapping[str, str]) -> Resolution:
        leaves: list[tuple[str, str]] = []
        problems: list[str] = []
        for name, tree in self.trees.items():
            value = labels.get(name)
            if tree.broken is not None:
                problems.append(f"quota tree {name} cannot be used: {tree.broken}")
                continue
            shown = ", ".join(tree.leaves)
            if value is None:
                if DEFAULT_NODE in tree.nodes and tree.nodes[DEFAULT_NODE].is_leaf:
                    leaves.append((name, DEFAULT_NODE))
                else:
                    problems.append(
                        f"no label {name}: quota tree {name} has no leaf named {DEFAULT_NODE} "
                        f"for wrappers without one; label the AppWrapper {name}: <one of "
                        f"{shown}>")
                continue
            node = tree.nodes.get(value)
            if node is None:
                problems.append(f"label {name}: {value}: quota tree {name} has no node "
                                f"{value} (its leaves: {shown})")
            elif not node.is_leaf:
                problems.append(f"label {name}: {value} is an inner node of quota tree {name}; "
                                f"a wrapper names a leaf: {shown}")
            else:
                leaves.append((name, value))
        notes = tuple(
            f"label {key} names no quota tree (trees: {', '.join(self.trees)}): ignored"
            for key in sorted(labels)
            if key.startswith(QUOTA_LABEL_PREFIX) and key not in self.trees and self.trees
        )
        return Resolution(tuple(leaves), tuple(problems), notes)


def _in_cycle(node: QuotaNode) -> bool:
    seen: set[str] = set()
    current: QuotaNode | None = node
    while current is not None:
        if current.name in seen:
            return True
        seen.add(current.name)
        current = current.parent
    return False
