"""deploy/'s RBAC grants the dispatcher's service account the verbs its code uses on each
kind it wraps -- create, get and delete on every kind of the default allow-list, patch on
the kinds whose size it changes -- and patch on nothing else. (tests/cluster asks the API
server the same of the applied manifests.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dispatcher.kinds.elastic import RESIZABLE
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS

RBAC = Path(__file__).parents[2] / "deploy" / "base" / "rbac"
AGGREGATED = "workload.codeflare.dev/aggregate-to-dispatcher"


def plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + ("es" if lower.endswith("s") else "s")


def granted() -> set[tuple[str, str, str]]:
    """(group, resource, verb) the ClusterRoles aggregated into dispatcher-wrapped-kinds
    grant."""
    out: set[tuple[str, str, str]] = set()
    for path in sorted(RBAC.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "ClusterRole" or \
                    (doc["metadata"].get("labels") or {}).get(AGGREGATED) != "true":
                continue
            rule: dict[str, Any]
            for rule in doc.get("rules") or []:
                assert "resourceNames" not in rule, rule
                out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"]
                        for v in rule["verbs"]}
    return out


def test_every_allowed_kind_can_be_created_read_and_deleted() -> None:
    rights = granted()
    missing = [(g, k, v) for g, k in sorted(DEFAULT_ALLOWED_KINDS)
               for v in ("create", "get", "delete") if (g, plural(k), v) not in rights]
    assert missing == []


def test_patch_is_granted_on_exactly_the_kinds_the_dispatcher_resizes() -> None:
    patched = {(g, r) for g, r, v in granted() if v == "patch"}
    assert patched == {(g, plural(k)) for g, k in RESIZABLE}
    assert ("kubeflow.org", "pytorchjobs") in patched  # the elastic PyTorchJob's Workers
    assert ("batch", "jobs") not in patched


def own_rights(root: Path = RBAC) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the ClusterRole `dispatcher` (what the dispatcher reads and
    writes itself) grants, as the files under `root` say."""
    docs = yaml.safe_load_all((root / "dispatcher.yaml").read_text())
    role = next(d for d in docs if d and d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "dispatcher")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def test_the_dispatcher_posts_events_and_lists_them_for_the_dashboard_in_deploy_and_chart(
) -> None:
    """Its own Events are created; one AppWrapper's are listed for its dashboard page (a
    403 there otherwise). The chart renders deploy/'s own files: the same rights."""
    chart = Path(__file__).parents[2] / "charts" / "dispatcher" / "files" / "base" / "rbac"
    assert chart.resolve() == RBAC.resolve()
    for root in (RBAC, chart):
        assert {v for g, r, v in own_rights(root) if (g, r) == ("", "events")} == {
            "create", "list"}
