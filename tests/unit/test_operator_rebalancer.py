"""The rebalancer without an API server: its cycle over a fake cluster, the safety rules, the budget,
dry-run, PodDisruptionBudget refusals, and what each move leaves behind (event, counter, log line)."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from rlsched.extender.cache import RETRY_PER_RELEASE
from rlsched.operator.kube import KubeError
from rlsched.operator.rebalance_budget import MAX_RECENT, Ledger, allowance, owners_over_budget
from rlsched.operator.rebalance_spec import RebalanceSpec, parse_rebalance
from rlsched.operator.rebalancer import MAX_REPLANS, REFUSAL_COOLDOWN_S, RESULTS, Rebalancer
from rlsched.operator.settings import RebalancerSettings
from rlsched.policy import rebalance as planner

NOW = 1_800_000_000.0
PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, gpus: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"rlsched.io/gpu-model": "V100"}},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}},
    }


def pod(
    name: str,
    node_name: str,
    milli: int = 0,
    gpus: int = 0,
    cards: list[int] | None = None,
    ns: str = "team",
    labels: dict[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    owner_name: str | None = None,
    age: float = 3600.0,
    scheduler: str = "rl-scheduler",
    phase: str = "Running",
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if milli:
        annotations["rlsched.io/gpu-milli"] = str(milli)
    if cards is not None:
        annotations["rlsched.io/gpu-cards"] = ",".join(map(str, cards))
        annotations["rlsched.io/gpu-node"] = node_name
    req = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "labels": {"rlsched.io/rebalance": "true"} if labels is None else labels,
        "annotations": annotations,
        "creationTimestamp": iso(NOW - age),
    }
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner, "name": owner_name or f"{name}-rs", "uid": "o", "controller": True}
        ]
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler,
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"requests": req}}],
        },
        "status": {"phase": phase, "startTime": iso(NOW - age)},
    }


class FakeKube:
    """Lists from memory; evictions recorded (a real one removes the pod), PDB refusals by pod name."""

    def __init__(self, nodes: list[dict], pods: list[dict], namespaces: list[dict] | None = None):
        self.nodes, self.pods, self.namespaces = nodes, pods, namespaces or []
        self.pdb: set[str] = set()
        self.evictions: list[tuple[str, str, bool]] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.lists: list[str] = []

    async def list_all(self, kind: str, **_: Any) -> list[dict]:
        self.lists.append(kind)
        return list({"nodes": self.nodes, "pods": self.pods, "namespaces": self.namespaces}[kind])

    async def evict_pod(self, namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
        self.evictions.append((f"{namespace}/{name}", uid, dry_run))
        if name in self.pdb:
            raise KubeError(429, "TooManyRequests", PDB_MESSAGE)
        if not dry_run:
            gone = self.meta(uid)
            self.pods = [p for p in self.pods if not (isinstance(p, dict) and p.get("metadata") is gone is not None)]

    def meta(self, uid: str) -> Any:
        for p in self.pods:
            if isinstance(p, dict) and isinstance(p.get("metadata"), dict) and p["metadata"].get("uid") == uid:
                return p["metadata"]
        return None

    async def post_event(self, ref: dict, type_: str, reason: str, message: str) -> None:
        self.events.append((ref["name"], type_, reason, message))


def fake_planner(*keys: str) -> Any:
    """The real planner's types with a plan that proposes moving ``keys`` (in order) to node 2."""

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        present = {c.key: c for c in candidates}
        out = [
            planner.Move(key=k, from_node=present[k].node, to_node=2, reason="fragmentation", gain=500.0)
            for k in keys
            if k in present
        ]
        return out[: settings.max_moves_per_cycle]

    return SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )


class Clock:
    def __init__(self, t: float = NOW):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(
    kube: FakeKube,
    plan: Any = None,
    clock: Callable[[], float] | None = None,
    monotonic: Callable[[], float] | None = None,
) -> tuple[Rebalancer, list[dict]]:
    """A rebalancer on ``clock`` (wall) and ``monotonic`` (default: the same clock, so that moving the
    fake time moves both)."""
    lines: list[dict] = []
    clock = clock or Clock()

    async def write(batch: list[dict]) -> int:
        lines.extend(batch)
        return len(batch)

    rb = Rebalancer(
        RebalancerSettings(),
        "rl-scheduler",
        kube,
        write_log=write,
        planner=plan,
        policy_ref="sched/default",
        clock=clock,
        monotonic=monotonic or clock,
    )
    return rb, lines


def spec(**kw: Any) -> RebalanceSpec:
    base = {"enabled": True, "dryRun": False, "minPodAgeSeconds": 600}
    problems: list[str] = []
    s = parse_rebalance({**base, **kw}, problems)
    assert problems == []
    return s


def fragmented() -> FakeKube:
    """Two half-used cards on two nodes, a full node: moving one share consolidates the cards."""
    return FakeKube(
        [node("n0"), node("n1"), node("n2")],
        [
            pod("a", "n0", milli=500, cards=[0]),
            pod("b", "n1", milli=500, cards=[0]),
            pod("w", "n2", gpus=2, cards=[0, 1]),
        ],
    )


def counter(rb: Rebalancer, result: str) -> float:
    value = rb.metrics.registry.get_sample_value("rlsched_operator_rebalance_evictions_total", {"result": result})
    return value or 0.0


# -- the cycle with the policy's planner -------------------------------------------------------------


async def test_a_cycle_evicts_the_planners_move_and_records_it() -> None:
    kube = fragmented()
    rb, lines = make(kube)
    report = await rb.cycle(spec(), None)
    assert report.outcome == "planned" and report.candidates == 3
    assert [e[0] for e in kube.evictions] == ["team/a"] and kube.evictions[0][2] is False
    (move,) = report.moves
    assert move["from"] == "n0" and move["to"] == "n1" and move["result"] == "evicted"
    assert move["reason"] == "fragmentation" and move["gain"] > 0
    assert [(e[0], e[2]) for e in kube.events] == [("a", "Rebalanced")]
    assert "reason: fragmentation" in kube.events[0][3] and "intended: n1" in kube.events[0][3]
    assert counter(rb, "evicted") == 1
    (line,) = lines
    assert line["type"] == "rebalance" and line["result"] == "evicted" and line["owner"] == "team/ReplicaSet/a-rs"
    assert line["pod"] == {"uid": "uid-a", "namespace": "team", "name": "a"} and line["dryRun"] is False
    status = rb.as_status(report)
    assert status["totals"] == {**dict.fromkeys(RESULTS, 0), "evicted": 1}
    assert status["recent"] == [{"at": NOW, "owner": "team/ReplicaSet/a-rs"}]
    assert status["skipped"]["not-opted-in"] == 0


async def test_dry_run_changes_nothing_and_reports_what_it_would_do() -> None:
    kube = fragmented()
    rb, lines = make(kube)
    report = await rb.cycle(spec(dryRun=True), None)
    assert kube.evictions == [("team/a", "uid-a", True)]  # sent with dryRun: [All]
    assert report.moves[0]["result"] == "dry_run" and report.dry_run
    assert [(e[0], e[2]) for e in kube.events] == [("a", "RebalanceDryRun")]
    assert counter(rb, "dry_run") == 1 and counter(rb, "evicted") == 0
    assert rb.ledger.records == [] and rb.as_status(report)["recent"] == []
    assert lines[0]["dryRun"] is True and lines[0]["result"] == "dry_run"


async def test_a_pdb_refusal_is_counted_and_the_next_move_is_tried() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])
    kube.pdb.add("a")
    rb, _ = make(kube, fake_planner("team/a", "team/b"))
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 2}), None)
    assert [m["result"] for m in report.moves] == ["blocked_by_pdb", "evicted"]
    assert counter(rb, "blocked_by_pdb") == 1 and counter(rb, "evicted") == 1
    assert [(e[0], e[2]) for e in kube.events] == [("a", "RebalanceBlocked"), ("b", "Rebalanced")]
    assert [r.owner for r in rb.ledger.records] == ["team/ReplicaSet/b-rs"]  # a refusal spends no budget


async def test_a_throttling_429_is_not_a_pdb() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    rb, _ = make(kube, fake_planner("team/a"))

    async def throttled(*_: Any, **__: Any) -> None:
        raise KubeError(429, "TooManyRequests", "too many requests, please try again later")

    kube.evict_pod = throttled  # type: ignore[method-assign]
    report = await rb.cycle(spec(), None)
    assert report.moves[0]["result"] == "throttled" and counter(rb, "blocked_by_pdb") == 0


def four_shares() -> FakeKube:
    """Half cards on n0 and n1, 300 milli on n3, a full n2: the real planner's best move is a."""
    return FakeKube(
        [node("n0"), node("n1"), node("n2"), node("n3")],
        [
            pod("a", "n0", milli=500, cards=[0]),
            pod("b", "n1", milli=500, cards=[0]),
            pod("c", "n3", milli=300, cards=[0]),
            pod("w", "n2", gpus=2, cards=[0, 1]),
        ],
    )


async def test_a_refused_best_move_does_not_block_the_next_best() -> None:
    """One move per cycle, and a PodDisruptionBudget on the pod the planner likes best: the planner is
    asked again without it in the same cycle, and later cycles leave it alone for the cooldown."""
    unblocked, _ = make(four_shares())
    assert [m["pod"] for m in (await unblocked.cycle(spec(), None)).moves] == ["team/a"]
    kube = four_shares()
    kube.pdb.add("a")
    clock = Clock()
    rb, _ = make(kube, clock=clock)
    s = spec(intervalSeconds=10)
    first = await rb.cycle(s, None)
    assert [(m["pod"], m["result"]) for m in first.moves] == [("team/a", "blocked_by_pdb"), ("team/b", "evicted")]
    assert first.planned == 2 and len(rb.ledger.records) == 1
    clock.t += 3700  # past the hour's budget and a's cooldown; its PodDisruptionBudget allows it now
    kube.pdb.clear()
    later = await rb.cycle(s, None)
    assert later.skipped["recently-refused"] == 0 and "team/a" in [m["pod"] for m in later.moves]


async def test_a_refused_pod_waits_out_its_cooldown() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])
    kube.pdb.update({"a", "b"})
    clock = Clock()
    rb, _ = make(kube, fake_planner("team/a", "team/b"), clock)
    s = spec(intervalSeconds=10)
    first = await rb.cycle(s, None)  # a refused, then b (the second plan), refused too
    assert [(m["pod"], m["result"]) for m in first.moves] == [
        ("team/a", "blocked_by_pdb"),
        ("team/b", "blocked_by_pdb"),
    ]
    clock.t += 60
    second = await rb.cycle(s, None)
    assert second.outcome == "no_candidates" and second.skipped["recently-refused"] == 2 and len(kube.evictions) == 2
    clock.t += REFUSAL_COOLDOWN_S
    kube.pdb.clear()
    third = await rb.cycle(s, None)
    assert [(m["pod"], m["result"]) for m in third.moves] == [("team/a", "evicted")]


async def test_replanning_is_bounded() -> None:
    pods = [pod(f"p{i}", "n0", gpus=1) for i in range(10)]
    kube = FakeKube([node("n0", 10), node("n1", 4), node("n2", 8)], pods)
    kube.pdb.update(f"p{i}" for i in range(10))
    rb, _ = make(kube, fake_planner(*(f"team/p{i}" for i in range(10))))
    report = await rb.cycle(spec(), None)
    assert len(kube.evictions) == 1 + MAX_REPLANS and report.planned == 1 + MAX_REPLANS
    assert all(m["result"] == "blocked_by_pdb" for m in report.moves) and report.outcome == "planned"


async def test_no_plan_again_when_the_last_one_took_nothing_out_of_the_pool() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])
    kube.pdb.add("a")
    calls: list[int] = []
    plan = fake_planner("team/a")
    inner = plan.plan_moves

    def counting(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        calls.append(len(candidates))
        return inner(state, candidates, typical, settings, scorer)

    plan.plan_moves = counting
    rb, _ = make(kube, plan)
    report = await rb.cycle(spec(), None)
    assert calls == [2, 1] and [m["result"] for m in report.moves] == ["blocked_by_pdb"]


async def test_a_throttling_429_ends_the_cycle() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])
    rb, _ = make(kube, fake_planner("team/a", "team/b"))
    calls: list[str] = []

    async def throttled(namespace: str, name: str, *_: Any, **__: Any) -> None:
        calls.append(name)
        raise KubeError(429, "TooManyRequests", "too many requests, please try again later")

    kube.evict_pod = throttled  # type: ignore[method-assign]
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 2}), None)
    assert calls == ["a"] and [m["result"] for m in report.moves] == ["throttled"]
    assert rb.refused == {}  # not the pod's fault: no cooldown


# -- the budget ------------------------------------------------------------------------------------


async def test_the_budget_holds_under_a_burst() -> None:
    pods = [pod(f"p{i}", f"n{i % 2}", gpus=1) for i in range(4)]
    kube = FakeKube([node("n0", 4), node("n1", 4), node("n2", 8)], pods)
    clock = Clock()
    rb, _ = make(kube, fake_planner(*(f"team/p{i}" for i in range(4))), clock)
    s = spec(intervalSeconds=10, budget={"maxMovesPerCycle": 3, "maxMovesPerHour": 2})
    evicted = 0
    for _ in range(20):  # 20 cycles in 200 s: at most 2 evictions in the hour
        report = await rb.cycle(s, None)
        evicted += sum(1 for m in report.moves if m["result"] == "evicted")
        clock.t += 10
    assert evicted == 2 and report.outcome == "budget_exhausted"
    clock.t = NOW + 3601  # the hour has passed
    report = await rb.cycle(s, None)
    assert sum(1 for m in report.moves if m["result"] == "evicted") == 2


async def test_one_move_per_cycle_and_per_owner() -> None:
    pods = [pod(f"p{i}", "n0", gpus=1, owner_name="web-rs") for i in range(2)] + [pod("q", "n1", gpus=1)]
    kube = FakeKube([node("n0", 4), node("n1", 4), node("n2", 8)], pods)
    clock = Clock()
    rb, _ = make(kube, fake_planner("team/p0", "team/p1", "team/q"), clock)
    s = spec(budget={"maxMovesPerCycle": 1, "maxMovesPerOwner": 1})
    first = await rb.cycle(s, None)
    assert [m["pod"] for m in first.moves] == ["team/p0"]
    clock.t += 400
    second = await rb.cycle(s, None)  # p1 shares p0's controller: over its budget, not a candidate
    assert [m["pod"] for m in second.moves] == ["team/q"] and second.skipped["owner-budget"] == 1


async def test_a_controller_is_moved_once_per_cycle_whatever_the_plan() -> None:
    """The planner does not know controllers: four pods of one ReplicaSet in one plan, one evicted."""
    kube = FakeKube(
        [node(f"n{i}") for i in range(5)],
        [pod(x, f"n{i}", milli=500, cards=[0], owner_name="web-rs") for i, x in enumerate("abcd")]
        + [pod("w", "n4", gpus=2, cards=[0, 1])],
    )
    rb, _ = make(kube)
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 4, "maxMovesPerOwner": 1}), None)
    assert sum(1 for e in kube.evictions if not e[2]) == 1
    assert [r.owner for r in rb.ledger.records] == ["team/ReplicaSet/web-rs"]
    assert report.skipped["owner-budget"] >= 1


async def test_a_dry_run_keeps_to_the_budgets_it_previews() -> None:
    pods = [pod(f"p{i}", f"n{i % 2}", gpus=1) for i in range(4)]
    kube = FakeKube([node("n0", 4), node("n1", 4), node("n2", 8)], pods)
    clock = Clock()
    rb, _ = make(kube, fake_planner(*(f"team/p{i}" for i in range(4))), clock)
    s = spec(dryRun=True, intervalSeconds=10, budget={"maxMovesPerCycle": 3, "maxMovesPerHour": 2})
    for _ in range(20):
        report = await rb.cycle(s, None)
        clock.t += 10
    assert len(kube.evictions) == 2 and all(e[2] for e in kube.evictions)  # dry runs, and only two
    assert len(kube.events) == 2 and report.outcome == "budget_exhausted" and "dry-run" in report.message
    assert rb.ledger.records == [] and rb.as_status(report)["recent"] == []  # the real budget is untouched


def test_a_full_ledger_spends_the_budget_instead_of_forgetting() -> None:
    ledger = Ledger()
    ledger.add("team/ReplicaSet/web", NOW)
    for i in range(MAX_RECENT - 1):
        ledger.add(f"team/ReplicaSet/other-{i}", NOW + 1 + i)
    later = NOW + 2 * 3600
    ledger.prune(later)
    assert owners_over_budget(ledger, ["team/ReplicaSet/web"], later, 1, 86400) == {"team/ReplicaSet/web"}
    budget = allowance(ledger, later, 5, 100, 86400)
    assert budget.left == 0 and budget.room == 0
    after = NOW + 86400 + MAX_RECENT + 2  # every record outside both windows: kept, but none counts
    ledger.prune(after)
    assert len(ledger.records) == MAX_RECENT and allowance(ledger, after, 5, 100, 86400).left == 5
    ledger.add("team/ReplicaSet/next", after)  # the oldest makes room
    assert len(ledger.records) == MAX_RECENT and "team/ReplicaSet/web" not in {r.owner for r in ledger.records}


async def test_the_budget_survives_a_restart_through_the_status() -> None:
    pods = [pod(f"p{i}", "n0", gpus=1) for i in range(3)]
    kube = FakeKube([node("n0", 4), node("n1", 4), node("n2", 8)], pods)
    rb, _ = make(kube, fake_planner("team/p0"))
    s = spec(budget={"maxMovesPerHour": 1})
    status = rb.as_status(await rb.cycle(s, None))
    assert len(kube.evictions) == 1
    restarted, _ = make(kube, fake_planner("team/p1", "team/p2"), Clock(NOW + 60))
    report = await restarted.cycle(s, status)
    assert report.outcome == "budget_exhausted" and len(kube.evictions) == 1


async def test_each_eviction_is_written_to_the_status_before_it_is_made() -> None:
    """An operator killed after an eviction but before its cycle's status patch (OOM, SIGKILL, a failed
    patch) still has it counted after the restart."""
    pods = [pod(f"p{i}", "n0", gpus=1) for i in range(3)]
    kube = FakeKube([node("n0", 4), node("n1", 4), node("n2", 8)], pods)
    written: list[tuple[int, list[dict]]] = []

    async def persist(recent: list[dict]) -> None:
        written.append((len(kube.evictions), recent))

    async def killed(*_: Any) -> None:  # the operator is stopped while it reports the eviction
        raise asyncio.CancelledError

    kube.post_event = killed  # type: ignore[method-assign]
    rb, _ = make(kube, fake_planner("team/p0", "team/p1"))
    rb.persist = persist
    s = spec(budget={"maxMovesPerHour": 1})
    with pytest.raises(asyncio.CancelledError):
        await rb.cycle(s, None)
    assert len(kube.evictions) == 1
    assert written == [(0, [{"at": NOW, "owner": "team/ReplicaSet/p0-rs"}])]  # before the eviction
    restarted, _ = make(kube, fake_planner("team/p1", "team/p2"), Clock(NOW + 60))
    report = await restarted.cycle(s, {"recent": written[-1][1]})
    assert report.outcome == "budget_exhausted" and len(kube.evictions) == 1


async def test_no_eviction_when_the_status_cannot_be_written_first() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])

    async def persist(recent: list[dict]) -> None:
        raise KubeError(403, "Forbidden", "cannot patch schedulingpolicies/status")

    rb, _ = make(kube, fake_planner("team/a", "team/b"))
    rb.persist = persist
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 2}), None)
    assert kube.evictions == [] and rb.ledger.records == [] and rb.refused == {}
    assert [(m["pod"], m["result"]) for m in report.moves] == [("team/a", "error")]


async def test_a_refused_eviction_takes_back_its_record() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    kube.pdb.add("a")
    written: list[list[dict]] = []

    async def persist(recent: list[dict]) -> None:
        written.append(recent)

    rb, _ = make(kube, fake_planner("team/a"))
    rb.persist = persist
    report = await rb.cycle(spec(), None)
    assert [m["result"] for m in report.moves] == ["blocked_by_pdb"] and len(written) == 1
    assert rb.ledger.records == [] and rb.as_status(report)["recent"] == []


async def test_the_hour_budget_zero_moves_nothing() -> None:
    kube = fragmented()
    rb, _ = make(kube)
    report = await rb.cycle(spec(budget={"maxMovesPerHour": 0}), None)
    assert report.outcome == "budget_exhausted" and kube.evictions == [] and kube.lists == []


class LostAnswerKube(FakeKube):
    """The API server carries the eviction out, but its answer never arrives (kube._call: status 0)."""

    def __init__(self, *args: Any, status: int = 0, **kw: Any):
        super().__init__(*args, **kw)
        self.status = status

    async def evict_pod(self, namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
        await super().evict_pod(namespace, name, uid, dry_run)
        raise KubeError(self.status, "ReadTimeoutError" if self.status == 0 else "InternalError", "read timed out")


def same_owner_pods() -> list[dict[str, Any]]:
    return [pod(x, "n0" if i % 2 else "n1", gpus=1, owner_name="same-rs") for i, x in enumerate("abcdef")]


@pytest.mark.parametrize(
    "budget",
    [
        {"maxMovesPerCycle": 1, "maxMovesPerHour": 1, "maxMovesPerOwner": 100},  # the hourly budget binds
        {"maxMovesPerCycle": 1, "maxMovesPerHour": 100, "maxMovesPerOwner": 1},  # the per-owner budget binds
    ],
)
async def test_an_eviction_whose_answer_is_lost_spends_the_budget(
    budget: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    """A timeout may hide an eviction the API server carried out: it is ``unknown``, and charged to the
    budgets like an eviction — not retried on the next pod every cycle."""
    kube = LostAnswerKube([node("n0"), node("n1"), node("n2")], same_owner_pods())
    clock = Clock()
    rb, lines = make(kube, fake_planner(*(f"team/{x}" for x in "abcdef")), clock)
    s = spec(intervalSeconds=10, budget=budget)
    status = None
    with caplog.at_level("WARNING", logger="rlsched.operator.rebalancer"):
        for _ in range(4):
            report = await rb.cycle(s, status)
            status = rb.as_status(report)
            clock.t += 60
    assert [e[0] for e in kube.evictions] == ["team/a"]
    assert status is not None and status["totals"] == {**dict.fromkeys(RESULTS, 0), "unknown": 1}
    assert status["recent"] == [{"at": NOW, "owner": "team/ReplicaSet/same-rs"}]
    assert counter(rb, "unknown") == 1 and counter(rb, "evicted") == 0 and counter(rb, "error") == 0
    assert [(e[0], e[1], e[2]) for e in kube.events] == [("a", "Warning", "RebalanceUnknown")]
    assert "may have been evicted" in kube.events[0][3]
    (line,) = lines
    assert line["result"] == "unknown" and line["owner"] == "team/ReplicaSet/same-rs"
    assert sum("answer was lost" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("status", "dry_run", "result"),
    [
        (0, False, "unknown"),
        (500, False, "unknown"),
        (503, False, "unknown"),
        (400, False, "error"),  # refused: nothing happened
        (0, True, "error"),  # a dry run changes nothing, answered or not
    ],
)
async def test_which_failures_may_have_evicted(status: int, dry_run: bool, result: str) -> None:
    kube = LostAnswerKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)], status=status)
    rb, _ = make(kube, fake_planner("team/a"))
    report = await rb.cycle(spec(dryRun=dry_run), None)
    assert [m["result"] for m in report.moves] == [result]
    assert len(rb.ledger.records) == (1 if result == "unknown" else 0)


# -- opting in -------------------------------------------------------------------------------------


async def test_pods_that_did_not_opt_in_are_never_candidates() -> None:
    kube = FakeKube(
        [node("n0"), node("n1"), node("n2")],
        [pod("a", "n0", gpus=1, labels={}), pod("b", "n1", gpus=1, labels={"rlsched.io/rebalance": "false"})],
    )
    rb, _ = make(kube, fake_planner("team/a", "team/b"))
    report = await rb.cycle(spec(), None)
    assert report.outcome == "no_candidates" and kube.evictions == []
    assert report.skipped == {"not-opted-in": 1, "opted-out": 1}


async def test_a_namespace_selector_opts_a_namespace_in_but_not_an_opted_out_pod() -> None:
    kube = FakeKube(
        [node("n0"), node("n1"), node("n2")],
        [
            pod("a", "n0", gpus=1, labels={}, ns="batch"),
            pod("b", "n1", gpus=1, labels={"rlsched.io/rebalance": "false"}, ns="batch"),
            pod("c", "n1", gpus=1, labels={}, ns="web"),
        ],
        namespaces=[
            {"metadata": {"name": "batch", "labels": {"rebalance": "yes"}}},
            {"metadata": {"name": "web", "labels": {}}},
        ],
    )
    rb, _ = make(kube, fake_planner("batch/a", "batch/b", "web/c"))
    report = await rb.cycle(spec(namespaceSelector={"matchLabels": {"rebalance": "yes"}}), None)
    assert [e[0] for e in kube.evictions] == ["batch/a"] and report.candidates == 1
    assert "namespaces" in kube.lists


@pytest.mark.parametrize(
    ("variant", "rule"),
    [
        ({"scheduler": "default-scheduler"}, "other-scheduler"),
        ({"age": 60.0}, "too-young"),
        ({"owner": None}, "no-controller"),
        ({"owner": "DaemonSet"}, "daemonset"),
        ({"phase": "Pending"}, "not-running"),
    ],
)
async def test_the_safety_rules(variant: dict, rule: str) -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1, **variant)])
    rb, _ = make(kube, fake_planner("team/a"))
    report = await rb.cycle(spec(), None)
    assert kube.evictions == [] and report.skipped[rule] == 1


async def test_mirror_and_terminating_pods_are_never_moved() -> None:
    mirror = pod("m", "n0", gpus=1)
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "x"
    leaving = pod("t", "n1", gpus=1)
    leaving["metadata"]["deletionTimestamp"] = iso(NOW)
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [mirror, leaving])
    rb, _ = make(kube, fake_planner("team/m", "team/t"))
    report = await rb.cycle(spec(), None)
    assert kube.evictions == [] and report.skipped["mirror"] == 1 and report.skipped["not-running"] == 1


# -- hostile input and failures -------------------------------------------------------------------


async def test_unreadable_objects_are_skipped_and_the_cycle_goes_on() -> None:
    bad = pod("bad", "n0", gpus=1)
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "not-a-quantity"
    junk: Any = ["not", "a", "pod"]
    kube = fragmented()
    kube.pods = [*kube.pods, bad, junk, {"metadata": None}, {"metadata": ["x"]}, {"metadata": {"uid": 5}}, None]
    kube.nodes = [*kube.nodes, {"metadata": {"name": "weird"}, "status": {"allocatable": {"cpu": "-1"}}}]
    rb, _ = make(kube)
    report = await rb.cycle(spec(), None)
    assert report.outcome == "planned" and [e[0] for e in kube.evictions] == ["team/a"]


async def test_a_running_pod_beyond_its_nodes_cpu_is_counted_and_the_planner_copes() -> None:
    """kube-scheduler counts a running pod whatever it asked; so does the state (its cpu goes below 0),
    and the planner's trial moves put every pod back as it was."""
    huge = pod("huge", "n0", gpus=1)
    huge["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1e999999"
    kube = fragmented()
    kube.pods = [*kube.pods, huge]
    rb, _ = make(kube)
    report = await rb.cycle(spec(), None)
    assert report.outcome in ("planned", "no_moves")
    entry = next(e for e in rb.cache.pods.values() if e.key.endswith("/huge"))
    state = rb.cache.state
    assert entry.placement is not None and state is not None and int(state.cpu_free[state.index["n0"]]) < 0


async def test_a_pod_left_uncounted_is_counted_by_a_later_cycle_once_its_node_has_room() -> None:
    """A release tries only the first RETRY_PER_RELEASE uncounted pods of its node; the extender sweeps
    the rest every few seconds, the rebalancer's own cache at every cycle. Without its sweep, the
    one-card pod x stayed uncounted for good and its card read as free to the planner."""
    pods = [pod("p", "g", gpus=1, cards=[0]), pod("q", "g", gpus=1, cards=[1])]
    pods += [pod(f"w{i}", "g", gpus=2) for i in range(RETRY_PER_RELEASE + 6)]  # never fit: two cards each
    kube = FakeKube([node("g"), node("h"), node("k")], [*pods, pod("x", "g", gpus=1)])
    rb, _ = make(kube)
    await rb.cycle(spec(), None)
    assert rb.cache.pods["uid-x"].placement is None
    kube.pods = [p for p in kube.pods if p["metadata"]["name"] != "p"]  # p leaves: card 0 is free
    rb.clock.t += 3600
    await rb.cycle(spec(), None)
    state = rb.cache.state
    assert state is not None and rb.cache.pods["uid-x"].placement is not None
    assert state.card_free[state.index["g"]].tolist() == [0, 0]


async def test_a_move_the_planner_should_not_have_made_is_refused() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        return [
            planner.Move("team/ghost", 0, 1, "fragmentation", 1.0),
            planner.Move("team/a", 0, 0, "fragmentation", 1.0),  # to its own node
            planner.Move("team/a", 0, 99, "fragmentation", 1.0),  # no such node
        ]

    plan = SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )
    rb, _ = make(kube, plan)
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 5}), None)
    assert kube.evictions == [] and [m["result"] for m in report.moves] == ["invalid_move"] * 3


async def test_a_failing_planner_or_api_ends_the_cycle_with_an_error() -> None:
    kube = fragmented()

    def broken(*_: Any, **__: Any) -> list:
        raise ValueError("boom")

    rb, _ = make(
        kube,
        SimpleNamespace(Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=broken),
    )
    report = await rb.cycle(spec(), None)
    assert report.outcome == "error" and "boom" in report.message and kube.evictions == []

    async def down(*_: Any, **__: Any) -> list:
        raise KubeError(0, "ConnectionError", "refused")

    kube.list_all = down  # type: ignore[method-assign]
    report = await rb.cycle(spec(), None)
    assert report.outcome == "error" and "cannot read the cluster" in report.message


async def test_forbidden_evictions_say_what_to_grant() -> None:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])

    async def forbidden(*_: Any, **__: Any) -> None:
        raise KubeError(403, "Forbidden", 'pods "a" is forbidden: cannot create resource "pods/eviction"')

    kube.evict_pod = forbidden  # type: ignore[method-assign]
    rb, _ = make(kube, fake_planner("team/a"))
    report = await rb.cycle(spec(), None)
    assert report.moves[0]["result"] == "forbidden" and kube.events[0][2] == "RebalanceFailed"


async def test_the_planner_asks_the_served_fallback_where_a_pod_goes() -> None:
    got: list[Any] = []

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        got.append(scorer)
        return []

    plan = SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )
    rb, _ = make(fragmented(), plan)
    await rb.cycle(spec(), None, "least-allocated")
    await rb.cycle(spec(), None, None)
    assert type(got[0]).__name__ == "LeastAllocatedScorer" and got[1] is None


@pytest.mark.parametrize(
    "labels, expected",
    [
        ({"rlsched.io/latency-sensitive": "true"}, True),
        ({"koordinator.sh/qosClass": "LSR"}, True),
        ({"koordinator.sh/qosClass": "LSE"}, True),
        ({"koordinator.sh/qosClass": "BE"}, False),
        ({"rlsched.io/latency-sensitive": "false", "koordinator.sh/qosClass": "LS"}, False),  # the label decides
        ({"koordinator.sh/qosClass": ["LS"]}, False),  # malformed: not latency-sensitive, never unreadable
        ({}, False),  # Guaranteed by Kubernetes (requests only here, but the planner never counts that)
    ],
)
async def test_latency_sensitive_is_read_as_the_extender_reads_it(labels: dict, expected: bool) -> None:
    seen: list[Any] = []

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        seen.extend(candidates)
        return []

    plan = SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )
    kube = FakeKube(
        [node("n0"), node("n1")], [pod("a", "n0", gpus=1, labels={"rlsched.io/rebalance": "true", **labels})]
    )
    rb, _ = make(kube, plan)
    await rb.cycle(spec(), None)
    assert [c.latency_sensitive for c in seen] == [expected]


def test_due_follows_the_interval() -> None:
    clock = Clock()
    rb, _ = make(FakeKube([], []), clock=clock)
    s = spec(intervalSeconds=60)
    assert rb.due(s)
    rb.skipped()
    clock.t += 59
    assert not rb.due(s)
    clock.t += 1
    assert rb.due(s)


async def test_node_load_from_prometheus_reaches_the_planner() -> None:
    """With ``rebalancer.prometheus.url`` the extender's poller fills the state's load once per cycle
    (the planner's hot-node term reads it); without it the load stays NaN."""
    load = {"n0": 0.99, "n1": 0.1}
    queries: list[str] = []
    seen: list[Any] = []

    async def query(promql: str) -> dict:
        queries.append(promql)
        result = [{"metric": {"node": n}, "value": [NOW, str(v)]} for n, v in load.items()]
        return {"status": "success", "data": {"resultType": "vector", "result": result if "cpu" in promql else []}}

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        seen.append(state.load.copy())
        return []

    plan = SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    rb = Rebalancer(RebalancerSettings(), "rl-scheduler", kube, planner=plan, clock=Clock(), load_query=query)
    report = await rb.cycle(spec(), None)
    # one round: cpu, memory, network, disk, then each pod's CPU use (podCpuQuery)
    assert report.outcome == "no_moves" and len(queries) == 5 and "container_cpu_usage_seconds_total" in queries[4]
    (cpu_column,) = [list(seen[0][:, 0])]
    assert cpu_column[:2] == [0.99, 0.1] and math.isnan(cpu_column[2])  # n2 has no series: unknown
    await rb.close()
    rb2, _ = make(kube, plan)
    await rb2.cycle(spec(), None)
    assert all(math.isnan(v) for v in seen[1].ravel())


async def test_each_pods_measured_cpu_use_reaches_the_planner(caplog: pytest.LogCaptureFixture) -> None:
    """podCpuQuery's answer becomes Candidate.cpu_usage_milli (namespace/name → millicores); a pod
    without a series gets None (the planner estimates it); a failed query is logged once and counted."""
    seen: list[dict[str, Any]] = []
    answer: dict[str, Any] = {"fail": False}

    async def query(promql: str) -> dict:
        if "container_cpu_usage_seconds_total" not in promql:
            return {"status": "success", "data": {"resultType": "vector", "result": []}}
        if answer["fail"]:
            raise RuntimeError("connection refused")
        result = [
            {"metric": {"namespace": "team", "pod": "a"}, "value": [NOW, "2.5"]},
            {"metric": {"namespace": "team", "pod": "gone"}, "value": [NOW, "1"]},
            {"metric": {"pod": "no-namespace"}, "value": [NOW, "1"]},
            {"metric": {"namespace": "team", "pod": "b"}, "value": [NOW, "NaN"]},
        ]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        seen.append({c.key: c.cpu_usage_milli for c in candidates})
        return []

    plan = SimpleNamespace(
        Candidate=planner.Candidate, RebalanceSettings=planner.RebalanceSettings, plan_moves=plan_moves
    )
    kube = FakeKube([node("n0"), node("n1")], [pod("a", "n0", gpus=1), pod("b", "n0", gpus=1)])
    rb = Rebalancer(RebalancerSettings(), "rl-scheduler", kube, planner=plan, clock=Clock(), load_query=query)
    await rb.cycle(spec(), None)
    assert seen[-1] == {"team/a": 2500.0, "team/b": None}
    answer["fail"] = True
    with caplog.at_level("WARNING", logger="rlsched.operator.rebalancer"):
        await rb.cycle(spec(), None)
        await rb.cycle(spec(), None)
    assert seen[-1] == {"team/a": None, "team/b": None}
    assert sum("pod CPU use unknown" in r.getMessage() for r in caplog.records) == 1
    sample = rb.metrics.registry.get_sample_value
    assert sample("rlsched_operator_rebalance_pod_usage_queries_total", {"result": "error"}) == 2.0
    assert sample("rlsched_operator_rebalance_pod_usage_queries_total", {"result": "ok"}) == 1.0
    await rb.close()


# -- when an eviction happens, and what the status says about others' -----------------------------


def slow_planner(clock: Clock, keys: tuple[str, ...], seconds: float) -> Any:
    """:func:`fake_planner` that takes ``seconds`` of the clock to plan (a large cluster, replans)."""
    plan = fake_planner(*keys)
    inner = plan.plan_moves

    def plan_moves(state, candidates, typical, settings, scorer=None):  # noqa: ANN001, ANN202
        clock.t += seconds
        return inner(state, candidates, typical, settings, scorer)

    plan.plan_moves = plan_moves
    return plan


async def test_an_eviction_is_dated_when_it_is_sent_not_when_its_cycle_began() -> None:
    """A cycle that plans for 5 minutes: its eviction (and its refusal's cooldown) are dated when they
    happen, so the next cycle an hour after the first began is still inside the eviction's hour."""
    clock = Clock()
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])
    kube.pdb.add("a")
    rb, _ = make(kube, slow_planner(clock, ("team/a", "team/b"), 300.0), clock)
    s = spec(budget={"maxMovesPerCycle": 2, "maxMovesPerHour": 1})
    first = await rb.cycle(s, None)
    assert [m["result"] for m in first.moves] == ["blocked_by_pdb", "evicted"]
    assert rb.ledger.dump() == [{"at": NOW + 600, "owner": "team/ReplicaSet/b-rs"}]  # after two plans
    assert rb.refused == {"uid-a": NOW + 300 + REFUSAL_COOLDOWN_S}
    kube.pdb.clear()
    clock.t = NOW + 3600
    again = await rb.cycle(s, rb.as_status(first))
    assert again.outcome == "budget_exhausted" and sum(not e[2] for e in kube.evictions) == 2
    clock.t = NOW + 600 + 3600
    later = await rb.cycle(s, rb.as_status(again))
    assert [(m["pod"], m["result"]) for m in later.moves] == [("team/a", "evicted")]


async def test_evictions_another_replica_wrote_to_the_status_are_counted_and_kept() -> None:
    """Peering: this replica paused while another evicted and wrote ``recent``. This one counts those
    evictions against its budgets when it resumes, and writes them back with its own."""
    clock = Clock()
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1)])
    rb, _ = make(kube, fake_planner(), clock)
    hourly = spec(budget={"maxMovesPerHour": 1, "maxMovesPerOwner": 100})
    assert (await rb.cycle(hourly, {"recent": []})).outcome == "no_moves"  # this replica's first cycle
    rb._planner = fake_planner("team/a", "team/b")
    other = {"at": NOW + 600, "owner": "team/ReplicaSet/elsewhere"}
    clock.t = NOW + 1200
    report = await rb.cycle(hourly, {"recent": [other]})
    assert report.outcome == "budget_exhausted" and kube.evictions == []
    assert rb.as_status(report)["recent"] == [other]
    per_owner = spec(budget={"maxMovesPerHour": 100, "maxMovesPerOwner": 1})
    mine = {"at": NOW + 900, "owner": "team/ReplicaSet/a-rs"}
    report = await rb.cycle(per_owner, {"recent": [other, mine]})
    assert report.skipped["owner-budget"] == 1 and [e[0] for e in kube.evictions] == ["team/b"]
    recent = rb.as_status(report)["recent"]
    assert recent[:2] == [other, mine] and recent[2]["owner"] == "team/ReplicaSet/b-rs" and len(recent) == 3


async def test_a_pod_with_more_than_one_pdb_is_refused_not_lost() -> None:
    """The API server answers 500 for a pod that two PodDisruptionBudgets select, every time: an answer,
    so a refusal (cooldown, no budget spent, its own result), not a lost one charged every cycle."""
    clock = Clock()
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    message = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."

    async def evict(namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
        kube.evictions.append((f"{namespace}/{name}", uid, dry_run))
        raise KubeError(500, "InternalError", message)

    kube.evict_pod = evict  # type: ignore[method-assign]
    rb, _ = make(kube, fake_planner("team/a"), clock)
    s = spec(budget={"maxMovesPerHour": 6, "maxMovesPerOwner": 100})
    first = await rb.cycle(s, None)
    assert [m["result"] for m in first.moves] == ["multiple_pdbs"] and rb.ledger.records == []
    assert counter(rb, "multiple_pdbs") == 1 and counter(rb, "unknown") == 0
    assert [(e[1], e[2]) for e in kube.events] == [("Warning", "RebalanceBlocked")]
    assert "more than one PodDisruptionBudget" in kube.events[0][3]
    clock.t += 300
    second = await rb.cycle(s, rb.as_status(first))
    assert second.skipped["recently-refused"] == 1 and len(kube.evictions) == 1
    dry, _ = make(kube, fake_planner("team/a"), clock)
    assert [m["result"] for m in (await dry.cycle(spec(dryRun=True), None)).moves] == ["multiple_pdbs"]


async def test_a_pod_whose_eviction_answer_was_lost_is_not_asked_for_again_at_once() -> None:
    """``unknown``: perhaps evicted, perhaps not. Either way not the next cycle's first pick."""
    clock = Clock()
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])

    async def lost(namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
        kube.evictions.append((f"{namespace}/{name}", uid, dry_run))
        raise KubeError(0, "ReadTimeoutError", "read timed out")  # and the pod is still there

    kube.evict_pod = lost  # type: ignore[method-assign]
    rb, _ = make(kube, fake_planner("team/a"), clock)
    s = spec(budget={"maxMovesPerHour": 100, "maxMovesPerOwner": 100})
    assert [m["result"] for m in (await rb.cycle(s, None)).moves] == ["unknown"]
    clock.t += 300
    second = await rb.cycle(s, None)
    assert second.skipped["recently-refused"] == 1 and len(kube.evictions) == 1
    clock.t += REFUSAL_COOLDOWN_S
    assert [m["result"] for m in (await rb.cycle(s, None)).moves] == ["unknown"]


async def test_a_dry_run_refusal_does_not_hold_back_a_real_run_nor_the_reverse() -> None:
    """Dry-run state is separate: its refusals have a cooldown of their own."""
    clock = Clock()
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    refuse: set[bool] = {True}  # which kind of run is refused

    async def evict(namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
        kube.evictions.append((f"{namespace}/{name}", uid, dry_run))
        if dry_run in refuse:
            raise KubeError(429, "TooManyRequests", PDB_MESSAGE)

    kube.evict_pod = evict  # type: ignore[method-assign]
    rb, _ = make(kube, fake_planner("team/a"), clock)
    assert [m["result"] for m in (await rb.cycle(spec(dryRun=True), None)).moves] == ["blocked_by_pdb"]
    clock.t += 300
    real = await rb.cycle(spec(dryRun=False), None)
    assert real.skipped["recently-refused"] == 0 and [m["result"] for m in real.moves] == ["evicted"]
    assert rb.refused == {} and set(rb.dry_refused) == {"uid-a"}

    refuse.clear()
    refuse.add(False)
    other, _ = make(kube, fake_planner("team/a"), clock)
    assert [m["result"] for m in (await other.cycle(spec(), None)).moves] == ["blocked_by_pdb"]
    clock.t += 300
    preview = await other.cycle(spec(dryRun=True), None)
    assert preview.skipped["recently-refused"] == 0 and [m["result"] for m in preview.moves] == ["dry_run"]


async def test_pods_outside_the_watched_namespaces_are_never_candidates() -> None:
    """With ``scope.namespaces`` set the chart grants ``pods/eviction`` only there: a pod elsewhere
    would be refused (403) every cycle. Counted ``not-watched``; an empty scope watches everything."""
    kube = FakeKube(
        [node("n0"), node("n1"), node("n2")],
        [pod("a", "n0", gpus=1, ns="team"), pod("b", "n1", gpus=1, ns="elsewhere")],
    )
    rb = Rebalancer(
        RebalancerSettings(),
        "rl-scheduler",
        kube,
        planner=fake_planner("elsewhere/b", "team/a"),
        clock=Clock(),
        namespaces=("team",),
    )
    report = await rb.cycle(spec(budget={"maxMovesPerCycle": 2}), None)
    assert report.candidates == 1 and report.skipped["not-watched"] == 1
    assert [e[0] for e in kube.evictions] == ["team/a"]
    assert rb.as_status(report)["skipped"]["not-watched"] == 1
    everywhere, _ = make(FakeKube(kube.nodes, [pod("b", "n1", gpus=1, ns="elsewhere")]), fake_planner("elsewhere/b"))
    assert (await everywhere.cycle(spec(), None)).candidates == 1


async def test_the_runtime_gives_the_rebalancer_the_operators_scope() -> None:
    from rlsched.operator.runtime import start_runtime
    from rlsched.operator.settings import load_settings

    class Kube:
        async def patch_pod_annotations(self, *_: Any, **__: Any) -> None: ...
        async def post_event(self, *_: Any, **__: Any) -> None: ...
        async def patch_policy_status(self, *_: Any, **__: Any) -> None: ...

    settings = load_settings(None, {"scope.namespaces": ["team", "ml-*"], "decisionLog.path": ""})
    rt = start_runtime(settings, Kube(), lambda _uid: None, lambda: [])
    try:
        assert rt.rebalancer is not None
        assert [rt.rebalancer.watched(ns) for ns in ("team", "ml-a", "other")] == [True, True, False]
    finally:
        await rt.stop()
