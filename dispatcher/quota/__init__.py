"""Quota trees, MCAD-compatible: QuotaSubtree objects, usage, borrowing.

Pure: no Kubernetes client, no I/O. ``subtree`` reads QuotaSubtree objects, ``forest``
assembles the trees and finds the leaf a wrapper's labels name in each, ``ledger`` keeps
the usage of admitted wrappers and answers for a candidate (fits its leaf, borrows from
an ancestor, or does not fit, with a message a user can act on). ``admission`` asks the
ledger before it places a gang; ``preemption`` uses it to find borrowers to reclaim from.

The rules, as MCAD's quota manager applies them (its code and quickstart were read, not
copied; the wording and the formulation below are ours):

- A QuotaSubtree's ``tree`` label names its tree; each entry of ``spec.children`` is a node
  whose parent is the node named by ``spec.parent`` (absent: the root). A node's
  ``quotas.requests`` may name any resource (``nvidia.com/gpu`` too); a node of the tree
  that does not name a resource another node names has 0 of it. ``hardLimit`` defaults to
  false. ``disabled`` is accepted and, as in MCAD, ignored.
- A label whose key is a tree's name names the wrapper's leaf in that tree. For a tree the
  labels do not mention, the wrapper gets the tree's ``default`` leaf (MCAD writes that
  label onto the AppWrapper). Other labels are not about quota.
- Usage and borrowing: see ``ledger``. Completed, failed and deleted wrappers use nothing.

What each quota step of MCAD's kuttl suites (``../shared/conformance/mcad-kuttl``)
exercises, and the rule above that decides it (``tests/unit/test_quota_mcad_suites.py``
encodes every step as a decision of this core):

quota-forest (trees quota_context: root 1075m cpu / 1045Mi / 16 GPUs over gold, silver
(soft), bronze (hard) and a zero ``default``; quota_service: root over gold and default)

- 01: the QuotaSubtrees exist -- the forest parses them with no problem.
- 03: a plain Job outside any AppWrapper runs -- the dispatcher does not see it.
- 04: gold/gold, 600m: fits gold in both trees -> dispatched.
- 05: labels naming nodes no tree has (context-root2, service-root2) -> stays Pending; a
  label must name a leaf of the tree.
- 06: gold/gold at priority 1000, 600m, beside the running priority-0 600m one: gold and
  the root would be at 1200m of 1075m; the higher priority wrapper of the same leaf
  preempts the lower one (priority preemption is confined to the preemptor's own leaf and
  borrowers above it) -> the new one Running, the old one Pending, the bad one Pending.
- 07: bronze/gold, 400m: fits bronze and the roots (600m + 400m <= 1075m) -> Running.
- 08: a second bronze/gold 400m: bronze would hold 800m of 900m, but the root would be at
  1400m of 1075m and bronze is hard, and nothing of lower priority is on its path ->
  Pending, the others stay Running.
- 09: two bronze 900m Jobs, run one after the other: the first uses all of bronze; the
  second waits for it and completes once the first has completed (completion frees quota).
- 10: no quota labels at all: the ``default`` leaf of each tree, which has 0 quota and
  borrows from its root -> dispatched, Completed.
- 11: only a label that is not a tree's name: ignored, so again the default leaves ->
  Running.

quota-errors: 03 silver/gold 100m dispatches; 04 deleting it frees its quota; 05 the same
AppWrapper applied again dispatches again (no stale usage is left behind).

e2e-kuttl-borrowing (same trees): 03 silver/gold, 2 pods of 500m / 8 GPUs / 300Mi: 16 GPUs
exceed silver's 8, so it borrows from the root (placed at context-root) -> Running.
04 gold/gold, 8 GPUs: within gold's quota, but the root would be at 24 of 16 GPUs: it
reclaims from the borrower (preempting it, though its priority is the same) -> Running.

e2e-kuttl-deployment-01: quotas start off; 01-03 wrappers without labels dispatch. 04-05
quota management turns on with one tree (root 1950m / 1500Mi): the admitted wrappers
count against their ``default`` leaf (300m + 1500m borrowed from the root). 06 a new
1500m wrapper without labels would put the root at 3300m of 1950m -> Pending. 07 deleting
the three admitted wrappers frees the root -> it runs. 08 bronze, 300m / 300Mi: fits
bronze exactly (300Mi of 300Mi) -> Completed.

e2e-kuttl-deployment-02: 01 bronze/gold 100m and 02 an unlabelled 300m (default leaves,
borrowing) run; 03 the dispatcher restarts: usage is rebuilt from the admitted wrappers;
04 gold/gold 300m fits (root 700m of 1075m) -> Running, nobody preempted.

e2e-kuttl-deployment-03: 01-02 as above; 03 a third tree quota_actinides appears, with no
``default`` leaf; the wrappers admitted before it are not counted in it (they name no
leaf there). 04 a wrapper labelled only quota_actinides: lawrencium gets the default
leaves of the two other trees -> Completed. 05 gold/gold/plutonium -> Completed.
"""

from dispatcher.quota.forest import DEFAULT_NODE, QuotaForest, QuotaTree, Resolution
from dispatcher.quota.ledger import (
    NodeUsage,
    QuotaCheck,
    QuotaConsumer,
    QuotaLedger,
    QuotaPlacement,
)
from dispatcher.quota.subtree import (
    QUOTA_KIND,
    TREE_LABEL,
    NodeSpec,
    is_quota_subtree,
    parse_subtree,
    parse_subtrees,
)

__all__ = [
    "DEFAULT_NODE",
    "QUOTA_KIND",
    "TREE_LABEL",
    "NodeSpec",
    "NodeUsage",
    "QuotaCheck",
    "QuotaConsumer",
    "QuotaForest",
    "QuotaLedger",
    "QuotaPlacement",
    "QuotaTree",
    "Resolution",
    "is_quota_subtree",
    "parse_subtree",
    "parse_subtrees",
]
