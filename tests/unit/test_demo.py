"""The demo's watch loop: it ends once the queue has settled, whatever the AGE column says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher import demo
from localcluster import Kubectl


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SettledQueue(Kubectl):
    """Every AppWrapper Running or Completed; only the AGE column moves."""

    def __init__(self, clock: FakeTime) -> None:
        super().__init__("kubectl", "kubeconfig", "demo")
        self.clock = clock

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = 120) -> str:
        return f"NAME  STATE    AGE\nray   Running  {int(self.clock.now)}s\n"

    def items(self, *args: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "ray"},
                 "status": {"queuejobstate": "Running", "message": "3 of 3 pods running"}},
                {"metadata": {"name": "job"},
                 "status": {"queuejobstate": "Completed", "message": "done"}}]


class Alive:
    returncode = None

    def poll(self) -> None:
        return None


def test_the_demo_stops_once_nothing_has_changed_for_a_while(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeTime()
    monkeypatch.setattr(demo, "time", clock)
    assert demo._watch(SettledQueue(clock), Alive(), 300, Path("kubeconfig")) == 0  # type: ignore[arg-type]
    assert clock.now < demo.QUIET_SECONDS + 10
    assert capsys.readouterr().out.count("kubectl get appwrappers -o wide") == 1


class WaitingQueue(SettledQueue):
    def items(self, *args: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "tf"}, "status": {
            "queuejobstate": "Backoff", "message": "InsufficientResources: x; estimated "
            "start in about 1m (at 10:01 UTC)"}}]


def test_the_demo_shows_the_queue_and_its_estimates_while_some_wait(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeTime()
    monkeypatch.setattr(demo, "time", clock)
    queue = "policy fifo: 1 pending in namespace demo\n1  demo/tf  ...  in 1m0s  Backoff\n"
    assert demo._watch(WaitingQueue(clock), Alive(), 10, Path("kubeconfig"),  # type: ignore[arg-type]
                       lambda: queue) == 0
    out = capsys.readouterr().out
    assert out.count("--- dispatcher queue (ETA: the estimated start)\n" + queue) == 1
    settled = SettledQueue(clock)
    demo._watch(settled, Alive(), 10, Path("kubeconfig"), lambda: queue)  # type: ignore[arg-type]
    assert "dispatcher queue" not in capsys.readouterr().out


class Recording:
    def __init__(self) -> None:
        self.applied: list[Any] = []

    def apply(self, manifest: Any) -> str:
        self.applied.append(manifest)
        return ""

    def __call__(self, *args: str) -> str:
        assert args[:3] == ("create", "token", demo.VIEWER)
        return "the-token\n"


def test_the_demo_prints_the_dashboards_address_with_a_viewers_token_in_the_fragment(
        ) -> None:
    kubectl = Recording()
    url = demo.dashboard_url(kubectl, 8080, "demo")
    assert url == "http://127.0.0.1:8080/dashboard/#token=the-token"
    role = next(o for o in kubectl.applied[0] if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": ["workload.codeflare.dev"],
                              "resources": ["appwrappers"], "verbs": ["list"]}]
