"""Edges of the rebalancer's safety rules that the main tests leave open: an owner reference that is
not the controller, a namespace the listing did not return, a pod with no date, a planner that
proposes more moves than it was asked for, and a dry run that must forget nothing of the real ledger."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from test_operator_rebalancer import NOW, FakeKube, make, node, pod, spec

from rlsched.operator.rebalance_budget import KEEP_S
from rlsched.operator.rebalance_select import why_not
from rlsched.policy import rebalance as planner


def greedy_planner(*keys: str) -> Any:
    """A planner that ignores ``max_moves_per_cycle`` and proposes every one of ``keys`` (to node 2)."""

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        present = {c.key: c for c in candidates}
        return [
            planner.Move(key=k, from_node=present[k].node, to_node=2, reason="fragmentation", gain=500.0)
            for k in keys
            if k in present
        ]

    return SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )


async def test_an_owner_reference_that_is_not_the_controller_is_no_controller() -> None:
    # Owned (garbage collection) but not controlled: nothing would bring the pod back once evicted.
    p = pod("a", "n0", gpus=1)
    p["metadata"]["ownerReferences"][0]["controller"] = False
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [p])
    rb, _ = make(kube, greedy_planner("team/a"))
    report = await rb.cycle(spec(), None)
    assert kube.evictions == [] and report.skipped["no-controller"] == 1


async def test_a_namespace_the_listing_did_not_return_is_not_opted_in_by_the_selector() -> None:
    # "ghost" is not in the namespace list (created since, or the list cut short): its labels are
    # unknown, so the selector cannot opt it in.
    kube = FakeKube(
        [node("n0"), node("n1"), node("n2")],
        [pod("a", "n0", gpus=1, labels={}, ns="ghost")],
        namespaces=[{"metadata": {"name": "batch", "labels": {"rebalance": "yes"}}}],
    )
    rb, _ = make(kube, greedy_planner("ghost/a"))
    report = await rb.cycle(spec(namespaceSelector={"matchLabels": {"rebalance": "yes"}}), None)
    assert kube.evictions == [] and report.skipped["not-opted-in"] == 1


def test_a_pod_with_no_date_is_too_young() -> None:
    p = pod("a", "n0", gpus=1)
    del p["metadata"]["creationTimestamp"]
    del p["status"]["startTime"]
    assert why_not(p, "rl-scheduler", lambda _ns: False, 600, NOW, lambda _ns: True) == "too-young"
    p["status"]["startTime"] = "not a time"
    assert why_not(p, "rl-scheduler", lambda _ns: False, 600, NOW, lambda _ns: True) == "too-young"


async def test_a_planner_that_proposes_too_many_moves_is_held_to_the_cycles_budget() -> None:
    kube = FakeKube(
        [node("n0", 4), node("n1", 4), node("n2", 8)],
        [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1), pod("c", "n0", gpus=1)],
    )
    rb, _ = make(kube, greedy_planner("team/a", "team/b", "team/c"))
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 1, "maxMovesPerHour": 10}), None)
    assert [e[0] for e in kube.evictions] == ["team/a"]
    assert sum(1 for m in report.moves if m["result"] == "evicted") == 1


async def test_a_dry_run_forgets_nothing_of_the_real_ledger() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    rb, _ = make(kube, greedy_planner("team/a"))
    rb.ledger.add("team/ReplicaSet/old-rs", NOW - KEEP_S - 10.0, NOW - KEEP_S - 10.0)
    report = await rb.cycle(spec(dryRun=True), None)
    assert report.dry_run and [r.owner for r in rb.ledger.records] == ["team/ReplicaSet/old-rs"]
    assert rb.as_status(report)["recent"] == [{"at": round(NOW - KEEP_S - 10.0, 3), "owner": "team/ReplicaSet/old-rs"}]
