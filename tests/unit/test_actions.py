"""`hold`, `release`, `cancel` and `why` as a user runs them: what they set, what they
refuse and say, and why's words taken from the status the dispatcher wrote."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import actions, cli
from dispatcher.api.labels import CANCELLED_BY_ANNOTATION, HELD_BY_ANNOTATION
from dispatcher.controller.kube.client import ApiError
from dispatcher.visibility import Listing, pending_queue, to_table

from .fake_kube import merge
from .stand_in_api import JsonHandler, stand_in
from .test_queue_command import T0, at, aw


class TenantKube:
    """AppWrappers of namespace `team` a user may get and patch; others are forbidden."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {o["metadata"]["name"]: copy.deepcopy(o) for o in objects}

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if path.endswith("/selfsubjectreviews"):
            return {"status": {"userInfo": {"username": "alice"}}}
        namespace, name = path.split("/namespaces/")[1].split("/")[0], path.split("/")[-1]
        if namespace != "team":
            raise ApiError(403, "Forbidden", f"appwrappers is forbidden in {namespace}")
        if name not in self.objects:
            raise ApiError(404, "NotFound", "not found")
        if method == "PATCH":
            merge(self.objects[name], body)
        return copy.deepcopy(self.objects[name])

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.objects[name]["metadata"].get("annotations") or {})


def test_hold_and_release_set_and_remove_who_holds_it() -> None:
    kube = TenantKube(aw("a", status=at(2)))
    said = asyncio.run(actions.hold(kube, "team", "a"))
    assert said == ("appwrapper team/a held: it keeps its place in the queue and is not "
                    "dispatched until released")
    assert kube.annotations("a") == {HELD_BY_ANNOTATION: "alice"}
    assert "held already (by alice)" in asyncio.run(actions.hold(kube, "team", "a"))
    assert asyncio.run(actions.release(kube, "team", "a")).endswith(
        "released: back in its place in the queue")
    assert kube.annotations("a") == {}
    assert asyncio.run(actions.release(kube, "team", "a")) == "appwrapper team/a is not held"


def test_what_cannot_be_done_is_refused_with_the_reason() -> None:
    kube = TenantKube(aw("running", status={"state": "Running"}),
                      aw("done", status={"state": "Completed"}))
    with pytest.raises(actions.Refused, match="is Running: a hold keeps a waiting "
                       "AppWrapper from being dispatched; to stop this one, cancel it"):
        asyncio.run(actions.hold(kube, "team", "running"))
    with pytest.raises(actions.Refused, match="is Completed already: nothing to cancel"):
        asyncio.run(actions.cancel(kube, "team", "done"))
    with pytest.raises(actions.Refused, match="AppWrapper nope not found in namespace team"):
        asyncio.run(actions.why(kube, "team", "nope", T0))
    with pytest.raises(actions.Refused, match=r"you may not get AppWrappers in namespace "
                       r"other: .* docs/operations\.md"):
        asyncio.run(actions.cancel(kube, "other", "running"))
    assert "cancelled: what it created is deleted" in asyncio.run(
        actions.cancel(kube, "team", "running"))
    assert kube.annotations("running") == {CANCELLED_BY_ANNOTATION: "alice"}


def test_why_says_what_the_dispatcher_published_and_who_is_ahead() -> None:
    mine = aw("mine", created=5, status=at(
        2, "priority", "waiting for the AppWrappers ahead of it (priority policy)",
        quotaPositions=[{"tree": "quota_gpu", "node": "gold", "position": 1}],
        estimatedStart="2027-01-15T09:00:00Z"))
    mine["status"]["conditions"][-1]["lastTransitionMicroTime"] = "2027-01-15T07:50:00.0Z"
    head = aw("head", namespace="other", status=at(
        1, "priority", "Fragmented: 16 nvidia.com/gpu free in total, but at most 4 on a node"))
    behind = aw("behind", status=at(3))
    text = actions.explain(mine, Listing([mine, head, behind], "cluster", "team"), T0)
    lines = text.splitlines()
    assert lines[0] == ("team/mine: Pending, Backoff/AppWrapperNotRunnable since "
                        "2027-01-15T07:50:00Z (10m ago)")
    assert lines[1] == "  why        waiting for the AppWrappers ahead of it (priority policy)"
    assert lines[2] == ("  position   2 in the cluster's queue (priority policy); 1 in quota "
                        "node gold (tree quota_gpu)")
    assert lines[3] == "  estimated  2027-01-15T09:00:00Z (in 1h)"
    assert lines[4] == ("  ahead      1  other/head  Backoff/AppWrapperNotRunnable  "
                        "Fragmented: 16 nvidia.com/gpu free in total, but at most 4 on a node")
    assert lines[-1].startswith("  history    Init → Backoff")
    # Only its namespace listed: the ones ahead elsewhere are counted, not named.
    alone = actions.explain(mine, Listing([mine, behind], "namespace", "team"), T0)
    assert "  ahead      1 AppWrapper(s) of namespaces you may not list" in alone
    # Not seen by a dispatcher: says so instead of guessing.
    assert "not taken in by a dispatcher" in actions.explain(aw("new"), None, T0)


ESCAPES = "\x1b[2J\x1b[31mroot\x1b[0m\x1b]0;pwned\x07\rfake line\u202e"


def test_what_a_tenant_wrote_reaches_queue_and_why_without_control_characters() -> None:
    held = aw("mine", status=at(2, message="waiting\x1b[1A\x1b[2K" + ESCAPES))
    held["metadata"]["annotations"] = {HELD_BY_ANNOTATION: ESCAPES}
    ahead = aw("head", status=at(1, message="the head\n\x1b[5m"))
    for text in (actions.explain(held, Listing([held, ahead], "cluster", "team"), T0),
                 to_table(pending_queue([held, ahead], T0), "cluster", None)):
        assert not any((ord(c) < 32 and c != "\n") or ord(c) == 127 or c == "\u202e"
                       for c in text), repr(text)
        assert "root fake line" in text  # the words stay, the carriage return is a space
    why = actions.explain(held, Listing([held, ahead], "cluster", "team"), T0)
    assert "  held by    root fake line" in why


# --- why gives the AppWrapper's page on the dashboard --------------------------------------

class OneWrapperApi(JsonHandler):
    """An API server holding AppWrappers of namespace `team`."""

    objects: dict[str, dict[str, Any]] = {}

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        name = path.split("/appwrappers/")[-1] if "/appwrappers/" in path else None
        if name is None:
            self._send(200, {"kind": "AppWrapperList", "metadata": {},
                             "items": list(self.objects.values())})
        elif name in self.objects:
            self._send(200, self.objects[name])
        else:
            self._send(404, {"kind": "Status", "reason": "NotFound", "message": "not found"})


@pytest.fixture
def one_wrapper(tmp_path: Path) -> Iterator[Path]:
    OneWrapperApi.objects = {"mine": aw("mine", status=at(2)),
                             "head": aw("head", status=at(1))}
    with stand_in(OneWrapperApi, tmp_path, namespace="team") as kubeconfig:
        yield kubeconfig


# What `kubectl appwrapper dashboard` prints: the address, the user's token in its fragment.
PRINTED = "http://127.0.0.1:40123/dashboard/#token=eyJhbGciOi.secret"


def test_why_prints_the_address_of_the_appwrappers_page_without_the_token(
        one_wrapper: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(actions.DASHBOARD_ENV, raising=False)
    assert cli.main(["why", "mine", "--kubeconfig", str(one_wrapper)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("team/mine: Pending") and "dashboard" not in out  # none known
    assert cli.main(["why", "mine", "--kubeconfig", str(one_wrapper),
                     "--dashboard", PRINTED]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] \
        == "  dashboard  http://127.0.0.1:40123/dashboard/#/aw/team/mine"
    assert "secret" not in out and "token" not in out
    # An installation's address, set once for everyone in the environment.
    monkeypatch.setenv(actions.DASHBOARD_ENV, "https://gpus.example.com")
    assert cli.kubectl_plugin(["why", "mine", "--kubeconfig", str(one_wrapper)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] \
        == "  dashboard  https://gpus.example.com/dashboard/#/aw/team/mine"
    monkeypatch.setenv(actions.DASHBOARD_ENV, "https://gpus.example.com/queue/dashboard")
    assert cli.main(["why", "head", "--kubeconfig", str(one_wrapper)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] \
        == "  dashboard  https://gpus.example.com/queue/dashboard/#/aw/team/head"


def test_a_dashboard_address_that_is_not_one_is_refused_by_name(
        one_wrapper: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(actions.DASHBOARD_ENV, "127.0.0.1:8080#token=secret")
    assert cli.main(["why", "mine", "--kubeconfig", str(one_wrapper)]) == 2
    err = capsys.readouterr().err
    assert err == ("dispatcher why: $DISPATCHER_DASHBOARD: not an http(s) address: "
                   "'127.0.0.1:8080' (e.g. http://127.0.0.1:8080/dashboard/)\n")
    with pytest.raises(SystemExit) as exited:
        cli.kubectl_plugin(["why", "mine", "--dashboard", "dashboard/"])
    assert exited.value.code == 2
    assert "--dashboard: not an http(s) address: 'dashboard/'" in capsys.readouterr().err
