"""A dispatched gang counts against its quota what its pods really take of a GPU or another
extended resource when that is more than it declared: a team cannot run past its quota on a
declaration, and reclaim takes back what it really uses."""

from __future__ import annotations

from dispatcher.admission.entry import charged
from dispatcher.cluster import PlannedPod
from dispatcher.queue import Policy

from .builders import GPU, node
from .quota_world import World, appwrapper, subtree

RECLAIM = Policy("reclaim", order="priority", preemption="reclaim")


def test_a_gang_is_charged_the_larger_of_its_declaration_and_its_real_extended_use() -> None:
    declared = {"cpu": 1000, "pods": 1}
    holdings = [PlannedPod("n0", {"cpu": 2000, GPU: 4, "pods": 1})]
    # cpu stays as declared (MCAD's suites under-declare it); the GPUs are real.
    assert charged(declared, holdings) == {"cpu": 1000, "pods": 1, GPU: 4}
    assert charged({GPU: 8}, [PlannedPod("n0", {GPU: 4})]) == {GPU: 8}


def test_a_team_over_its_quota_on_a_declaration_is_reclaimed_for_a_team_within_its_own() -> None:
    """team-a (8 GPUs) runs 8 declared GPUs and a wrapper declared as 1 cpu whose pod takes
    4 GPUs: 12 of the 12. team-b's 4-GPU wrapper is within its guarantee and takes them back."""
    trees = [subtree("root", "gpu", [("root", {GPU: 12}, False)]),
             subtree("teams", "gpu", [("team-a", {GPU: 8}, True),
                                      ("team-b", {GPU: 4}, False)], parent="root")]
    w = World([node("n0", gpu=4), node("n1", gpu=4), node("n2", gpu=4)], RECLAIM, trees)
    w.submit(appwrapper("a-declared", {"gpu": "team-a"}, gpu=4, pods=2, priority=5))
    w.submit(appwrapper("a-sneaky", {"gpu": "team-a"}, cpu="1", priority=9))
    w.settle()
    assert w.is_running("a-declared") and w.is_running("a-sneaky")
    w.swap_pods("a-sneaky", {"cpu": 1000, GPU: 4, "pods": 1})
    w.submit(appwrapper("b", {"gpu": "team-b"}, gpu=4, priority=0))
    w.settle(cycles=8)
    assert w.is_running("b")
    assert not (w.is_running("a-declared") and w.is_running("a-sneaky"))
