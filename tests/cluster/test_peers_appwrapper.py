"""codeflare's AppWrapper controller (v1.2.1, built from its published module) with Kueue
(v0.17.0), as their users run them: one gang through them, so the third system of
bench/peers.py cannot silently rot. Kueue admits the v1beta2 AppWrapper by quota and
unsuspends it; the AppWrapper controller then makes its Job, whose pods run whole.

Its AppWrapper CRD replaces the dispatcher's for this module (they share a name) and the
dispatcher's is put back after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.appwrapper import API, KUEUE_FRAMEWORK, AppWrapperController
from localcluster.kueue import QUEUE_LABEL, Kueue, queue
from localcluster.testing import condition

from .test_controller import job

QUEUE = "peers-aw"
RESOURCE = "appwrappers.v1beta2.workload.codeflare.dev"


@pytest.fixture(scope="module")
def peers(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[None]:
    controller = AppWrapperController(local_cluster)
    kueue = Kueue(local_cluster, {"integrations": {"frameworks": ["batch/job", KUEUE_FRAMEWORK]}})
    try:
        controller.start()  # its CRD first: Kueue sets up the integration only if it is there
        kueue.start()
        yield
    finally:
        kueue.stop()
        controller.stop()
        AppWrapperController.restore_crd(kubectl)


def queued_appwrapper(name: str, *components: dict[str, Any]) -> dict[str, Any]:
    """A v1beta2 AppWrapper created suspended with its LocalQueue's label (what Kueue's
    AppWrapper webhook would make of it)."""
    return {"apiVersion": API, "kind": "AppWrapper",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}},
            "spec": {"suspend": True, "components": [{"template": c} for c in components]}}


def test_one_gang_runs_whole_through_kueue_and_the_appwrapper_controller(
        peers: None, kubectl: Kubectl, k: Kubectl, namespace: str) -> None:
    queue(kubectl, namespace, {"cpu": "256", "memory": "2Ti", "nvidia.com/gpu": "32"},
          name=QUEUE)
    k.apply(queued_appwrapper("via-aw", job("via-aw", 2, 8, "succeed")))

    def phase() -> str:
        return str(k.json(RESOURCE, "via-aw").get("status", {}).get("phase", ""))

    wait_for(lambda: phase() == "Succeeded", 180, "AppWrapper via-aw to succeed")
    assert not k.json(RESOURCE, "via-aw")["spec"].get("suspend")  # unsuspended by Kueue
    (owner,) = k.json("job", "via-aw")["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("AppWrapper", "via-aw")
    (workload,) = k.items("workloads.kueue.x-k8s.io")
    assert (condition(workload, "Admitted") or {}).get("status") == "True"
    assert workload["status"]["admission"]["clusterQueue"] == QUEUE
    pods = k.items("pods", "-l", "batch.kubernetes.io/job-name=via-aw")
    assert [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"]
