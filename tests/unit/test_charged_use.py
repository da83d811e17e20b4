"""A dispatched gang counts against its quota what its pods really take of every resource
when that is more than it declared: a team cannot run past its quota on a declaration
(a v1beta1 custompodresources declared short, the undeclared pods of a kind the
dispatcher cannot count), and reclaim takes back what it really uses."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatcher.admission.entry import charged
from dispatcher.cluster import PlannedPod
from dispatcher.policy_files import load_policy
from dispatcher.queue import Policy

from .builders import GI, GPU, node
from .quota_world import (
    World,
    appwrapper,
    declared_short,
    job_of,
    leader_workers,
    subtree,
)

RECLAIM = Policy("reclaim", order="priority", preemption="reclaim")
CPU_3 = {"cpu": 3000, "pods": 1}


def test_a_gang_is_charged_the_larger_of_its_declaration_and_its_real_use() -> None:
    declared = {"cpu": 1000, "memory": 4 * GI, "pods": 1}
    holdings = [PlannedPod("n0", {"cpu": 2000, "memory": GI, GPU: 4, "pods": 1})]
    assert charged(declared, holdings) == {"cpu": 2000, "memory": 4 * GI, "pods": 1, GPU: 4}
    assert charged({GPU: 8}, [PlannedPod("n0", {GPU: 4})]) == {GPU: 8}


resources = st.sampled_from(["cpu", "memory", "pods", GPU, "example.com/foo"])
amounts = st.dictionaries(resources, st.integers(0, 10**12), max_size=5)


@given(amounts, st.lists(st.tuples(st.sampled_from(["n0", "n1"]), amounts), max_size=6))
def test_every_resource_is_charged_the_larger_of_declared_and_held(
        declared: dict[str, int], pods: list[tuple[str, dict[str, int]]]) -> None:
    out = charged(declared, [PlannedPod(n, r) for n, r in pods])
    for r in {*declared, *(r for _, p in pods for r in p)}:
        held = sum(p.get(r, 0) for _, p in pods)
        assert out.get(r, 0) == max(declared.get(r, 0), held)


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


def quantity(resource: str, amount: int) -> str:
    """An amount in canonical units (millicpu, bytes) as a manifest writes it."""
    return f"{amount}m" if resource == "cpu" else str(amount)


def cpu_teams(hard_a: bool = False, resource: str = "cpu", amount: int = 32000
              ) -> list[dict[str, object]]:
    """A root of 2 x `amount` of `resource` (canonical units) over team-a and team-b,
    `amount` each."""
    each, root = quantity(resource, amount), quantity(resource, 2 * amount)
    return [subtree("root", "cpu", [("root", {resource: root}, False)]),
            subtree("teams", "cpu", [("team-a", {resource: each}, hard_a),
                                     ("team-b", {resource: each}, False)], parent="root")]


def reclaimed(w: World, name: str) -> bool:
    """Whether `name` was preempted to give back quota it borrowed (requeued, its
    declaration may dispatch it again)."""
    return any(("test", name) in d.reclaims for ds in w.history for d in ds)


def two_nodes_of_32_cpu() -> list[object]:
    return [node("n0", gpu=0, cpu=32, mem_gi=128), node("n1", gpu=0, cpu=32, mem_gi=128)]


def test_a_job_declared_as_one_small_pod_is_charged_its_twenty_and_reclaimed() -> None:
    """team-a wraps a Job of 20 pods of 3 cpu in a declaration of 1 x 100m (accepted, as
    MCAD does, with a warning): its pods take 60 of the 64 cpu. team-b asks 30 of its
    guaranteed 32 cpu: team-a, charged its 60, borrows 28 and is reclaimed for it."""
    w = World(two_nodes_of_32_cpu(), RECLAIM, cpu_teams())  # type: ignore[arg-type]
    w.submit(declared_short("a", {"cpu": "team-a"}, job_of("a", 20, {"cpu": "3"}),
                            [(1, {"cpu": "100m"})], priority=9))
    w.settle()
    assert w.is_running("a")
    w.swap_pods("a", CPU_3)  # the one declared pod is really 3 cpu
    assert w.more_pods("a", 19, CPU_3) == 19  # and the Job makes 19 more
    w.submit(appwrapper("b", {"cpu": "team-b"}, cpu="3", memory="0", pods=10))
    last = w.settle(cycles=8)
    assert w.is_running("b"), last[("test", "b")].message
    assert reclaimed(w, "a")


def test_the_undeclared_pods_of_a_leader_worker_set_are_charged_and_reclaimed() -> None:
    """team-a wraps a LeaderWorkerSet of 20 pods of 3 cpu (a kind the dispatcher cannot
    count) declaring a leader and one worker: the 18 undeclared workers take free room,
    60 cpu in all. team-b's 30 of its guaranteed 32 cpu reclaim it."""
    w = World(two_nodes_of_32_cpu(), RECLAIM, cpu_teams())  # type: ignore[arg-type]
    w.submit(declared_short("a", {"cpu": "team-a"}, leader_workers("a", 20, {"cpu": "3"}),
                            [(1, {"cpu": "3"}), (1, {"cpu": "3"})], priority=9))
    w.settle()
    assert w.is_running("a")
    assert w.more_pods("a", 18, CPU_3) == 18
    w.submit(appwrapper("b", {"cpu": "team-b"}, cpu="3", memory="0", pods=10))
    last = w.settle(cycles=8)
    assert w.is_running("b"), last[("test", "b")].message
    assert reclaimed(w, "a")


UNITS = {"cpu": 1000, "memory": 4 * GI}  # one unit: a node has 32, each team 32, the root 64


@settings(max_examples=60, deadline=None)
@given(resource=st.sampled_from(sorted(UNITS)),
       declared=st.tuples(st.integers(1, 4), st.integers(1, 3000)),
       real=st.tuples(st.integers(0, 24), st.integers(100, 4000)),
       asked=st.integers(16, 30), hard_a=st.booleans(),
       policy=st.sampled_from(["reclaim", "priority-preemption"]))
@example(resource="cpu", declared=(1, 100), real=(19, 3000), asked=30, hard_a=False,
         policy="reclaim")
@example(resource="memory", declared=(1, 10), real=(20, 3000), asked=30, hard_a=True,
         policy="priority-preemption")
def test_a_team_asking_within_its_guarantee_runs_whatever_another_declared(
        resource: str, declared: tuple[int, int], real: tuple[int, int], asked: int,
        hard_a: bool, policy: str) -> None:
    """team-a (priority 9) declares some pods of one resource and its pods really take
    any amount (in thousandths of a unit) of the free room; team-b (priority 0) asks 16
    to 30 of its guaranteed 32 units in pods of one unit: it runs, once team-a is
    reclaimed when it is over its share."""
    unit = UNITS[resource]
    chosen = RECLAIM if policy == "reclaim" else load_policy(policy)
    w = World(two_nodes_of_32_cpu(), chosen,  # type: ignore[arg-type]
              cpu_teams(hard_a, resource, 32 * unit))
    template = job_of("a", declared[0] + real[0], {resource: "1m"})
    w.submit(declared_short("a", {"cpu": "team-a"}, template,
                            [(declared[0],
                              {resource: quantity(resource, declared[1] * unit // 1000)})],
                            priority=9))
    w.settle()
    assert w.is_running("a")
    w.more_pods("a", real[0], {resource: real[1] * unit // 1000, "pods": 1})
    w.submit(declared_short("b", {"cpu": "team-b"}, job_of("b", asked, {}),
                            [(asked, {resource: quantity(resource, unit)})]))
    last = w.settle(cycles=8)
    assert w.is_running("b"), last[("test", "b")].message
