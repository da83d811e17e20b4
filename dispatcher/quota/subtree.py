"""QuotaSubtree objects (``quota.codeflare.dev/v1alpha1``) read into quota node specs.

One object contributes the nodes listed in ``spec.children`` to the tree named by its
``tree`` label; every one of those nodes gets ``spec.parent`` (a node name, not an object
name) as its parent, and an object without a parent holds the root. Parsing never raises:
each problem is one line naming the object and the field, and the object (or the child)
it concerns is left out, as MCAD leaves out objects it cannot use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.resources import ResourceSpecError, resource_list

QUOTA_GROUP = "quota.codeflare.dev"
# v1alpha1 is what MCAD's CRD serves; its quickstart document writes v1.
QUOTA_API_VERSIONS = frozenset({f"{QUOTA_GROUP}/v1alpha1", f"{QUOTA_GROUP}/v1"})
QUOTA_KIND = "QuotaSubtree"
TREE_LABEL = "tree"


@dataclass(frozen=True)
class NodeSpec:
    """One quota node as written in a QuotaSubtree."""

    tree: str
    name: str
    parent: str | None
    quota: Mapping[str, int] = field(hash=False)  # canonical units (see resources)
    hard: bool
    source: str  # "kube-system/context-root-children, spec.children[1]"


def is_quota_subtree(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == QUOTA_KIND


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_subtree(obj: Mapping[str, Any]) -> tuple[list[NodeSpec], list[str]]:
    """The nodes one QuotaSubtree defines, and a line for each problem found in it."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    namespace = meta.get("namespace") or "default"
    who = f"QuotaSubtree {namespace}/{name}" if isinstance(name, str) and name else (
        "a QuotaSubtree without metadata.name")
    problems: list[str] = []
    api_version = obj.get("apiVersion")
    if api_version not in QUOTA_API_VERSIONS:
        return [], [f"{who}: apiVersion must be {QUOTA_GROUP}/v1alpha1, got "
                    f"{_describe(api_version)}; ignored"]
    labels = meta.get("labels")
    tree = labels.get(TREE_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(tree, str) or not tree:
        return [], [f"{who}: metadata.labels.{TREE_LABEL} is missing: it names the quota tree "
                    "the nodes belong to; ignored"]
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [], [f"{who}: spec must be a mapping with children; ignored"]
    parent = spec.get("parent")
    if parent in (None, ""):
        parent = None
    elif not isinstance(parent, str):
        return [], [f"{who}: spec.parent must be the name of a quota node, got "
                    f"{_describe(parent)}; ignored"]
    children = spec.get("children")
    if not isinstance(children, list) or not children:
        return [], [f"{who}: spec.children must list at least one quota node; ignored"]
    nodes: list[NodeSpec] = []
    for i, child in enumerate(children):
        where = f"{namespace}/{name}, spec.children[{i}]"
        node, problem = _child(child, tree, parent, where)
        if problem is not None:
            problems.append(problem)
        if node is not None:
            nodes.append(node)
    return nodes, problems


def _child(child: object, tree: str, parent: str | None,
           source: str) -> tuple[NodeSpec | None, str | None]:
    where = f"QuotaSubtree {source}".replace(", spec", ": spec", 1)
    if not isinstance(child, Mapping):
        return None, f"{where}: must be a mapping with name and quotas; ignored"
    name = child.get("name")
    if not isinstance(name, str) or not name:
        return None, f"{where}.name: must be a non-empty string; the node is ignored"
    quotas = child.get("quotas") or {}
    if not isinstance(quotas, Mapping):
        return None, f"{where}.quotas: must be a mapping; node {name} is ignored"
    hard = quotas.get("hardLimit", False)
    if not isinstance(hard, bool):
        return None, (f"{where}.quotas.hardLimit: must be true or false, got {_describe(hard)}; "
                      f"node {name} is ignored")
    try:
        quota = resource_list(quotas.get("requests"), f"{where}.quotas.requests")
    except ResourceSpecError as e:
        return None, f"{e}; node {name} is ignored"
    return NodeSpec(tree, name, parent, quota, hard, source), None


def parse_subtrees(objs: Iterable[Mapping[str, Any]]) -> tuple[list[NodeSpec], list[str]]:
    nodes: list[NodeSpec] = []
    problems: list[str] = []
    for obj in objs:
        n, p = parse_subtree(obj)
        nodes.extend(n)
        problems.extend(p)
    return nodes, problems
