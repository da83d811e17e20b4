"""What one wrapped object will create: sets of identical pods and where they may run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Toleration:
    """A pod toleration, as kube-scheduler matches it against node taints."""

    key: str = ""
    operator: str = "Equal"  # "Equal" or "Exists"
    value: str = ""
    effect: str = ""  # "" tolerates every effect


@dataclass(frozen=True)
class Requirement:
    """One `matchExpressions` entry of a required node-affinity term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodConstraints:
    """The node-side rules a pod carries: selector, tolerations, required affinity.

    `affinity_terms` is the OR of terms, each the AND of its requirements (an empty
    tuple means no required affinity at all).
    """

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    affinity_terms: tuple[tuple[Requirement, ...], ...] = ()


NO_CONSTRAINTS = PodConstraints()


@dataclass(frozen=True)
class TopologyRequest:
    """Kueue's topology annotations: the pods in one domain of node label `level`.

    `required`: in one domain or not at all; else as few domains as possible. `whole_gang`:
    asked on the AppWrapper, so every pod set of it without its own request shares the
    one domain.
    """

    level: str
    required: bool
    whole_gang: bool = False


@dataclass(frozen=True)
class PodSet:
    """`count` pods that each request `request` (canonical units, see resources)."""

    name: str
    count: int
    request: Mapping[str, int] = field(hash=False, compare=True)
    constraints: PodConstraints = NO_CONSTRAINTS
    topology: TopologyRequest | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """A hashable identity of the demand, for caching fit answers by shape."""
        return (self.count, tuple(sorted(self.request.items())), self.constraints,
                self.topology)
