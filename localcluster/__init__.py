"""A local Kubernetes control plane with fake GPU nodes, for tests and the demo.

``python -m localcluster build|up|down|status|env`` — see localcluster/README.md.
"""

from .cluster import Cluster, ClusterError
from .kube import Kubectl, KubectlError, wait_for

__all__ = ["Cluster", "ClusterError", "Kubectl", "KubectlError", "wait_for"]
