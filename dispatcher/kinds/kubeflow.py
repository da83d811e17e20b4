"""Kubeflow training jobs (group kubeflow.org, any version).

Each job keeps its pods under `spec.<x>ReplicaSpecs.<ReplicaType>`. Replica types are
matched case-insensitively (the operators accept `worker` for `Worker`) and listed in
case-insensitive alphabetical order, which is also the order the API server returns
them in, so the pod-set order never depends on how the YAML was written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.kinds.base import Handler, InvalidItem, Path, Template, as_map, child_map, count

GROUP = "kubeflow.org"
REPLICA_SPECS = {
    "TFJob": "tfReplicaSpecs",
    "PyTorchJob": "pytorchReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "MXJob": "mxReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
}
# Missing `replicas` per replica type (lower-cased); every other type defaults to 1.
MPI_DEFAULTS = {"launcher": 1, "worker": 0}


def _replica_templates(obj: Mapping[str, Any], kind: str) -> list[Template]:
    field = REPLICA_SPECS[kind]
    spec = child_map(obj, "spec", ())
    specs = child_map(spec, field, ("spec",))
    seen: dict[str, str] = {}
    out: list[Template] = []
    for rtype in sorted(specs, key=lambda k: (str(k).lower(), str(k))):
        name = str(rtype)
        if name.lower() in seen:
            raise InvalidItem(
                f"spec.{field} has both {seen[name.lower()]} and {name}: replica types are "
                "case-insensitive, keep one"
            )
        seen[name.lower()] = name
        rpath: Path = ("spec", field, name)
        replica_spec = as_map(specs[rtype], rpath)
        default = MPI_DEFAULTS.get(name.lower(), 1) if kind == "MPIJob" else 1
        out.append(Template(
            name, count(replica_spec, "replicas", rpath, default), (*rpath, "template"),
            replica_spec.get("template"),
        ))
    return out


def _handler(kind: str) -> Handler:
    return lambda obj: _replica_templates(obj, kind)


HANDLERS: dict[tuple[str, str], Handler] = {(GROUP, kind): _handler(kind) for kind in REPLICA_SPECS}
