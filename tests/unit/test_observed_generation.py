"""Conditions say which spec generation they were reached for, so that `kubectl wait
--for=condition=X` neither takes one reached for an older spec nor waits for ever on one
that holds for the new spec too."""

from __future__ import annotations

import copy

from .fake_kube import FakeKube
from .test_holds import AW
from .test_runtime import Clock, appwrapper, aw_status, job, node, run, started


def edit(kube: FakeKube, d: object, name: str, **spec: object) -> None:
    obj = kube.get(AW, "AppWrapper", "team", name)
    assert obj is not None
    obj["spec"].update(spec)
    obj["metadata"]["generation"] += 1
    d.on_appwrapper("MODIFIED", copy.deepcopy(obj))  # type: ignore[attr-defined]


def test_a_waiting_wrappers_condition_is_reached_again_for_an_edited_spec() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("big", job("big", 1, 16)))
        d = await started(kube, clock)
        await d.cycle()
        assert aw_status(kube, "big")["conditions"][-1]["observedGeneration"] == 1
        edit(kube, d, "big", priority=3)
        clock.now += 1
        await d.cycle()
        last = aw_status(kube, "big")["conditions"][-1]
        assert (last["type"], last["observedGeneration"]) == ("Backoff", 2)

    run(scenario)


def test_a_completed_wrapper_edited_stays_completed_for_the_new_spec() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        done = appwrapper("done", job("done", 1, 1))
        done["metadata"]["generation"] = 1
        done["status"] = {"state": "Completed", "conditions": [
            {"type": "Completed", "status": "True", "reason": "PodsCompleted",
             "observedGeneration": 1}]}
        kube.put(node("n1"))
        kube.put(done)
        d = await started(kube, clock)
        await d.cycle()
        edit(kube, d, "done", priority=3)
        await d.cycle()
        last = aw_status(kube, "done")["conditions"][-1]
        assert (last["type"], last["observedGeneration"]) == ("Completed", 2)
        assert aw_status(kube, "done")["state"] == "Completed"

    run(scenario)
