"""Which AppWrappers the dispatcher manages, and which it leaves to another controller.

A v1beta2 AppWrapper names its controller in ``spec.managedBy``: none, or codeflare's
AppWrapper controller (whose part the dispatcher plays), is the dispatcher's; any other
name (MultiKueue's, say) is that controller's, and the dispatcher leaves the wrapper
alone. An installation that runs Kueue beside the dispatcher may also leave to Kueue the
wrappers labelled with a Kueue queue name (off by default: codeflare's samples carry
that label and run here as they are).
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.api.conversion import ConversionError, v1beta2_fields

# The name codeflare's AppWrapper controller answers to in spec.managedBy.
APPWRAPPER_CONTROLLER = "workload.codeflare.dev/appwrapper-controller"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Shown as who holds a v1beta2 wrapper whose spec.suspend is true (holds.py).
SUSPENDED_BY = "spec.suspend"


def managed_elsewhere(annotations: Mapping[str, str], labels: Mapping[str, str],
                      leave_kueue_labelled: bool = False) -> str | None:
    """Why another controller manages the AppWrapper with these annotations and labels,
    or None when it is the dispatcher's."""
    try:
        managed_by = v1beta2_fields(annotations).managed_by
    except ConversionError:
        managed_by = None  # the queue refuses the wrapper, saying why
    if managed_by and managed_by != APPWRAPPER_CONTROLLER:
        return f"spec.managedBy names {managed_by}"
    if leave_kueue_labelled and labels.get(KUEUE_QUEUE_LABEL):
        return f"it is labelled {KUEUE_QUEUE_LABEL}, which this installation leaves to Kueue"
    return None


def suspended(annotations: Mapping[str, str]) -> bool:
    """Whether a wrapper written as v1beta2 has spec.suspend true."""
    try:
        return v1beta2_fields(annotations).suspend
    except ConversionError:
        return False
