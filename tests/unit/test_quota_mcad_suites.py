"""MCAD's quota kuttl suites, step by step, as decisions of the core.

Each test replays one suite of ../shared/conformance/mcad-kuttl on the default local
cluster (4 nodes x 8 GPUs / 64 CPUs) under the built-in `priority-preemption` policy (MCAD
runs those suites with preemption enabled), and asserts what the suite's NN-assert.yaml
asserts: Running (dispatched) or Pending (waiting). The trees are the suites' own numbers.
"""

from __future__ import annotations

from typing import Any

from dispatcher.admission import PREEMPTING, QUOTA_EXCEEDED, UNKNOWN_QUOTA
from dispatcher.policy_files import load_policy
from dispatcher.queue import Policy

from .builders import node
from .quota_world import World, appwrapper, subtree

GPU = "nvidia.com/gpu"


def mcad_trees() -> list[dict[str, Any]]:
    """test/e2e-kuttl/install-quota-subtree.yaml (also the borrowing suite's)."""
    big = {"cpu": "1075m", "memory": "1045Mi", GPU: 16}
    zero = {"cpu": "0m", "memory": "0Mi", GPU: 0}
    return [
        subtree("context-root", "quota_context", [("context-root", big, False)]),
        subtree("service-root", "quota_service", [("service-root", big, False)]),
        subtree("context-root-children", "quota_context", [
            ("gold", {"cpu": "1075m", "memory": "450Mi", GPU: 8}, False),
            ("silver", {"cpu": "1075m", "memory": "400Mi", GPU: 8}, False),
            ("bronze", {"cpu": "900m", "memory": "300Mi", GPU: 8}, True),
            ("default", zero, False)], parent="context-root"),
        subtree("service-root-children", "quota_service", [
            ("gold", big, False), ("default", zero, False)], parent="service-root"),
    ]


def preemption_policy() -> Policy:
    return load_policy("priority-preemption")


def cluster_nodes() -> list[Any]:
    return [node(f"gpu-{i}", gpu=8, cpu=64, mem_gi=512) for i in range(4)]


def world(subtrees: list[dict[str, Any]] | None = None) -> World:
    return World(cluster_nodes(), preemption_policy(), mcad_trees() if subtrees is None
                 else subtrees)


def ctx(context: str, service: str) -> dict[str, str]:
    return {"quota_context": context, "quota_service": service}


def test_quota_forest_suite() -> None:
    w = world()
    assert w.forest.problems == []  # step 01: the four QuotaSubtrees make two trees
    # 04: gold/gold, a StatefulSet of one 600m pod.
    w.submit(appwrapper("job-gold-lo-pri-1replica", ctx("gold", "gold"), cpu="600m",
                        memory="95Mi"))
    w.settle()
    assert w.is_running("job-gold-lo-pri-1replica")
    # 05: quota ids no tree has -> Pending, with a reason naming the labels.
    w.submit(appwrapper("job-bad-quota-id-10replica", ctx("context-root2", "service-root2"),
                        cpu="100m", memory="95Mi", pods=10))
    last = w.settle()
    bad = last[("test", "job-bad-quota-id-10replica")]
    assert (bad.decision, bad.reason) == ("wait", UNKNOWN_QUOTA)
    assert "quota tree quota_context has no node context-root2" in bad.message
    # 06: gold/gold at priority 1000: gold and the root would hold 1200m of 1075m; the
    # priority-0 wrapper of the same leaf is preempted, whole.
    w.submit(appwrapper("job-gold-high-pri-1replica", ctx("gold", "gold"), cpu="600m",
                        memory="95Mi", priority=1000))
    first = w.cycle()
    high = next(d for d in first if d.name == "job-gold-high-pri-1replica")
    assert (high.decision, high.reason) == ("preempt", PREEMPTING)
    assert high.preempts == (("test", "job-gold-lo-pri-1replica"),) and high.reclaims == ()
    assert high.message.startswith("dispatch after preempting test/job-gold-lo-pri-1replica")
    last = w.settle()
    assert w.is_running("job-gold-high-pri-1replica")
    assert not w.is_running("job-gold-lo-pri-1replica")
    assert last[("test", "job-gold-lo-pri-1replica")].reason == QUOTA_EXCEEDED
    assert not w.is_running("job-bad-quota-id-10replica")
    # 07: bronze/gold, 400m at priority 1000: 600m + 400m fit both roots.
    w.submit(appwrapper("job-1-bronze-1replica", ctx("bronze", "gold"), cpu="400m",
                        memory="95Mi", priority=1000))
    w.settle()
    assert w.is_running("job-1-bronze-1replica") and w.is_running("job-gold-high-pri-1replica")
    # 08: a second bronze 400m: the root would hold 1400m of 1075m and nothing of lower
    # priority sits on its path -> Pending; the others keep running.
    w.submit(appwrapper("job-2-bronze-1replica", ctx("bronze", "gold"), cpu="400m",
                        memory="95Mi", priority=1000))
    last = w.settle()
    second = last[("test", "job-2-bronze-1replica")]
    assert (second.decision, second.reason) == ("wait", QUOTA_EXCEEDED)
    assert "context-root would use 1400m of its 1075m cpu" in second.message
    assert w.is_running("job-1-bronze-1replica") and w.is_running("job-gold-high-pri-1replica")
    assert not w.is_running("job-gold-lo-pri-1replica")
    # 09: everything deleted; two bronze Jobs of 900m: one fills bronze, the other waits
    # for it and runs once it has completed.
    for name in list(n for _, n in w.running) + [n for _, n in w.queue._by_key]:
        w.delete(name)
    w.submit(appwrapper("my-job-1", ctx("bronze", "gold"), cpu="900m", memory="300Mi"))
    w.submit(appwrapper("my-job-2", ctx("bronze", "gold"), cpu="900m", memory="300Mi"))
    last = w.settle()
    assert w.is_running("my-job-1")
    assert "bronze (tree quota_context) would use 1800m of its 900m cpu and cannot borrow: " \
           "hardLimit" in last[("test", "my-job-2")].message
    w.complete("my-job-1")
    w.settle()
    assert w.is_running("my-job-2")
    w.complete("my-job-2")
    # 10: no labels: the default leaf of each tree (0 quota) borrows from its root.
    w.submit(appwrapper("job-without-labels", cpu="900m", memory="300Mi"))
    last = w.settle()
    d = last[("test", "job-without-labels")]
    assert d.decision == "dispatch"
    assert [(q.tree, q.leaf, q.node) for q in d.quota] == [
        ("quota_context", "default", "context-root"), ("quota_service", "default",
                                                        "service-root")]
    w.complete("job-without-labels")
    # 11: a label that is no tree's name is ignored: the default leaves again.
    w.submit(appwrapper("job-with-labels-no-quota", {"my-label-key": "my-label-value"},
                        cpu="900m", memory="300Mi"))
    w.settle()
    assert w.is_running("job-with-labels-no-quota")


def test_quota_errors_suite() -> None:
    w = world()
    manifest = appwrapper("deployment-silver-lo-pri-1replica", ctx("silver", "gold"),
                          cpu="100m", memory="32Mi")
    w.submit(manifest)  # 03
    w.settle()
    assert w.is_running("deployment-silver-lo-pri-1replica")
    w.delete("deployment-silver-lo-pri-1replica")  # 04
    w.settle()
    assert w.ledger is not None and len(w.ledger) == 0  # its usage went with it
    w.submit(manifest)  # 05: applied again, dispatched again
    w.settle()
    assert w.is_running("deployment-silver-lo-pri-1replica")


def test_borrowing_suite() -> None:
    w = world()
    # 03: silver, 2 pods of 8 GPUs: 16 GPUs exceed silver's 8 -> borrows from the root.
    w.submit(appwrapper("my-job-1", ctx("silver", "gold"), cpu="500m", memory="300Mi",
                        gpu=8, pods=2))
    last = w.settle()
    one = last[("test", "my-job-1")]
    assert one.decision == "dispatch"
    assert one.quota[0].borrows and one.quota[0].node == "context-root"
    assert "borrowing from context-root" in one.message
    # 04: gold, 8 GPUs, same priority: within its own quota, so it reclaims from the
    # borrower although the cluster has 16 GPUs free.
    w.submit(appwrapper("my-job-2", ctx("gold", "gold"), cpu="500m", memory="300Mi", gpu=8))
    first = w.cycle()
    two = next(d for d in first if d.name == "my-job-2")
    assert two.decision == "preempt" and two.preempts == (("test", "my-job-1"),)
    assert two.reclaims == (("test", "my-job-1"),)  # for quota, not for priority
    assert "reclaiming the quota it borrows" in two.message
    w.settle()
    assert w.is_running("my-job-2") and not w.is_running("my-job-1")


def test_deployment_01_quota_steps() -> None:
    """Wrappers dispatched before quotas existed count against their default leaf."""
    w = world(subtrees=[])
    w.submit(appwrapper("no-quota-deployment-01", cpu="300m", memory="32Mi"))  # 01
    w.submit(appwrapper("no-quota-job-02", cpu="500m", memory="300Mi"))  # 02
    w.settle()
    w.complete("no-quota-job-02")  # its Job completes
    w.submit(appwrapper("hold-completion-job-03", cpu="1500m", memory="2Gi"))  # 03
    w.settle()
    assert w.is_running("no-quota-deployment-01") and w.is_running("hold-completion-job-03")
    # 04-05: quota management on, with one tree (root 1950m / 1500Mi).
    w.set_quota([
        subtree("context-root", "quota_context",
                [("context-root", {"cpu": "1950m", "memory": "1500Mi"}, False)]),
        subtree("context-root-children", "quota_context", [
            ("gold", {"cpu": "1075m", "memory": "450Mi"}, False),
            ("silver", {"cpu": "1075m", "memory": "400Mi"}, False),
            ("bronze", {"cpu": "900m", "memory": "300Mi"}, True),
            ("default", {"cpu": "0m", "memory": "0Mi"}, False)], parent="context-root"),
    ])
    # 06: 1500m more without labels: the root would hold 3300m of 1950m -> Pending.
    w.submit(appwrapper("no-quota-job-06", cpu="1500m", memory="300Mi"))
    last = w.settle()
    assert last[("test", "no-quota-job-06")].reason == QUOTA_EXCEEDED
    assert "context-root would use 3300m of its 1950m cpu" in last[("test",
                                                                     "no-quota-job-06")].message
    # 07: the admitted ones are deleted -> it runs.
    w.delete("no-quota-deployment-01")
    w.delete("hold-completion-job-03")
    w.settle()
    assert w.is_running("no-quota-job-06")
    # 08: bronze, 300m / 300Mi: exactly bronze's memory.
    w.submit(appwrapper("bronze-quota-job-08", {"quota_context": "bronze"}, cpu="300m",
                        memory="300Mi"))
    w.settle()
    assert w.is_running("bronze-quota-job-08")


def two_running(bronze_cpu: str, bronze_memory: str) -> World:
    """Steps 01-02 of deployment-02 and -03: a bronze wrapper and an unlabelled one run."""
    w = world()
    w.submit(appwrapper("bronze-quota-job-01", ctx("bronze", "gold"), cpu=bronze_cpu,
                        memory=bronze_memory))
    w.submit(appwrapper("no-quota-deployment-02", cpu="300m", memory="32Mi"))
    w.settle()
    assert w.is_running("bronze-quota-job-01") and w.is_running("no-quota-deployment-02")
    return w


def test_deployment_02_quota_steps() -> None:
    """After a restart the usage is rebuilt from the admitted wrappers alone."""
    w = two_running("100m", "30Mi")
    # 03: restart: a fresh world that only knows what the API says is admitted.
    restarted = world()
    restarted.running = dict(w.running)
    restarted.state = w.state
    restarted.submit(appwrapper("gold-quota-job-04", ctx("gold", "gold"), cpu="300m",
                                memory="300Mi"))
    last = restarted.settle()
    assert last[("test", "gold-quota-job-04")].decision == "dispatch"
    assert restarted.is_running("bronze-quota-job-01")
    assert restarted.is_running("no-quota-deployment-02")


def test_deployment_03_quota_steps() -> None:
    """A tree added later, without a default leaf: wrappers admitted before do not count
    in it, and a wrapper labelled only for it gets the other trees' default leaves."""
    w = two_running("300m", "300Mi")
    actinides = [
        subtree("actinides-root", "quota_actinides",
                [("actinides-root", {"cpu": "1075m", "memory": "1045Mi"}, False)]),
        subtree("actinides-children", "quota_actinides", [
            ("plutonium", {"cpu": "1075m", "memory": "1045Mi"}, False),
            ("lawrencium", {"cpu": "1075m", "memory": "1045Mi"}, True)],
            parent="actinides-root"),
    ]
    w.set_quota(mcad_trees() + actinides)  # 03
    w.submit(appwrapper("gold-quota-job-04", {"quota_actinides": "lawrencium"}, cpu="300m",
                        memory="30Mi"))  # 04
    last = w.settle()
    four = last[("test", "gold-quota-job-04")]
    assert four.decision == "dispatch"
    assert {(q.tree, q.leaf) for q in four.quota} == {
        ("quota_actinides", "lawrencium"), ("quota_context", "default"),
        ("quota_service", "default")}
    assert w.ledger is not None
    assert w.ledger.node_usage("quota_actinides", "actinides-root") == {"cpu": 300,
                                                                          "memory": 30 * 2**20}
    w.complete("gold-quota-job-04")
    w.submit(appwrapper("plutonium-quota-job-05", {**ctx("gold", "gold"),
                                                   "quota_actinides": "plutonium"},
                        cpu="300m", memory="30Mi"))  # 05
    w.settle()
    assert w.is_running("plutonium-quota-job-05")
