"""The dashboard of `dispatcher run`, in headless Chromium, against the local cluster: a
tenant with a service account token sees its namespace's waiting AppWrappers at their
places in the whole queue, with the reasons in words, and nothing of another namespace;
an administrator sees everything, the timeline and one AppWrapper's page; a request
without a token is refused.

Screenshots go to $DASHBOARD_SCREENSHOTS (docs/images/ refreshes the documentation's),
else to the test's temporary directory.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from tests import browser

from .dispatcher_process import DispatcherProcess, install_crd
from .test_actions import viewer_token
from .test_operations import appwrapper, free_port, job, wait_alone


@pytest.fixture
def dispatcher(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    browser.skip_or_fail()
    install_crd(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "dashboard")
    yield d
    d.finish()


@pytest.fixture
def other(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A second namespace, of another team."""
    name = f"{namespace[:50]}-other"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def tenant_token(kubectl: Kubectl, namespace: str) -> str:
    """A service account that may list AppWrappers in its own namespace only."""
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "tenant", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "queue-reader", "namespace": namespace},
         "rules": [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                    "verbs": ["list", "get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "queue-reader", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "queue-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]}])
    return kubectl("create", "token", "tenant", "-n", namespace).strip()


def wrapper(name: str, gpus: int, priority: int, held: bool = False) -> dict[str, Any]:
    obj = appwrapper(name, job(name, 1, gpus))
    obj["spec"]["priority"] = priority
    if held:
        obj["metadata"]["annotations"] = {"workload.codeflare.dev/held-by": "carol"}
    return obj


def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_a_tenant_and_an_administrator_see_the_queue_in_the_browser(
        dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl, namespace: str,
        other: str, tmp_path: Path) -> None:
    wait_alone(kubectl, namespace)
    admin, tenant = viewer_token(kubectl, namespace), tenant_token(kubectl, namespace)
    port = free_port()
    page = f"http://127.0.0.1:{port}/dashboard/"
    out = shots(tmp_path)
    try:
        dispatcher.start("priority", extra_args=["--metrics-port", str(port),
                                                 "--metrics-host", "127.0.0.1"])
        k.apply(wrapper("small", 1, 0))  # runs: the timeline's running gang
        # More GPUs than any node has: they wait, in priority order across namespaces.
        k.apply(wrapper("big-p9", 64, 9))
        kubectl.in_namespace(other).apply(wrapper("theirs-p5", 64, 5))
        k.apply(wrapper("big-p1", 64, 1))
        k.apply(wrapper("parked", 64, 3, held=True))
        with browser.chromium() as driver:
            driver.get(f"{page}#token={tenant}&namespaces={namespace}")
            want = [("1", f"{namespace}/big-p9", "waiting"),
                    ("3", f"{namespace}/big-p1", "waiting"),
                    ("-", f"{namespace}/parked", "held by carol")]
            shown = wait_for(lambda: (r := browser.rows(driver)) and
                             [(c[0], c[1], c[2]) for c in r] == want and r,
                             120, f"the tenant's page to show {want}")
            assert all("nvidia.com/gpu" in c[8] for c in shown[:2]), shown
            assert "token" not in driver.current_url
            assert not any(other in c[1] for c in browser.rows(driver))
            driver.save_screenshot(str(out / "dashboard-queue-tenant.png"))
        with browser.chromium() as driver:
            driver.get(f"{page}#token={admin}")
            wait_for(lambda: [c[1].split("/")[1] for c in browser.rows(driver)] == [
                "big-p9", "theirs-p5", "big-p1", "parked"], 120, "the whole queue")
            driver.save_screenshot(str(out / "dashboard-queue.png"))
            driver.find_element("id", "tab-timeline").click()
            wait_for(lambda: "small" in driver.find_element("id", "timeline-body").text,
                     120, "the running gang on the timeline")
            driver.save_screenshot(str(out / "dashboard-timeline.png"))
            driver.find_element("id", "tab-queue").click()
            wait_for(lambda: browser.rows(driver), 60, "the queue again")
            driver.find_element("css selector", "#queue-table tbody button").click()
            detail = wait_for(lambda: "Conditions, in order" in (t := driver.find_element(
                "id", "detail-body").text) and t, 60, "big-p9's page")
            assert "Queueing" in detail and "Events" in detail
            driver.save_screenshot(str(out / "dashboard-appwrapper.png"))
        # Without a token, and with one that is not a token: refused.
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(
                    f"{page}api/queue", headers=headers), timeout=10)
            assert refused.value.code == 401
    finally:
        name = f"{namespace}-queue-viewer"
        kubectl("delete", "clusterrole,clusterrolebinding", name, "--ignore-not-found")
