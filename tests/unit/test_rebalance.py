"""The rebalancer's planner (policy/rebalance.py): golden moves on tiny clusters, with the arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec, TieBreak, decide, make_scorer, typical_pods
from rlsched.policy.cluster import MUTABLE_ARRAYS
from rlsched.policy.fragmentation import Fragmentation
from rlsched.policy.rebalance import Candidate, Move, RebalanceSettings, plan_moves

# One typical pod: a 600-milli share of a card with 1 core. A card with ≥ 600 free can host it (no
# fragment); a node whose cards all have less than 600 free strands all its free GPU milli.
TYPICAL = typical_pods([PodSpec("t", 1000, 1024, 1, 600)])


def gpu_cluster() -> tuple[ClusterState, list[Candidate]]:
    """Two one-card nodes: p (300 milli) on A leaves 700 free, q (500 milli) on B leaves 500 free."""
    state = ClusterState([NodeSpec("A", 8000, 65536, 1, "V100"), NodeSpec("B", 8000, 65536, 1, "V100")])
    cands = []
    for key, node, milli, ls in (("p", 0, 300, False), ("q", 1, 500, True)):
        req = state.request(PodSpec(key, 1000, 1024, 1, milli))
        cands.append(Candidate(key, node, req, state.place(req, node, (0,)), ls))
    return state, cands


def test_fragmentation_move_golden() -> None:
    state, cands = gpu_cluster()
    # Before: Frag_A = 0 (700 free ≥ 600), Frag_B = 500 (500 free < 600: all of it stranded).
    # p: release → A 1000 free, Frag_A 0. FGD: on B ΔFrag = 500 − 200 = +300 (score int(100·σ(0.3)) = 57),
    #    back on A 0 (score 50) → B. Gain (0 + 500) − (0 + 200) = 300, − cost 100 = 200.
    # q: release → B 1000 free, Frag_B 0. FGD: on A 0 − 200 = −200 (45), on B 0 − 500 (37) → A.
    #    Gain (0 + 500) − (200 + 0) = 300, − 100 = 200: a tie, and q is latency-sensitive, so p goes.
    # Round 2: B has 200 free (Frag 200); q released → 700 free (Frag 0, removal gain 200); FGD: on A
    #    0 − 500 (37), back on B 0 − 200 (45) → B, its own node: no move. One move.
    moves = plan_moves(state, cands, TYPICAL, RebalanceSettings(migration_cost=100.0))
    assert moves == [Move("p", 0, 1, "fragmentation", 200.0)]


def test_a_tie_goes_to_the_earlier_candidate_when_both_are_latency_sensitive() -> None:
    state, cands = gpu_cluster()
    both = [Candidate(c.key, c.node, c.request, c.placement, True) for c in cands]
    assert [m.key for m in plan_moves(state, both[::-1], TYPICAL, RebalanceSettings())] == ["q"]


@pytest.mark.parametrize(
    ("cost", "min_gain", "expected"),
    [
        (299.0, 0.0, [1.0]),  # 300 − 299 = 1 > 0
        (300.0, 0.0, []),  # 300 − 300 = 0, not > 0
        (100.0, 199.0, [200.0]),  # 200 > 199
        (100.0, 200.0, []),  # 200, not > 200
    ],
)
def test_migration_cost_and_min_gain(cost: float, min_gain: float, expected: list[float]) -> None:
    state, cands = gpu_cluster()
    moves = plan_moves(state, cands, TYPICAL, RebalanceSettings(migration_cost=cost, min_gain=min_gain))
    assert [m.gain for m in moves] == expected


def cpu_cluster(load_b: float) -> tuple[ClusterState, list[Candidate]]:
    """Two 10-core nodes with one idle card each (Frag 0: 1000 free ≥ 600); h and g (4 cores each) on A."""
    state = ClusterState([NodeSpec("A", 10000, 65536, 1, "V100"), NodeSpec("B", 10000, 65536, 1, "V100")])
    cands = []
    for key in ("h", "g"):
        req = state.request(PodSpec(key, 4000, 1024))
        cands.append(Candidate(key, 0, req, state.place(req, 0, ()), False))
    state.load[:, 0] = [0.95, load_b]
    return state, cands


def test_hot_node_move_golden() -> None:
    state, cands = cpu_cluster(load_b=0.30)
    # A is hot (0.95 > 0.9). h's share of A's requested cpu: 4000 / 8000 = 0.5 → estimated load
    # 0.95 × 0.5 = 0.475 of A; on B (same size) 0.30 + 0.475 = 0.775 ≤ 0.9: relief counts.
    # LeastAllocated puts h on B (cpu (10000 − 4000)·100/10000 = 60 against A's 20). Fragmentation does
    # not move (every card stays 1000 free). Gain 1000 × 0.475 − 100 = 375, reason hot-node.
    # Round 2: A's load is now 0.95 − 0.475 = 0.475, not hot: g would gain 0 − 100 < 0. g ties h in
    # round 1 and comes later.
    scorer = make_scorer("least-allocated")
    moves = plan_moves(state, cands, TYPICAL, RebalanceSettings(), scorer)
    assert [(m.key, m.from_node, m.to_node, m.reason) for m in moves] == [("h", 0, 1, "hot-node")]
    assert moves[0].gain == pytest.approx(375.0)


def test_measured_pod_usage_finds_the_pod_that_makes_the_node_hot() -> None:
    # The same cluster, but the pods' measured use differs: h uses 0.5 cores, g 8.5 (it bursts past
    # its 4-core request). Relief is use ÷ A's 10 cores: h 0.05, g 0.85. g on B: 0.30 + 0.85 = 1.15 >
    # 0.9, B would be hot: no relief for g; h: 1000 × 0.05 − 100 < 0. Nothing is worth it on B at 0.30.
    state, cands = cpu_cluster(load_b=0.30)
    usage = {"h": 500.0, "g": 8500.0}
    measured = [Candidate(c.key, c.node, c.request, c.placement, False, usage[c.key]) for c in cands]
    assert plan_moves(state, measured, TYPICAL, RebalanceSettings(), make_scorer("least-allocated")) == []
    # B nearly idle (0.02): g moves (0.02 + 0.85 = 0.87 ≤ 0.9), gain 1000 × 0.85 − 100 = 750 — where the
    # request share would have moved h or g alike for 375 and left A at 0.95 − 0.05 = 0.9 (still at the
    # threshold) had it picked h.
    state, cands = cpu_cluster(load_b=0.02)
    measured = [Candidate(c.key, c.node, c.request, c.placement, False, usage[c.key]) for c in cands]
    moves = plan_moves(state, measured, TYPICAL, RebalanceSettings(), make_scorer("least-allocated"))
    assert [(m.key, m.to_node, m.reason) for m in moves] == [("g", 1, "hot-node")]
    assert moves[0].gain == pytest.approx(750.0)


@pytest.mark.parametrize("load_b", [0.5, np.nan])
def test_no_hot_relief_onto_a_node_that_would_be_hot_or_is_unknown(load_b: float) -> None:
    # 0.5 + 0.475 = 0.975 > 0.9: B would be hot too; NaN: B's load is not known. Either way no relief,
    # and the move's gain is 0 − 100: nothing.
    state, cands = cpu_cluster(load_b=load_b)
    assert plan_moves(state, cands, TYPICAL, RebalanceSettings(), make_scorer("least-allocated")) == []


def test_the_state_is_not_changed_and_the_plan_is_deterministic() -> None:
    state, cands = gpu_cluster()
    before = {name: getattr(state, name).copy() for name in MUTABLE_ARRAYS}
    first = plan_moves(state, cands, TYPICAL, RebalanceSettings(max_moves_per_cycle=5))
    assert first == plan_moves(state, cands, TYPICAL, RebalanceSettings(max_moves_per_cycle=5))
    for name, array in before.items():
        np.testing.assert_array_equal(getattr(state, name), array, err_msg=name)


def test_nothing_to_plan() -> None:
    state, cands = gpu_cluster()
    assert plan_moves(state, [], TYPICAL, RebalanceSettings()) == []
    assert plan_moves(state, cands, TYPICAL, RebalanceSettings(max_moves_per_cycle=0)) == []


def test_a_placement_that_does_not_match_is_refused() -> None:
    state, cands = gpu_cluster()
    wrong = Candidate("p", 1, cands[0].request, cands[0].placement, False)  # placement is on node 0
    with pytest.raises(ValueError, match="'p'"):
        plan_moves(state, [wrong], TYPICAL, RebalanceSettings())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_moves_per_cycle": -1},
        {"hot_threshold": 0.0},
        {"hot_weight": -1.0},
        {"migration_cost": -5.0},
        {"hot_weight": 0.5, "latency_sensitive_hot_weight": -1.0},
    ],
)
def test_settings_are_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RebalanceSettings(**kwargs)  # type: ignore[arg-type]


def test_the_learned_terms_golden() -> None:
    # gpu_cluster: p and q each gain 300 − 100 = 200 (test_fragmentation_move_golden), p first on the tie.
    state, cands = gpu_cluster()
    one = {"max_moves_per_cycle": 1}
    # +0.2 × 1000 for a latency-sensitive pod: q (LS) 200 + 200 = 400 beats p's 200.
    moves = plan_moves(state, cands, TYPICAL, RebalanceSettings(latency_sensitive_weight=0.2, **one))
    assert moves == [Move("q", 1, 0, "fragmentation", 400.0)]
    # −0.5 per GPU milli held: p 200 − 150 = 50, q 200 − 250 = −50: only p; at −1 neither (−100, −300).
    moves = plan_moves(state, cands, TYPICAL, RebalanceSettings(pod_gpu_weight=-0.5, **one))
    assert moves == [Move("p", 0, 1, "fragmentation", 50.0)]
    assert plan_moves(state, cands, TYPICAL, RebalanceSettings(pod_gpu_weight=-1.0, **one)) == []
    # cpu_cluster: h off hot A gains 1000 × 0.475 − 100 = 375 (test_hot_node_move_golden).
    state, cands = cpu_cluster(load_b=0.30)
    ls = [Candidate(c.key, c.node, c.request, c.placement, c.key == "h") for c in cands]
    scorer = make_scorer("least-allocated")
    # h latency-sensitive, extra hot weight 1: (1 + 1) × 475 − 100 = 850.
    moves = plan_moves(state, ls, TYPICAL, RebalanceSettings(latency_sensitive_hot_weight=1.0, **one), scorer)
    assert [(m.key, m.reason) for m in moves] == [("h", "hot-node")] and moves[0].gain == pytest.approx(850.0)
    # B's load after the move is 0.30 + 0.475 = 0.775; −0.2 × 1000 × 0.775 = −155: 375 − 155 = 220.
    moves = plan_moves(state, cands, TYPICAL, RebalanceSettings(destination_load_weight=-0.2, **one), scorer)
    assert moves[0].gain == pytest.approx(220.0)


def brute_force_best(state: ClusterState, cands: list[Candidate], settings: RebalanceSettings) -> tuple[float, str]:
    """Every candidate evaluated on its own copy: the best (gain, key) with the planner's tie rules."""
    scorer, measure = make_scorer("fgd", TYPICAL), Fragmentation(TYPICAL, state.model_names)
    tiebreak = TieBreak.by_name(state.names)
    before = measure.cluster_frag(state)
    best: tuple[float, bool, int, str] | None = None
    for k, c in enumerate(cands):
        work = state.copy()
        work.release(c.placement)
        d = decide(scorer, work, c.request, tiebreak)
        if d is None or d.node == c.node:
            continue
        work.place(c.request, d.node, d.cards)
        gain = settings.fragmentation_weight * (before - measure.cluster_frag(work)) - settings.migration_cost
        gain += settings.latency_sensitive_weight * 1000 * c.latency_sensitive  # no load here: no hot terms
        gain += settings.pod_gpu_weight * c.request.gpu_total
        if gain > settings.min_gain and (best is None or (gain, not c.latency_sensitive, -k) > best[:3]):
            best = (gain, not c.latency_sensitive, -k, c.key)
    return (best[0], best[3]) if best else (0.0, "")


SETTINGS_1 = RebalanceSettings(max_moves_per_cycle=1, hot_weight=0.0, migration_cost=10.0)
SETTINGS_LEARNED = RebalanceSettings(
    max_moves_per_cycle=1,
    migration_cost=10.0,
    latency_sensitive_weight=-0.05,
    pod_gpu_weight=0.02,
    destination_load_weight=0.5,
)
"""Signed pod terms and a destination-load term (0 here: no load known), which the bounds must cover."""


def random_cluster(seed: int) -> tuple[ClusterState, list[Candidate]]:
    """Six nodes of 1-3 cards and up to 14 pods of five shapes, placed at random."""
    rng = np.random.default_rng(seed)
    nodes = [NodeSpec(f"n{i}", 16000, 65536, int(rng.integers(1, 4)), "V100") for i in range(6)]
    state = ClusterState(nodes)
    shapes = [(2000, 1, 250), (4000, 1, 500), (1000, 1, 700), (8000, 1, 1000), (2000, 0, 0)]
    cands: list[Candidate] = []
    for k in range(14):
        cpu, num, milli = shapes[int(rng.integers(len(shapes)))]
        req = state.request(PodSpec(f"p{k}", cpu, 1024, num, milli))
        d = decide(make_scorer("random"), state, req, TieBreak.seeded(len(nodes), seed + k))
        if d is not None:
            cands.append(Candidate(f"p{k}", d.node, req, state.place(req, d.node, d.cards), bool(k % 3 == 0)))
    return state, cands


@pytest.mark.parametrize("seed", range(6))
def test_the_bounded_search_finds_what_brute_force_finds(seed: int) -> None:
    state, cands = random_cluster(seed)
    moves = plan_moves(state, cands, TYPICAL, SETTINGS_1)
    gain, key = brute_force_best(state, cands, SETTINGS_1)
    assert [(m.key, round(m.gain, 6)) for m in moves] == ([(key, round(gain, 6))] if key else [])


@pytest.mark.parametrize("seed", range(6))
def test_the_bounded_search_finds_what_brute_force_finds_with_learned_terms(seed: int) -> None:
    state, cands = random_cluster(seed)
    moves = plan_moves(state, cands, TYPICAL, SETTINGS_LEARNED)
    gain, key = brute_force_best(state, cands, SETTINGS_LEARNED)
    assert [(m.key, round(m.gain, 6)) for m in moves] == ([(key, round(gain, 6))] if key else [])


def test_the_comparison_above_is_not_vacuous() -> None:
    for settings in (SETTINGS_1, SETTINGS_LEARNED):
        found = [brute_force_best(*random_cluster(seed), settings)[1] for seed in range(6)]
        assert sum(bool(k) for k in found) >= 3  # most of these clusters have a move worth 10 milli
