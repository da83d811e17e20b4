"""Quota trees: reading QuotaSubtrees, resolving labels, usage, borrowing and its messages."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.quota import QuotaConsumer, QuotaForest, QuotaLedger

from .quota_world import subtree

GPU = "nvidia.com/gpu"


def gpu_tree(hard_a: bool = False, hard_dept: bool = False) -> QuotaForest:
    """gpu: root 16 GPUs > dept 12 (hard_dept) > team-a 8 (hard_a), team-b 4; team-c 4 under
    the root; default 0."""
    return QuotaForest.from_objects([
        subtree("root", "gpu", [("root", {GPU: 16}, False)]),
        subtree("depts", "gpu", [("dept", {GPU: 12}, hard_dept), ("team-c", {GPU: 4}, False),
                                 ("default", {GPU: 0}, False)], parent="root"),
        subtree("teams", "gpu", [("team-a", {GPU: 8}, hard_a), ("team-b", {GPU: 4}, False)],
                parent="dept"),
    ])


def dept_tree(root: int, dept: int, a: tuple[int, bool], b: tuple[int, bool]) -> QuotaForest:
    """gpu: root > dept (soft) > team-a, team-b: GPUs, and (quota, hardLimit) per team."""
    return QuotaForest.from_objects([
        subtree("root", "gpu", [("root", {GPU: root}, False)]),
        subtree("depts", "gpu", [("dept", {GPU: dept}, False)], parent="root"),
        subtree("teams", "gpu", [("team-a", {GPU: a[0]}, a[1]), ("team-b", {GPU: b[0]}, b[1])],
                parent="dept"),
    ])


def team(name: str) -> tuple[tuple[str, str], ...]:
    return (("gpu", name),)


def use(ledger: QuotaLedger, name: str, leaf: str, gpus: int, priority: float = 0,
        since: float = 0) -> None:
    ledger.add(QuotaConsumer(("ns", name), team(leaf), {GPU: gpus}, priority, since),
               force=True)


# --- reading QuotaSubtrees ---------------------------------------------------------------


def test_nodes_link_across_objects_by_parent_name() -> None:
    forest = gpu_tree()
    tree = forest.trees["gpu"]
    assert forest.problems == []
    assert tree.root.name == "root"
    assert tree.leaves == ["default", "team-a", "team-b", "team-c"]
    assert tree.nodes["team-a"].parent is tree.nodes["dept"]
    assert tree.resources == (GPU,)


@pytest.mark.parametrize(("obj", "problem"), [
    ({"apiVersion": "v1", "kind": "QuotaSubtree", "metadata": {"name": "x"}},
     "QuotaSubtree default/x: apiVersion must be quota.codeflare.dev/v1alpha1, got 'v1'"),
    ({"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
      "metadata": {"name": "x", "namespace": "kube-system"}, "spec": {"children": []}},
     "QuotaSubtree kube-system/x: metadata.labels.tree is missing"),
    ({**subtree("x", "t", [("a", {}, False)]), "spec": {"children": [{"quotas": {}}]}},
     "QuotaSubtree kube-system/x: spec.children[0].name: must be a non-empty string"),
    (subtree("x", "t", [("a", {"cpu": "lots"}, False)]),
     "QuotaSubtree kube-system/x: spec.children[0].quotas.requests.cpu"),
    ({**subtree("x", "t", []), "spec": {"children": [{"name": "a",
                                                        "quotas": {"hardLimit": "yes"}}]}},
     "QuotaSubtree kube-system/x: spec.children[0].quotas.hardLimit: must be true or false"),
    ({**subtree("x", "t", []), "spec": {"parent": 3, "children": [{"name": "a"}]}},
     "QuotaSubtree kube-system/x: spec.parent must be the name of a quota node, got 3"),
])
def test_a_bad_subtree_is_one_line_naming_object_and_field(obj: dict[str, Any],
                                                            problem: str) -> None:
    forest = QuotaForest.from_objects([obj])
    assert len(forest.problems) == 1
    assert forest.problems[0].startswith(problem), forest.problems


def test_a_node_whose_parent_is_missing_is_left_out_and_reported() -> None:
    forest = QuotaForest.from_objects([
        subtree("root", "t", [("root", {GPU: 8}, False)]),
        subtree("kids", "t", [("a", {GPU: 4}, False)], parent="nowhere"),
    ])
    assert forest.trees["t"].leaves == ["root"]
    assert forest.problems == ["kube-system/kids, spec.children[0]: parent nowhere is not a node "
                               "of tree t; node a and the nodes under it are ignored"]


def test_a_tree_with_two_roots_is_unusable_and_its_wrappers_wait_with_the_reason() -> None:
    forest = QuotaForest.from_objects([
        subtree("r1", "t", [("r1", {GPU: 8}, False)]),
        subtree("r2", "t", [("r2", {GPU: 8}, False)]),
    ])
    assert forest.problems == ["quota tree t cannot be used: it has 2 roots (r1, r2): exactly "
                               "one QuotaSubtree of a tree has no spec.parent"]
    check = QuotaLedger(forest).check((("t", "r1"),), {GPU: 1})
    assert not check.fits and check.unknown == (
        "quota tree t cannot be used: it has 2 roots (r1, r2): exactly one QuotaSubtree of a "
        "tree has no spec.parent",)


def test_a_cycle_is_reported() -> None:
    forest = QuotaForest.from_objects([
        subtree("root", "t", [("root", {}, False)]),
        subtree("a", "t", [("a", {}, False)], parent="b"),
        subtree("b", "t", [("b", {}, False)], parent="a"),
    ])
    assert sorted(forest.problems) == [
        "kube-system/a, spec.children[0]: node a does not reach the root of tree t: its "
        "parents form a cycle; ignored",
        "kube-system/b, spec.children[0]: node b does not reach the root of tree t: its "
        "parents form a cycle; ignored"]


def test_duplicate_node_names_keep_the_first_object() -> None:
    forest = QuotaForest.from_objects([
        subtree("root", "t", [("root", {GPU: 8}, False)]),
        subtree("a1", "t", [("a", {GPU: 4}, False)], parent="root"),
        subtree("a2", "t", [("a", {GPU: 2}, False)], parent="root"),
    ])
    assert forest.trees["t"].nodes["a"].quota == {GPU: 4}
    assert forest.problems == ["kube-system/a2, spec.children[0]: tree t already has a node a "
                               "(from kube-system/a1, spec.children[0]); this one is ignored"]


# --- labels ---------------------------------------------------------------------------------


def test_labels_name_a_leaf_per_tree_and_missing_ones_get_default() -> None:
    forest = gpu_tree()
    assert forest.resolve(team("team-a")).leaves == (("gpu", "team-a"),)
    assert forest.resolve(()).leaves == (("gpu", "default"),)
    assert forest.resolve((("app", "x"),)).leaves == (("gpu", "default"),)


def test_unknown_inner_and_missing_default_nodes_are_explained() -> None:
    forest = gpu_tree()
    assert forest.resolve(team("team-z")).problems == (
        "label gpu: team-z: quota tree gpu has no node team-z (its leaves: default, team-a, "
        "team-b, team-c)",)
    assert forest.resolve(team("dept")).problems == (
        "label gpu: dept is an inner node of quota tree gpu; a wrapper names a leaf: default, "
        "team-a, team-b, team-c",)
    no_default = QuotaForest.from_objects([subtree("root", "gpu", [("root", {GPU: 1}, False)])])
    assert no_default.resolve(()).problems == (
        "no label gpu: quota tree gpu has no leaf named default for wrappers without one; "
        "label the AppWrapper gpu: <one of root>",)


def test_a_quota_label_naming_no_tree_is_ignored_with_a_note() -> None:
    res = gpu_tree().resolve((("quota_gpu", "team-a"),))
    assert res.leaves == (("gpu", "default"),)
    assert res.notes == ("label quota_gpu names no quota tree (trees: gpu): ignored",)


# --- usage and borrowing ----------------------------------------------------------------------


def test_within_quota_a_wrapper_sits_at_its_leaf() -> None:
    ledger = QuotaLedger(gpu_tree())
    check = ledger.check(team("team-a"), {GPU: 8})
    assert check.fits and not check.borrows
    assert [p.node for p in check.placements] == ["team-a"]


def test_over_its_leaf_it_borrows_from_the_lowest_ancestor_with_room() -> None:
    ledger = QuotaLedger(gpu_tree())
    check = ledger.check(team("team-a"), {GPU: 10})
    assert check.fits and check.borrows
    assert [p.node for p in check.placements] == ["dept"]
    assert check.describe() == "quota team-a (tree gpu) borrowing from dept"
    # Past the department's 12 it must go to the root.
    assert [p.node for p in ledger.check(team("team-a"), {GPU: 14}).placements] == ["root"]


def test_hard_limit_forbids_borrowing_and_says_so() -> None:
    ledger = QuotaLedger(gpu_tree(hard_a=True))
    use(ledger, "x", "team-a", 4)
    check = ledger.check(team("team-a"), {GPU: 8})
    assert not check.fits
    assert check.message == ("team-a (tree gpu) would use 12 of its 8 nvidia.com/gpu and "
                             "cannot borrow: hardLimit")


def test_a_hard_inner_node_caps_what_is_under_it() -> None:
    ledger = QuotaLedger(gpu_tree(hard_dept=True))
    check = ledger.check(team("team-a"), {GPU: 14})
    assert check.message == ("team-a (tree gpu) would use 14 of its 8 nvidia.com/gpu and "
                             "cannot borrow: dept would use 14 of its 12 nvidia.com/gpu, and "
                             "team-a may not borrow beyond dept: hardLimit")


def test_borrowing_fails_when_the_root_is_full() -> None:
    ledger = QuotaLedger(gpu_tree())
    use(ledger, "c", "team-c", 4)
    use(ledger, "b", "team-b", 4)
    check = ledger.check(team("team-a"), {GPU: 10})
    assert check.message == ("team-a (tree gpu) would use 10 of its 8 nvidia.com/gpu and "
                             "cannot borrow: root would use 18 of its 16 nvidia.com/gpu")


def test_within_its_own_quota_but_the_root_is_lent_out() -> None:
    ledger = QuotaLedger(gpu_tree())
    use(ledger, "borrower", "team-c", 14)  # team-c's 4 and 10 borrowed from the root
    check = ledger.check(team("team-a"), {GPU: 4})
    assert check.message == ("team-a (tree gpu) fits its own quota, but root would use 18 of "
                             "its 16 nvidia.com/gpu")
    assert ledger.within_quota(team("team-a"), {GPU: 4})
    assert ledger.check(team("team-a"), {GPU: 4}, without=[("ns", "borrower")]).fits


def test_a_resource_the_wrapper_does_not_request_never_blocks_it() -> None:
    forest = QuotaForest.from_objects([subtree("root", "t", [("root", {GPU: 1, "cpu": "1"},
                                                               False)])])
    ledger = QuotaLedger(forest)
    ledger.add(QuotaConsumer(("ns", "over"), (("t", "root"),), {GPU: 3}, 0, 0), force=True)
    assert ledger.over_quota() == ["root (tree t) uses 3 of its 1 nvidia.com/gpu"]
    assert ledger.check((("t", "root"),), {"cpu": 500}).fits


def test_admitted_wrappers_are_placed_in_the_order_they_were_admitted() -> None:
    forest = gpu_tree()
    ledger = QuotaLedger.of(forest, [
        QuotaConsumer(("ns", "late-high"), team("team-b"), {GPU: 4}, 5, 20),
        QuotaConsumer(("ns", "early-low"), team("team-b"), {GPU: 4}, 0, 10),
        QuotaConsumer(("ns", "same-time-low"), team("team-b"), {GPU: 4}, 0, 20),
    ])
    assert [p.node for p in ledger.placements(("ns", "early-low"))] == ["team-b"]
    assert [p.node for p in ledger.placements(("ns", "late-high"))] == ["dept"]
    assert [p.node for p in ledger.placements(("ns", "same-time-low"))] == ["dept"]
    assert ledger.borrows(("ns", "late-high"))


def test_counting_again_in_admission_order_never_overfills_a_node() -> None:
    """team-a is hard at 1 GPU under a department of 1: a wrapper of team-a is admitted,
    then a higher-priority one of team-b borrows past the department from the root.
    Counted higher priority first, team-b's would take the department and team-a's would
    have nowhere to go; in admission order both fit, as they did when admitted."""
    ledger = QuotaLedger.of(dept_tree(2, 1, (1, True), (0, False)), [
        QuotaConsumer(("ns", "b"), team("team-b"), {GPU: 1}, 1, 20),
        QuotaConsumer(("ns", "a"), team("team-a"), {GPU: 1}, 0, 10),
    ])
    assert ledger.over_quota() == []
    assert [p.node for p in ledger.placements(("ns", "b"))] == ["root"]


def test_rebalance_moves_borrowers_back_once_their_leaf_has_room() -> None:
    ledger = QuotaLedger(gpu_tree())
    use(ledger, "first", "team-b", 4, since=1)
    use(ledger, "second", "team-b", 4, since=2)
    assert ledger.borrows(("ns", "second"))
    ledger.remove(("ns", "first"))
    assert ledger.borrows(("ns", "second"))  # removal alone moves nobody
    ledger.rebalance()
    assert not ledger.borrows(("ns", "second"))


def test_usage_rows_show_used_nominal_and_borrowed() -> None:
    ledger = QuotaLedger(gpu_tree())
    use(ledger, "a", "team-a", 10)
    rows = {u.name: u for u in ledger.usage()}
    assert (rows["team-a"].used, rows["team-a"].nominal, rows["team-a"].borrowed) == (
        {GPU: 10}, {GPU: 8}, {GPU: 10})
    assert (rows["dept"].used, rows["dept"].borrowed) == ({GPU: 10}, {})
    assert rows["root"].used == {GPU: 10}
    assert [u.name for u in ledger.usage()] == ["root", "default", "dept", "team-a", "team-b",
                                                "team-c"]


def test_counted_again_a_wrapper_takes_back_its_room_from_an_earlier_borrower() -> None:
    """team-b (hard, 6) was counted first and fills dept; `a` of team-a (0) was admitted
    after it, borrowing from the root past the full dept. Both carry the same admission
    time, and `a` sorts first: counted first, it would take a GPU of dept and team-b's
    wrapper, unable to rise past its hard leaf, would put dept at 7 of 6. The borrower
    gives the room back and rises again, as it was when admitted."""
    ledger = QuotaLedger.of(dept_tree(7, 6, (0, False), (6, True)), [
        QuotaConsumer(("ns", "b"), team("team-b"), {GPU: 6}, 0, 10),
        QuotaConsumer(("ns", "a"), team("team-a"), {GPU: 1}, 0, 10),
    ])
    assert ledger.over_quota() == []
    assert [p.node for p in ledger.placements(("ns", "a"))] == ["root"]
    assert [p.node for p in ledger.placements(("ns", "b"))] == ["team-b"]
    assert ledger.node_usage("gpu", "dept") == {GPU: 6}


def test_counted_again_the_wrappers_placed_again_make_way_for_each_other_too() -> None:
    """An elastic gang `e` of team-a (0 GPUs) was admitted first at 4 GPUs, grew to 8 and
    rose to the root as `b1` and `b2` filled team-b (hard, 8) and with it dept (8); then it
    shrank back to 4. Counted again in admission order, `e` sits in dept and `b2` has
    nowhere to go; counted before `e`, `b2` still leaves `b1` nowhere unless `b1` too goes
    before `e`. Then both fit at team-b, `e` and the later `f` borrow from the root, and no
    node is over its quota -- as it was when they were admitted."""
    ledger = QuotaLedger.of(dept_tree(16, 8, (0, False), (8, True)), [
        QuotaConsumer(("ns", "e"), team("team-a"), {GPU: 4}, 0, 1),
        QuotaConsumer(("ns", "b1"), team("team-b"), {GPU: 4}, 0, 5),
        QuotaConsumer(("ns", "b2"), team("team-b"), {GPU: 4}, 0, 7),
        QuotaConsumer(("ns", "f"), team("team-a"), {GPU: 4}, 1, 11),
    ])
    assert ledger.over_quota() == []
    assert {k: [p.node for p in ledger.placements(("ns", k))] for k in ("e", "b1", "b2", "f")} \
        == {"e": ["root"], "b1": ["team-b"], "b2": ["team-b"], "f": ["root"]}
    assert ledger.node_usage("gpu", "dept") == {GPU: 8}
