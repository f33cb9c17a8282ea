"""The rebalancer's accounting across cycles and processes: the eviction ledger outlives a shorter owner
window (a dry-run preview included), a move skipped for its controller's budget is counted
``owner-budget`` and not blamed on the planner, and ``status.rebalance.totals`` survives kopf's merge
patch without keeping a previous process' counts."""

from __future__ import annotations

from typing import Any

import pytest
from test_operator_rebalancer import NOW, Clock, FakeKube, counter, fake_planner, fragmented, make, node, pod, spec

from rlsched.operator.rebalance_budget import MAX_RECENT
from rlsched.operator.rebalancer import RESULTS

OWNER = "team/ReplicaSet/web-rs"
DAY = 86400


def one_controller(*names: str, **kw: Any) -> FakeKube:
    """Pods of one ReplicaSet on n0, old enough to move; n2 is where the fake planner sends them."""
    return FakeKube([node("n0"), node("n1"), node("n2")], [pod(x, "n0", owner_name="web-rs", **kw) for x in names])


def real_evictions(kube: FakeKube) -> list[str]:
    return [key for key, _uid, dry_run in kube.evictions if not dry_run]


# -- the ledger outlives a shorter window ----------------------------------------------------------------


async def test_a_dry_run_with_a_shorter_owner_window_forgets_no_eviction() -> None:
    """A dry run previewing ``ownerWindowSeconds: 60`` pruned the real ledger with its own window, and the
    handler wrote the pruned list to ``status.rebalance.recent``: set back to a day, the same controller
    was evicted again two hours after its first eviction, against ``maxMovesPerOwner: 1``."""
    clock = Clock()
    kube = one_controller("a", "b", age=7200)
    rb, _ = make(kube, fake_planner("team/a", "team/b"), clock)
    real = spec(budget={"maxMovesPerOwner": 1, "ownerWindowSeconds": DAY})
    status = rb.as_status(await rb.cycle(real, None))
    first = status["recent"]
    assert first == [{"at": NOW, "owner": OWNER}] and real_evictions(kube) == ["team/a"]

    clock.t = NOW + 2 * 3600
    preview = spec(dryRun=True, budget={"maxMovesPerOwner": 1, "ownerWindowSeconds": 60})
    status = rb.as_status(await rb.cycle(preview, status))
    assert status["recent"] == first  # what the handler writes back: the real ledger, untouched

    clock.t += 600
    restarted, _ = make(kube, fake_planner("team/b"), clock)  # reads the budget from the status only
    for rebalancer in (rb, restarted):
        report = await rebalancer.cycle(real, status)
        assert report.outcome == "no_candidates" and report.skipped["owner-budget"] == 1
    assert real_evictions(kube) == ["team/a"]


async def test_a_shorter_owner_window_for_a_while_forgets_no_eviction() -> None:
    """Records were kept for the current window only: one real cycle run with ``ownerWindowSeconds: 60``
    (here moving nothing) forgot the eviction for good, so once the window was set back to a day the
    controller was evicted again inside it. They are kept for the longest window a spec may set."""
    clock = Clock()
    kube = one_controller("a", "b", age=7200)
    rb, _ = make(kube, fake_planner("team/a", "team/b"), clock)
    real = spec(budget={"maxMovesPerOwner": 1, "ownerWindowSeconds": DAY})
    status = rb.as_status(await rb.cycle(real, None))
    clock.t = NOW + 2 * 3600
    short = spec(budget={"maxMovesPerHour": 0, "maxMovesPerOwner": 1, "ownerWindowSeconds": 60})
    status = rb.as_status(await rb.cycle(short, status))
    assert status["recent"] == [{"at": NOW, "owner": OWNER}]
    clock.t += 600
    report = await rb.cycle(real, status)
    assert report.skipped["owner-budget"] == 1 and real_evictions(kube) == ["team/a"]


async def test_older_records_are_kept_but_do_not_fill_the_ledger() -> None:
    """A status full of evictions older than the current windows (kept now: a longer window may come
    back) must not spend the budget as a full ledger would: the cycle evicts, and its record takes the
    place of the oldest. The eviction part is a guard (those records were dropped before); keeping them
    is new."""
    kube = fragmented()
    rb, _ = make(kube)
    old = [{"at": NOW - 2 * DAY + i, "owner": f"team/ReplicaSet/old-{i}"} for i in range(MAX_RECENT)]
    report = await rb.cycle(spec(), {"recent": old})
    assert report.outcome == "planned" and real_evictions(kube) == ["team/a"]
    recent = rb.as_status(report)["recent"]
    assert len(recent) == MAX_RECENT and recent[0]["owner"] == "team/ReplicaSet/old-1"
    assert recent[-1] == {"at": NOW, "owner": "team/ReplicaSet/a-rs"}


# -- a controller's later moves in one plan are owner-budget ---------------------------------------------


async def test_a_later_move_of_a_controller_moved_in_the_cycle_is_owner_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three planned pods of one controller, ``maxMovesPerOwner: 1``: the second was counted
    ``owner-budget`` but the third ``invalid_move`` (counter, ``status.rebalance.moves``, totals, and a
    warning blaming the planner), although the planner had named a candidate."""
    kube = one_controller("a", "b", "c")
    rb, _ = make(kube, fake_planner("team/a", "team/b", "team/c"))
    with caplog.at_level("WARNING", logger="rlsched.operator.rebalancer"):
        report = await rb.cycle(spec(budget={"maxMovesPerCycle": 3, "maxMovesPerOwner": 1}), None)
    assert [(m["pod"], m["result"]) for m in report.moves] == [("team/a", "evicted")]
    status = rb.as_status(report)
    assert report.skipped["owner-budget"] == 2 and status["skipped"]["owner-budget"] == 2
    assert counter(rb, "invalid_move") == 0 and status["totals"].get("invalid_move", 0) == 0
    assert not [r for r in caplog.records if "invalid move" in r.getMessage()]


async def test_the_real_planners_moves_of_one_controller_are_owner_budget() -> None:
    """The same with the policy's planner: six half-GPU replicas of one ReplicaSet, three moves planned,
    one made; the other two are ``owner-budget``, not ``invalid_move``."""
    kube = FakeKube(
        [node(f"n{i}") for i in range(6)],
        [pod(f"p{i}", f"n{i}", milli=500, cards=[0], owner_name="web-rs") for i in range(6)],
    )
    rb, _ = make(kube)
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 3, "maxMovesPerOwner": 1}), None)
    assert report.planned >= 2 and len(real_evictions(kube)) == 1
    assert [m["result"] for m in report.moves] == ["evicted"]
    assert report.skipped["owner-budget"] == report.planned - 1 and counter(rb, "invalid_move") == 0


async def test_a_pod_the_plan_names_twice_is_still_an_invalid_move() -> None:
    """Guard: a pod already tried in this plan stays ``invalid_move`` when named again, even after its
    controller's budget ran out (only pods not tried yet are ``owner-budget``)."""
    kube = one_controller("a", "b")
    rb, _ = make(kube, fake_planner("team/a", "team/b", "team/a"))
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 3, "maxMovesPerOwner": 1}), None)
    assert [(m["pod"], m["result"]) for m in report.moves] == [("team/a", "evicted"), ("team/a", "invalid_move")]
    assert report.skipped["owner-budget"] == 1 and counter(rb, "invalid_move") == 1


# -- totals through a merge patch ------------------------------------------------------------------------


async def test_the_status_totals_replace_a_previous_processs_through_a_merge_patch() -> None:
    """kopf sends the status as a JSON merge patch (RFC 7386), which keeps every key the patch leaves
    out: totals that listed only this process' results left a previous process' counts beside them
    after a restart. Every result is written, zeros included, so the patch replaces each."""
    stored = {"evicted": 3, "blocked_by_pdb": 7, "unknown": 2}  # the previous process' totals
    kube = fragmented()
    rb, _ = make(kube)
    totals = rb.as_status(await rb.cycle(spec(), {"totals": stored, "recent": []}))["totals"]
    assert set(totals) == set(RESULTS)
    after = {**stored, **totals}  # RFC 7386 on an object of numbers: the patch's keys replace, the rest stay
    assert after == {**dict.fromkeys(RESULTS, 0), "evicted": 1} == {r: rb.totals[r] for r in RESULTS}
