"""The worker's fence against a lost manager (dispatcher.fleet.fence, manager_fence.py).

- The rule: the manager is stale exactly when no new renewal of its heartbeat was seen, on
  the worker's clock, for longer than the grace it names; a worker that never saw a
  heartbeat (no manager) never fences; only a manager's copy is ever fenced.
- The grace the manager names is half its own, and a grace too short to leave a margin
  is refused with a message.
- In a worker's dispatcher: a running copy whose manager goes stale is torn down (its Job
  deleted), says ManagerLost, and does not run again when the manager is heard from; a
  queued one is held; a plain AppWrapper beside it is untouched, a copy whose manager
  renews is untouched, and a dispatcher holding no copy never reads the heartbeat.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.labels import MANAGER_UID_LABEL
from dispatcher.cli import EXIT_INPUT, main
from dispatcher.controller.kube.lease import LEASE_SECONDS
from dispatcher.controller.loop.manager_fence import ManagerFence
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.fleet.fence import (
    LEASE_NAME,
    LEASE_NAMESPACE,
    LOST_MESSAGE,
    MANAGER_LOST,
    MIN_GRACE,
    Heard,
    check_grace,
    fence_grace,
    fenced,
    handover_warning,
    hear,
    is_copy,
    stale,
)

from .fake_kube import FakeKube
from .test_runtime import Clock, aw_status, job, node, run, started

LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}"

# A look at the heartbeat: (seconds since the previous look, whether it was renewed).
looks = st.lists(st.tuples(st.floats(0.1, 40.0), st.booleans()), max_size=30)


@given(looks, st.floats(1.0, 30.0))
def test_stale_exactly_when_no_renewal_was_seen_for_longer_than_the_grace(
        seq: list[tuple[float, bool]], grace: float) -> None:
    now, renewals = 0.0, 0
    heard = hear(None, "r0", grace, now)
    seen_at = now
    for dt, renewed in seq:
        now += dt
        if renewed:
            renewals += 1
            seen_at = now
        heard = hear(heard, f"r{renewals}", grace, now)
        assert stale(heard, now) == (now - seen_at > grace)


@given(looks)
def test_a_worker_that_never_saw_a_heartbeat_never_fences(seq: list[tuple[float, bool]]
                                                          ) -> None:
    now = 0.0
    heard: Heard | None = None
    for dt, _ in seq:
        now += dt
        heard = hear(heard, None, None, now)  # no Lease (or none could be read)
        assert not stale(heard, now)


@given(st.booleans(), st.lists(st.sampled_from([None, "Preempted", MANAGER_LOST])),
       st.booleans())
def test_only_a_managers_copy_is_fenced(labelled: bool, reasons: list[str | None],
                                        manager_stale: bool) -> None:
    labels = {MANAGER_UID_LABEL: "u1"} if labelled else {"team": "a"}
    # Once stopped for a lost manager, whatever its labels say now.
    assert fenced(is_copy(labels), reasons, manager_stale) == (
        MANAGER_LOST in reasons or (labelled and manager_stale))


@given(st.floats(MIN_GRACE, 86_400.0))
def test_the_fence_grace_leaves_half_the_managers_grace_as_margin(grace: float) -> None:
    check_grace(grace)
    assert fence_grace(grace) < grace and grace - fence_grace(grace) >= MIN_GRACE / 2


def test_a_grace_too_short_to_fence_is_refused_saying_why(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    assert main(["run", "--manager", "--worker-grace", "4"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "--worker-grace must be at least 45 seconds (got 4)" in err
    assert "stops the copies" in err


# --- in a worker's dispatcher --------------------------------------------------------

def copy_of(name: str, gpus: int = 8, created: int = 0) -> dict[str, object]:
    from .test_runtime import appwrapper
    aw = appwrapper(name, job(name, 1, gpus), created=created)
    aw["metadata"]["labels"] = {MANAGER_UID_LABEL: f"manager-{name}"}
    return aw


def plain(name: str, gpus: int = 8, created: int = 0) -> dict[str, object]:
    from .test_runtime import appwrapper
    return appwrapper(name, job(name, 1, gpus), created=created)


def renew(kube: FakeKube, seconds: int = 30) -> None:
    """The manager's renewal: a new record of its Lease."""
    kube.put({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": LEASE_NAME, "namespace": LEASE_NAMESPACE},
              "spec": {"holderIdentity": "dispatcher-manager",
                       "leaseDurationSeconds": seconds}})


def jobs(kube: FakeKube) -> set[str]:
    return {j["metadata"]["name"] for j in kube.of_kind("Job")}


def fence_of(d: Dispatcher, kube: FakeKube, clock: Clock) -> ManagerFence:
    return ManagerFence(kube, d.memory, d.intake.rehold, clock=clock)  # type: ignore[arg-type]


async def settle(d: Dispatcher) -> None:
    for _ in range(3):
        await d.cycle()


def test_a_running_copy_whose_manager_goes_quiet_stops_and_never_runs_here_again() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", 16))
        kube.put(copy_of("copy"))
        kube.put(plain("mine", created=1))
        renew(kube)
        d = await started(kube, clock)
        fence = fence_of(d, kube, clock)
        await fence.look()
        await settle(d)
        assert jobs(kube) == {"copy", "mine"}
        for _ in range(3):  # renewed within the grace: left alone
            clock.now += 25
            renew(kube)
            await fence.look()
            await settle(d)
        assert jobs(kube) == {"copy", "mine"} and not d.memory.manager_stale
        clock.now += 31  # no renewal for longer than the 30 s it names
        await fence.look()
        await settle(d)
        assert jobs(kube) == {"mine"}  # the copy torn down, the plain one untouched
        status = aw_status(kube, "copy")
        reasons = [c["reason"] for c in status["conditions"]]
        assert MANAGER_LOST in reasons and status["message"] == LOST_MESSAGE
        assert status["state"] == "Pending"
        renew(kube)  # heard again: the copy waits for its manager to take it back
        clock.now += 1
        await fence.look()
        await settle(d)
        assert not d.memory.manager_stale
        assert jobs(kube) == {"mine"}
        assert aw_status(kube, "copy")["conditions"][-1]["reason"] == MANAGER_LOST

    run(scenario)


def test_a_restarted_worker_dispatcher_keeps_a_stopped_copy_stopped() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(copy_of("copy"))
        renew(kube)
        d = await started(kube, clock)
        fence = fence_of(d, kube, clock)
        await fence.look()
        await settle(d)
        clock.now += 31
        await fence.look()
        await settle(d)
        assert jobs(kube) == set()
        renew(kube)
        again = await started(kube, clock)  # a new process, the manager heard from
        await fence_of(again, kube, clock).look()
        await settle(again)
        assert jobs(kube) == set()

    run(scenario)


def test_a_queued_copy_whose_manager_goes_quiet_is_held_not_admitted() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", 8))
        kube.put(plain("big", created=0))
        kube.put(copy_of("waits", created=1))
        renew(kube)
        d = await started(kube, clock)
        fence = fence_of(d, kube, clock)
        await fence.look()
        await settle(d)
        assert jobs(kube) == {"big"}
        clock.now += 31
        await fence.look()
        await settle(d)
        kube.objects = {p: o for p, o in kube.objects.items()
                        if not p.endswith("/appwrappers/big")}
        d.on_appwrapper("DELETED", plain("big") | {"metadata": {
            "name": "big", "namespace": "team",
            "uid": d.memory.tracked[("team", "big")].uid}})
        await settle(d)
        assert "waits" not in jobs(kube)
        last = aw_status(kube, "waits")["conditions"][-1]
        assert (last["type"], last["reason"]) == ("Queueing", MANAGER_LOST)

    run(scenario)


async def looked_at_for_long(kube: FakeKube, clock: Clock) -> Dispatcher:
    """A worker's dispatcher, started, its fence looking every 100 s for 500 s."""
    d = await started(kube, clock)
    fence = fence_of(d, kube, clock)
    for _ in range(5):
        await fence.look()
        await settle(d)
        clock.now += 100
    return d


def test_a_dispatcher_holding_no_copy_never_reads_the_heartbeat() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(plain("mine"))
        await looked_at_for_long(kube, clock)
        assert LEASE_PATH not in kube.reads and jobs(kube) == {"mine"}

    run(scenario)


def test_a_copy_with_no_heartbeat_in_its_worker_runs_as_before() -> None:
    """A manager that renews no Lease (or none readable): nothing to fence by."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(copy_of("copy"))
        d = await looked_at_for_long(kube, clock)
        assert jobs(kube) == {"copy"} and not d.memory.manager_stale

    run(scenario)


# --- a tenant who removes the copy's label ---------------------------------------------

def unlabel(d: Dispatcher, kube: FakeKube, name: str) -> None:
    """The copy's owner removes its manager-uid label (as `kubectl label aw NAME
    workload.codeflare.dev/manager-uid-` would, where no webhook refuses it)."""
    obj = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", name)
    assert obj is not None
    obj["metadata"]["labels"] = {}
    d.on_appwrapper("MODIFIED", kube.put(obj))


def test_a_stopped_copy_stripped_of_its_label_stays_stopped_across_a_restart() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(copy_of("copy"))
        renew(kube)
        d = await started(kube, clock)
        fence = fence_of(d, kube, clock)
        await fence.look()
        await settle(d)
        clock.now += 31
        await fence.look()
        await settle(d)
        assert jobs(kube) == set()
        unlabel(d, kube, "copy")
        renew(kube)  # the manager is heard again (it has sent the gang elsewhere)
        clock.now += 1
        await fence.look()
        await settle(d)
        again = await started(kube, clock)  # and the worker's dispatcher restarts
        await fence_of(again, kube, clock).look()
        await settle(again)
        assert jobs(kube) == set()
        last = aw_status(kube, "copy")["conditions"][-1]
        assert (last["type"], last["reason"]) == ("Queueing", MANAGER_LOST)

    run(scenario)


def test_a_running_copy_stripped_of_its_label_still_stops_when_its_manager_goes_quiet(
) -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(copy_of("copy"))
        renew(kube)
        d = await started(kube, clock)
        fence = fence_of(d, kube, clock)
        await fence.look()
        await settle(d)
        assert jobs(kube) == {"copy"}
        unlabel(d, kube, "copy")
        d = await started(kube, clock)  # a restart: what it knew of the label is gone
        fence = fence_of(d, kube, clock)
        for _ in range(2):
            clock.now += 25
            renew(kube)
            await fence.look()
            await settle(d)
        assert jobs(kube) == {"copy"}
        assert aw_status(kube, "copy")["managerUid"] == "manager-copy"
        clock.now += 31  # the manager is cut off: it will send the gang elsewhere
        await fence.look()
        await settle(d)
        assert jobs(kube) == set()
        assert MANAGER_LOST in [c["reason"] for c in aw_status(kube, "copy")["conditions"]]

    run(scenario)


def test_replicas_on_a_lease_are_warned_of_a_grace_a_hand_over_would_outlast(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Measured: a killed leader's successor led 22.5 s after the last copy it made, and
    # workers fence after half of --worker-grace: 45 s made every copy start again.
    assert handover_warning(45, LEASE_SECONDS) is not None
    assert "--worker-grace 80 or more" in (handover_warning(60, LEASE_SECONDS) or "")
    assert handover_warning(80, LEASE_SECONDS) is None
    main(["run", "--manager", "--worker-grace", "60", "--leader-elect",
          "--kubeconfig", "/nonexistent/kubeconfig"])
    assert "warning: --worker-grace 60 with --leader-elect" in capsys.readouterr().err


def test_the_shipped_manager_grace_outlasts_a_hand_over() -> None:
    root = Path(__file__).resolve().parents[2]
    values = yaml.safe_load((root / "charts/dispatcher/values.yaml").read_text())
    args = next(d for d in yaml.safe_load_all(
        (root / "deploy/components/manager/deployment.yaml").read_text())
        if d and d.get("kind") == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    for grace in (values["manager"]["workerGrace"], float(args[args.index("--worker-grace") + 1])):
        assert handover_warning(grace, LEASE_SECONDS) is None, grace
