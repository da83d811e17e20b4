"""The dashboard of `dispatcher run`, in headless Chromium, against the local cluster: a
tenant with a service account token sees its namespace's waiting AppWrappers at their
places in the whole queue, with the reasons in words, and nothing of another namespace;
an AppWrapper's Events are shown to a viewer who may list Events there, and not to one who
may only list AppWrappers; an administrator sees everything, the timeline and one
AppWrapper's page; a request without a token is refused.

The controller runs as deploy/ runs it: with the `dispatcher` service account's token, so
bound by deploy/'s RBAC (what it may read for the page is what deploy/ grants), with
leader election and creators required, deploy/'s webhook recording them.

Screenshots go to $DASHBOARD_SCREENSHOTS (docs/images/ refreshes the documentation's),
else to the test's temporary directory.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from tests import browser

from .dispatcher_process import DispatcherProcess
from .test_actions import viewer_token
from .test_operations import SA_NAMESPACE, appwrapper, free_port, job, wait_alone
from .webhook_process import Installed

#: deploy/'s command line for the controller (deploy/base/dispatcher.yaml), bar the ports.
AS_DEPLOYED = ["--leader-elect", "--lease-namespace", SA_NAMESPACE, "--require-creator"]


@pytest.fixture
def dispatcher(deployed: Installed, local_cluster: Cluster) -> Iterator[DispatcherProcess]:
    browser.skip_or_fail()
    d = DispatcherProcess(deployed.controller_kubeconfig, local_cluster.logs, "dashboard")
    yield d
    d.finish()


@pytest.fixture
def other(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A second namespace, of another team."""
    name = f"{namespace[:50]}-other"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def tenant_token(kubectl: Kubectl, namespace: str, name: str = "tenant",
                 events: bool = False) -> str:
    """A service account that may list AppWrappers in its own namespace only (and, with
    `events`, list Events there too)."""
    rules = [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
              "verbs": ["list", "get"]}]
    if events:
        rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["list"]})
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"{name}-reader", "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{name}-reader", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": f"{name}-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}])
    return kubectl("create", "token", name, "-n", namespace).strip()


def event_about(k: Kubectl, namespace: str, name: str, reason: str) -> None:
    """An Event about the AppWrapper `name`, as another controller would post one."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    k.apply({"apiVersion": "v1", "kind": "Event",
             "metadata": {"name": f"{name}.{reason.lower()}", "namespace": namespace},
             "involvedObject": {"apiVersion": "workload.codeflare.dev/v1beta1",
                                "kind": "AppWrapper", "namespace": namespace, "name": name},
             "reason": reason, "message": f"an Event about {name}", "type": "Normal",
             "count": 1, "firstTimestamp": now, "lastTimestamp": now,
             "source": {"component": "dashboard-test"}})


def open_first(driver: Any, namespace: str) -> str:
    """Opens the first row's AppWrapper page; its text once its conditions are shown."""
    link = driver.find_element("css selector", "#queue-table tbody a")
    key = link.text
    link.click()
    shown = str(wait_for(lambda: "Conditions, in order" in (t := driver.find_element(
        "id", "detail-body").text) and t, 60, f"the first AppWrapper's page in {namespace}"))
    assert driver.current_url.endswith(f"#/aw/{key}")  # its own address, no token in it
    return shown


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
    reader = tenant_token(kubectl, namespace, "reader", events=True)
    port = free_port()
    page = f"http://127.0.0.1:{port}/dashboard/"
    out = shots(tmp_path)
    try:
        dispatcher.start("priority", extra_args=["--metrics-port", str(port),
                                                 "--metrics-host", "127.0.0.1", *AS_DEPLOYED])
        k.apply(wrapper("small", 1, 0))  # runs: the timeline's running gang
        # More GPUs than any node has: they wait, in priority order across namespaces.
        k.apply(wrapper("big-p9", 64, 9))
        kubectl.in_namespace(other).apply(wrapper("theirs-p5", 64, 5))
        k.apply(wrapper("big-p1", 64, 1))
        k.apply(wrapper("parked", 64, 3, held=True))
        event_about(k, namespace, "big-p9", "CheckedByHand")
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
            # The tenant may list AppWrappers, not Events: its big-p9 page shows none.
            detail = open_first(driver, namespace)
            assert f"Events: shown to users who may list Events in namespace {namespace}" \
                in detail, detail
            assert "CheckedByHand" not in detail
        with browser.chromium() as driver:
            # Its page's address, opened afresh with the token alone (no namespaces named):
            # asked as a viewer of its namespace, the tenant's right.
            driver.get(f"{page}#/aw/{namespace}/big-p9?token={tenant}")
            wait_for(lambda: "Conditions, in order" in driver.find_element(
                "id", "detail-body").text, 60, "big-p9's page at its address")
            assert driver.current_url == f"{page}#/aw/{namespace}/big-p9"
        with browser.chromium() as driver:
            # A viewer who may list Events there too sees them, read by the controller
            # within deploy/'s RBAC.
            driver.get(f"{page}#token={reader}&namespaces={namespace}")
            wait_for(lambda: browser.rows(driver), 120, "the reader's rows")
            open_first(driver, namespace)
            wait_for(lambda: "an Event about big-p9" in driver.find_element(
                "id", "detail-body").text, 60, "big-p9's Events on its page")
            assert "CheckedByHand" in driver.find_element("id", "detail-body").text
            driver.save_screenshot(str(out / "dashboard-appwrapper.png"))
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
            detail = open_first(driver, namespace)
            assert "Queueing" in detail
            # It may list AppWrappers everywhere, but Events nowhere.
            assert "Events: shown to users who may list Events" in detail
        # Without a token, and with one that is not a token: refused.
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(
                    f"{page}api/queue", headers=headers), timeout=10)
            assert refused.value.code == 401
    finally:
        name = f"{namespace}-queue-viewer"
        kubectl("delete", "clusterrole,clusterrolebinding", name, "--ignore-not-found")
