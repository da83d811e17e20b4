"""An elastic PyTorchJob grows and shrinks under deploy/'s RBAC exactly: the dispatcher runs
with the `dispatcher` service account's token, as deploy/ runs it, so every verb it uses on
the wrapped kinds -- patch on the PyTorchJob included -- is the one deploy/ grants. (Its own
module: the elastic tests beside it run a dispatcher with admin credentials.)

Default profile, 4 nodes x 8 GPUs; every pod takes a whole node.
"""

from __future__ import annotations

from localcluster import Cluster, Kubectl

from .dispatcher_process import DispatcherProcess
from .test_elastic import grows_then_shrinks
from .test_operations import SA_NAMESPACE, wait_alone
from .webhook_process import Installed


def test_an_elastic_pytorchjob_grows_and_shrinks_as_the_service_account(
        deployed: Installed, local_cluster: Cluster, kubectl: Kubectl, k: Kubectl,
        namespace: str) -> None:
    wait_alone(kubectl, namespace)
    d = DispatcherProcess(deployed.controller_kubeconfig, local_cluster.logs,
                          name="elastic-as-service-account")
    try:
        d.start("priority", extra_args=["--leader-elect", "--lease-namespace", SA_NAMESPACE,
                                        "--require-creator"])
        grows_then_shrinks(k)
        assert d.alive()
        log = d.this_run()
        assert "could not resize" not in log and "forbidden" not in log.lower(), d.tail()
    finally:
        d.stop()
