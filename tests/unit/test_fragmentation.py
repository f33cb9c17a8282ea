"""FGD's fragmentation measure against a slow pure-Python reference written from the openb README.

README: ``Frag = Σ_t p_t · frag_t`` over typical pods t: if t fits the node (model allowed, enough cards
with free ≥ t's milli, enough cpu), frag_t is the free milli on cards that cannot host t; otherwise all
free GPU milli on the node is fragment (CPU-only typical pods always count all free GPU milli).
FGD's score is ``100·sigmoid((Frag_before − Frag_after)/1000)`` truncated; for a share pod every card
that fits is tried and the first card with the highest (integer) score is taken. As the authors'
simulator reads pods, one without a cpu request counts 100m (Kubernetes' non-zero request), the
typical pods included.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlsched.policy import ClusterState, Fragmentation, NodeSpec, PodSpec, TypicalPods, default_cards, feasible_nodes

MODELS = ("A", "B")


# -- the reference -------------------------------------------------------------------------------


def ref_node_frag(cards: list[int], cpu_free: int, model: str, typical: list[dict]) -> float:
    """Fragmentation of one node: ``cards`` are the free milli of the cards the node has."""
    total = sum(cards)
    frag = 0.0
    for t in typical:
        allowed = model != "" and (not t["models"] or model in t["models"])
        if t["milli"] == 0 or not allowed:
            frag += t["weight"] * total
            continue
        fitting = [f for f in cards if f >= t["milli"]]
        if len(fitting) >= t["num"] and cpu_free >= t["cpu"]:
            frag += t["weight"] * sum(f for f in cards if f < t["milli"])
        else:
            frag += t["weight"] * total
    return frag


def ref_score(delta: float) -> int:
    return int(100 * (1 / (1 + math.exp(-delta / 1000))))


def ref_placement(cards: list[int], cpu_free: int, model: str, typical: list[dict], pod: PodSpec):
    """(score, card, delta, best_delta) for placing ``pod`` on the node, as the README defines it."""
    before = ref_node_frag(cards, cpu_free, model, typical)
    cpu_after = cpu_free - (pod.cpu_milli or 100)  # a pod without a cpu request counts 100m
    if pod.is_share:
        tried = []
        for c, free in enumerate(cards):
            if free >= pod.gpu_milli:
                after_cards = list(cards)
                after_cards[c] -= pod.gpu_milli
                delta = before - ref_node_frag(after_cards, cpu_after, model, typical)
                tried.append((ref_score(delta), c, delta))
        best = max(s for s, _, _ in tried)
        score, card, delta = next(t for t in tried if t[0] == best)  # first card with the highest score
        return score, card, delta, max(d for _, _, d in tried)
    after_cards = list(cards)
    for c in [c for c, f in enumerate(cards) if f == 1000][: pod.num_gpu]:
        after_cards[c] = 0
    delta = before - ref_node_frag(after_cards, cpu_after, model, typical)
    return ref_score(delta), -1, delta, delta


def as_dicts(typical: TypicalPods) -> list[dict]:
    return [
        {"cpu": int(c) or 100, "milli": int(g), "num": int(n), "models": m, "weight": float(w)}
        for c, g, n, m, w in zip(
            typical.cpu_milli, typical.gpu_milli, typical.num_gpu, typical.gpu_models, typical.weight, strict=True
        )
    ]


def node_view(state: ClusterState, n: int) -> tuple[list[int], int, str]:
    k = int(state.gpu_count[n])
    return [int(x) for x in state.card_free[n, :k]], int(state.cpu_free[n]), state.nodes[n].gpu_model


# -- random clusters -----------------------------------------------------------------------------


def random_pod(rng: np.random.Generator, name: str) -> PodSpec:
    kind = rng.random()
    cpu = int(rng.integers(0, 9)) * 1000
    models = () if rng.random() < 0.7 else (str(rng.choice(MODELS)),)
    if kind < 0.2:
        return PodSpec(name, cpu, 0)
    if kind < 0.7:
        return PodSpec(name, cpu, 0, 1, int(rng.choice([100, 250, 300, 470, 500, 650, 810, 999])), models)
    return PodSpec(name, cpu, 0, int(rng.integers(1, 4)), 1000, models)


def random_typical(rng: np.random.Generator) -> TypicalPods:
    pods = [random_pod(rng, f"t{i}") for i in range(int(rng.integers(2, 8)))]
    return TypicalPods(
        cpu_milli=np.array([p.cpu_milli for p in pods], dtype=np.int64),
        gpu_milli=np.array([p.gpu_milli for p in pods], dtype=np.int64),
        num_gpu=np.array([p.num_gpu for p in pods], dtype=np.int64),
        gpu_models=tuple(p.gpu_models if p.num_gpu else () for p in pods),
        weight=(w := rng.random(len(pods)) + 0.05) / w.sum(),
    )


def random_state(rng: np.random.Generator) -> ClusterState:
    nodes = []
    for i in range(int(rng.integers(3, 7))):
        k = int(rng.integers(0, 9))
        nodes.append(
            NodeSpec(f"n{i}", int(rng.integers(4, 33)) * 1000, 1 << 20, k, str(rng.choice(MODELS)) if k else "")
        )
    state = ClusterState(nodes)
    for j in range(int(rng.integers(0, 40))):  # random fills through place(), so every array stays consistent
        pod = random_pod(rng, f"fill{j}")
        req = state.request(pod)
        fits = feasible_nodes(state, req)
        if len(fits):
            n = int(rng.choice(fits))
            if req.is_share:
                card = int(rng.choice(np.flatnonzero(state.card_free[n, : state.gpu_count[n]] >= req.gpu_milli)))
                state.place(req, n, (card,))
            else:
                state.place(req, n, default_cards(state, req, n))
    return state


@pytest.mark.parametrize("seed", range(12))
def test_node_frag_and_placement_match_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    state = random_state(rng)
    typical = random_typical(rng)
    measure = Fragmentation(typical, state.model_names)
    ref_typical = as_dicts(typical)

    frag = measure.node_frag(state)
    for n in range(state.num_nodes):
        assert frag[n] == pytest.approx(ref_node_frag(*node_view(state, n), ref_typical), abs=1e-9)
    assert measure.cluster_frag(state) == pytest.approx(frag.sum())

    checked = 0
    for i in range(20):
        pod = random_pod(rng, f"p{i}")
        req = state.request(pod)
        nodes = feasible_nodes(state, req)
        if not len(nodes):
            continue
        got = measure.placement(state, req, nodes)
        for k, n in enumerate(nodes):
            score, card, delta, best = ref_placement(*node_view(state, int(n)), ref_typical, pod)
            assert (int(got.score[k]), int(got.card[k])) == (score, card), (seed, pod, int(n))
            assert got.delta[k] == pytest.approx(delta, abs=1e-9)
            assert got.best_delta[k] == pytest.approx(best, abs=1e-9)
            checked += 1
        # Place it (FGD's card for share pods) and check the cache follows the change.
        n = int(nodes[int(np.argmax(got.score))])
        k = int(np.flatnonzero(nodes == n)[0])
        state.place(req, n, (int(got.card[k]),) if req.is_share else default_cards(state, req, n))
        frag = measure.node_frag(state)
        assert frag[n] == pytest.approx(ref_node_frag(*node_view(state, n), ref_typical), abs=1e-9)
    assert checked > 0


# -- hand-computed -------------------------------------------------------------------------------


def two_typical(cpu: int = 1000) -> TypicalPods:
    # t0: a 500-milli share, t1: one whole card; p = 0.5 each.
    return TypicalPods(np.array([cpu, cpu]), np.array([500, 1000]), np.array([1, 1]), ((), ()), np.array([0.5, 0.5]))


def test_hand_computed_share_card_choice() -> None:
    # One node, 2 cards, card 1 already holds 700 → free [1000, 300].
    state = ClusterState([NodeSpec("n", 16000, 1024, 2, "A")])
    state.place(state.request(PodSpec("u", 0, 0, 1, 700)), 0, (1,))
    measure = Fragmentation(two_typical(), state.model_names)
    # Before: t0 fits card 0, card 1 (300 < 500) is fragment: 0.5·300 = 150
    #         t1 fits card 0, card 1 (300 < 1000) is fragment: 0.5·300 = 150   → Frag = 300
    assert measure.node_frag(state).tolist() == [300.0]
    req = state.request(PodSpec("p", 0, 0, 1, 200))
    got = measure.placement(state, req, np.array([0]))
    # On card 1 → [1000, 100]: t0 0.5·100 + t1 0.5·100 = 100; Δ = 300 − 100 = 200; score int(100·σ(0.2)) = 54
    # On card 0 → [800, 300]: t0 fits card 0 (800 ≥ 500) → 0.5·300 = 150; t1 no free card → 0.5·1100 = 550
    #            Frag = 700; Δ = −400; score int(100·σ(−0.4)) = 40
    assert (got.score.tolist(), got.card.tolist()) == ([54], [1])
    assert got.delta.tolist() == [200.0] and got.best_delta.tolist() == [200.0]


def test_hand_computed_cpu_and_model_make_everything_fragment() -> None:
    # t0 needs 8 cores; the node has 4 free → t0 cannot fit, all 2000 free milli count for it.
    state = ClusterState([NodeSpec("n", 4000, 1024, 2, "A"), NodeSpec("m", 64000, 1024, 2, "B")])
    measure = Fragmentation(two_typical(cpu=8000), state.model_names)
    assert measure.node_frag(state).tolist() == [0.5 * 2000 + 0.5 * 2000, 0.0]
    # A model-constrained typical pod on the other model: everything is fragment for it.
    typical = TypicalPods(np.array([0]), np.array([500]), np.array([1]), (("A",),), np.array([1.0]))
    assert Fragmentation(typical, state.model_names).node_frag(state).tolist() == [0.0, 2000.0]
    # A CPU-only typical pod counts all free GPU milli; CPU-only nodes have none.
    cpu_only = TypicalPods(np.array([100]), np.array([0]), np.array([0]), ((),), np.array([1.0]))
    state2 = ClusterState([NodeSpec("g", 4000, 1, 3, "A"), NodeSpec("c", 4000, 1)])
    assert Fragmentation(cpu_only, state2.model_names).node_frag(state2).tolist() == [3000.0, 0.0]


def test_whole_card_placement_takes_lowest_free_cards() -> None:
    # Free [1000, 500, 1000, 1000]; a 2-card pod takes cards 0 and 2 → [0, 500, 0, 1000].
    state = ClusterState([NodeSpec("n", 64000, 1024, 4, "A")])
    state.place(state.request(PodSpec("u", 0, 0, 1, 500)), 0, (1,))
    measure = Fragmentation(two_typical(), state.model_names)
    # Before: t0 fragment 0 (every card ≥ 500), t1 fragment 500 → 0.5·500 = 250
    # After:  t0 fragment 0 (500 and 1000 fit; 0-free cards add 0), t1 fragment 500 → 250 → Δ = 0 → 50
    got = measure.placement(state, state.request(PodSpec("w", 0, 0, 2, 1000)), np.array([0]))
    assert (got.score.tolist(), got.card.tolist(), got.delta.tolist()) == ([50], [-1], [0.0])


# -- caching through node_version ----------------------------------------------------------------


def test_cache_refreshes_only_changed_nodes() -> None:
    state = ClusterState([NodeSpec(f"n{i}", 8000, 1024, 2, "A") for i in range(3)])
    measure = Fragmentation(two_typical(), state.model_names)
    assert measure.node_frag(state).tolist() == [0.0, 0.0, 0.0]
    # Write behind the state's back: the cache does not notice (it trusts node_version)...
    state.card_free[1, 0] = 300
    assert measure.node_frag(state).tolist() == [0.0, 0.0, 0.0]
    # ...and picks the change up once the node's version moves.
    state.node_version[1] += 1
    assert measure.node_frag(state).tolist() == [0.0, 300.0, 0.0]
    # place()/release() move the version themselves.
    p = state.place(state.request(PodSpec("p", 0, 0, 1, 600)), 2, (0,))
    assert measure.node_frag(state).tolist() == [0.0, 300.0, 400.0]  # [400, 1000]: t0 0.5·400 + t1 0.5·400
    state.release(p)
    assert measure.node_frag(state).tolist() == [0.0, 300.0, 0.0]
    # A copy starts with an empty cache and its own versions.
    other = state.copy()
    other.place(other.request(PodSpec("q", 0, 0, 1, 600)), 0, (0,))
    assert measure.node_frag(other).tolist() == [400.0, 300.0, 0.0]
    assert measure.node_frag(state).tolist() == [0.0, 300.0, 0.0]


def test_two_measures_do_not_share_a_cache() -> None:
    state = ClusterState([NodeSpec("n", 8000, 1024, 2, "A")])
    state.place(state.request(PodSpec("p", 0, 0, 1, 600)), 0, (0,))
    a = Fragmentation(two_typical(), state.model_names)
    small_share = TypicalPods(np.array([0]), np.array([300]), np.array([1]), ((),), np.array([1.0]))
    b = Fragmentation(small_share, state.model_names)
    assert a.node_frag(state).tolist() == [400.0]  # free [400, 1000]: 400 is fragment for both t0 and t1
    assert b.node_frag(state).tolist() == [0.0]  # a 300 share fits both cards


def test_a_new_measure_never_reads_another_measures_cached_values() -> None:
    """The per-state cache was keyed by ``id()``: a measure built after another was freed (a model
    reload) often got the same id, and with the node versions unchanged read the old values."""
    state = ClusterState([NodeSpec(f"n{i}", 64000, 1024, 4, "A") for i in range(3)])
    state.place(state.request(PodSpec("p", 1000, 1, 1, 300)), 0, (0,))
    wide = TypicalPods(np.array([0]), np.array([800]), np.array([1]), ((),), np.array([1.0]))
    narrow = TypicalPods(np.array([0]), np.array([200]), np.array([2]), ((),), np.array([1.0]))
    for _ in range(20):
        first = Fragmentation(wide, state.model_names)
        first.node_frag(state)
        del first
        second = Fragmentation(narrow, state.model_names)
        fresh = Fragmentation(narrow, state.model_names).node_frag(state.copy())
        np.testing.assert_array_equal(second.node_frag(state), fresh)


def test_a_pod_without_a_cpu_request_takes_100m_as_in_the_fgd_simulator() -> None:
    """Typical pod 4000m + 1 card; node a has 4050m free, b 8000m; a CPU-only pod asking no cpu: on a
    the typical pod no longer fits after it (4050 − 100 < 4000), so a's card turns to fragment."""
    state = ClusterState([NodeSpec("a", 4050, 65536, 1, "T4"), NodeSpec("b", 8000, 65536, 1, "T4")])
    typical = TypicalPods(
        cpu_milli=np.array([4000]),
        gpu_milli=np.array([1000]),
        num_gpu=np.array([1]),
        gpu_models=((),),
        weight=np.array([1.0]),
    )
    req = state.request(PodSpec("p", 0, 0))
    scores = Fragmentation(typical, state.model_names).placement(state, req, np.array([0, 1])).score
    assert scores.tolist() == [ref_score(-1000.0), ref_score(0.0)] == [26, 50]


def test_a_scorer_keeps_measures_for_the_latest_few_model_vocabularies_only() -> None:
    """A serving scorer lives for weeks; each new set of GPU models in the cluster (a node pool scaled
    to zero and back) made a measure that was never dropped."""
    from rlsched.policy.fragmentation import MEASURES_KEPT
    from rlsched.policy.scorers.fgd import FgdScorer

    typical = TypicalPods(np.array([0]), np.array([500]), np.array([1]), ((),), np.array([1.0]))
    scorer = FgdScorer(typical)
    for i in range(MEASURES_KEPT + 6):
        state = ClusterState([NodeSpec("n", 64000, 1024, 4, f"model-{i}")])
        measure = scorer.fragmentation(state)
        assert scorer.fragmentation(state) is measure  # kept while in use
    assert len(scorer._frag) == MEASURES_KEPT
    assert ("model-0",) not in scorer._frag and (f"model-{MEASURES_KEPT + 5}",) in scorer._frag
