"""Everything the dispatcher says about one AppWrapper before queueing it, in one call.

`dispatcher plan`, the controller and the admission webhook must refuse the same
AppWrappers with the same words and warn about the same things; they all call
`review`, which runs, in order: the bounds on depth and size (`shape_problems`), the
API's validation (`parse_appwrapper`), the installation's kinds (`check_kinds`), the
pod counting of every item (`queued_from_appwrapper`), and `warnings` (with, for a wrapper
written as v1beta2, its fault-tolerance annotations that are ignored or cut to the
installation's maximum). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.admission import first_seen_of, queued_from_appwrapper
from dispatcher.api.bounds import shape_problems
from dispatcher.api.conversion import stored_form, unconverted_problem
from dispatcher.api.fault_tolerance import (
    DEFAULT_FAULT_TOLERANCE,
    FaultTolerance,
    v1beta2_fault_tolerance,
)
from dispatcher.api.messages import cap_problems, problems_message
from dispatcher.api.models import AppWrapper, InvalidSpec, parse_appwrapper
from dispatcher.fit.topology import Topology
from dispatcher.kinds.checks import check_kinds, warnings
from dispatcher.kinds.scope import CLUSTER_SCOPED_KINDS, DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.queue.queue import QueuedWrapper


@dataclass(frozen=True)
class Review:
    """`queued` is the queue entry when the AppWrapper is valid; otherwise `problems` says
    why not (bounded lines; `message` joins them). `warnings` never make it invalid."""

    appwrapper: AppWrapper | None
    queued: QueuedWrapper | None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.queued is not None

    @property
    def message(self) -> str:
        return problems_message(self.problems)


def review(
    obj: Mapping[str, Any],
    default_first_seen: float,
    allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
    cluster_scoped: Collection[GroupKind] = CLUSTER_SCOPED_KINDS,
    topology: Topology | None = None,
    warn: bool = True,
    faults: FaultTolerance = DEFAULT_FAULT_TOLERANCE,
) -> Review:
    """Validate `obj` (an AppWrapper from the API server or a file) for this installation.

    `default_first_seen` is its queue time when neither its status nor its creation
    timestamp gives one. `allowed` and `cluster_scoped` as for `check_kinds`. With
    `topology`, a topology level it asks for must be one of the installation's (without,
    admission checks that). Without `warn`, no warnings are looked for (they cost a walk
    of the whole object, which listing many wrappers for their shapes does not need).
    `faults`: the installation's fault-tolerance defaults and maximum.
    """
    # First: anything deeper or bigger than a bound is refused before recursive code reads it.
    too_big = shape_problems(obj)
    if too_big:
        return Review(None, None, too_big)
    shown = unconverted_problem(obj)
    if shown is not None:
        return Review(None, None, [shown])
    try:
        aw = parse_appwrapper(stored_form(obj))
    except InvalidSpec as e:
        return Review(None, None, e.problems)
    # A v1beta2 wrapper's fault-tolerance annotations ignored or capped, as codeflare's
    # webhook warns.
    faulty = v1beta2_fault_tolerance(aw.metadata.annotations, faults) if warn else None
    found = [*warnings(aw), *(faulty[1] if faulty else [])] if warn else []
    queued = queued_from_appwrapper(aw, first_seen_of(aw, default_first_seen))
    refused = check_kinds(aw, allowed, cluster_scoped)
    # queued.invalid is the items' counting problems, already one bounded message.
    counting = [queued.invalid] if queued.invalid is not None else []
    level = topology.problem(queued.gang) if topology is not None and not counting else None
    if level is not None:
        counting.append(level)
    if refused:
        return Review(aw, None, cap_problems([*refused, *counting]), found)
    if counting:
        return Review(aw, None, counting, found)
    return Review(aw, queued, [], found)

