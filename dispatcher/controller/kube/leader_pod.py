"""The leading replica's pod carries a label, so the pod webhook's Service reaches it alone.

Only the leader can pin a pod as it is created (pods/pod_pinning.py): it holds the gangs' room.
deploy/components/pod-webhook's Service selects the controller's pods that carry
``LEADER_LABEL``. A replica clears the label from its own pod before it campaigns (a
restarted container keeps its pod, label and all), and the one that starts leading sets it
on its own pod and clears it from any other (a leader that died with it). Between a
leader's death and the next one's labelling, pods are created at their gate (the webhook's
failurePolicy is Ignore) and let go by the loop as without the webhook.
"""

from __future__ import annotations

import logging
import os

from .client import ApiError, Kube

log = logging.getLogger("dispatcher")

LEADER_LABEL = "dispatcher.codeflare.dev/leader"


def own_pod() -> tuple[str, str] | None:
    """(namespace, name) of this process's pod, from the downward API (deploy/ sets both
    variables); None outside a pod."""
    namespace, name = os.environ.get("POD_NAMESPACE"), os.environ.get("POD_NAME")
    return (namespace, name) if namespace and name else None


async def _label(kube: Kube, namespace: str, name: str, value: str | None) -> None:
    await kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                       {"metadata": {"labels": {LEADER_LABEL: value}}},
                       content_type="application/merge-patch+json")


async def step_down(kube: Kube, pod: tuple[str, str]) -> None:
    """Before campaigning: this pod is no leader (yet)."""
    try:
        await _label(kube, *pod, None)
    except ApiError as e:
        log.warning("could not clear %s from pod %s/%s: %s", LEADER_LABEL, *pod, e)


async def take_lead(kube: Kube, pod: tuple[str, str]) -> None:
    """Once leading: this pod, and no other of the namespace, carries the label."""
    namespace, name = pod
    try:
        listed = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                                    query={"labelSelector": LEADER_LABEL})
        for other in listed.get("items") or []:
            other_name = str((other.get("metadata") or {}).get("name", ""))
            if other_name and other_name != name:
                await _label(kube, namespace, other_name, None)
        await _label(kube, namespace, name, "true")
        log.info("pod %s/%s labelled %s: the pod webhook's Service reaches it",
                 namespace, name, LEADER_LABEL)
    except ApiError as e:
        log.warning("could not label pod %s/%s as the leader (%s): pods whose creation "
                    "reaches another replica are let go at their gate", namespace, name, e)
