"""The FGD paper's baseline scorers, hand-computed from the formulas in the openb README.

MaxSpecCpu = 128000 milli, MaxSpecGpu = 8000 milli; scores are integers 0..100, truncated.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec, TieBreak, TypicalPods, decide, default_cards, make_scorer
from rlsched.policy.scorers import (
    SCORERS,
    BestFitScorer,
    DotProductScorer,
    FgdScorer,
    GpuClusteringScorer,
    GpuPackingScorer,
    RandomScorer,
    UnknownPolicyError,
    normalize_min_max,
    scorer_names,
)


def build(nodes: list[NodeSpec], placed: list[tuple[str, PodSpec, tuple[int, ...] | None]]) -> ClusterState:
    state = ClusterState(nodes)
    for name, spec, cards in placed:
        n = state.index[name]
        req = state.request(spec)
        state.place(req, n, default_cards(state, req, n) if cards is None else cards)
    return state


def scores(scorer, state: ClusterState, spec: PodSpec) -> list[int]:
    out = scorer.score(state, state.request(spec), np.arange(state.num_nodes)).values
    assert out.dtype.kind == "i"
    return out.tolist()


# A: 64 cores, 8 free cards;  B: 128 cores, 4 cards with 2 taken (2000 free);
# C: 16 cores, 8 cards with 4 taken (4000 free);  D: 1 core with 950m taken, 1 free card.
@pytest.fixture
def abcd() -> ClusterState:
    return build(
        [
            NodeSpec("A", 64000, 1 << 20, 8, "G"),
            NodeSpec("B", 128000, 1 << 20, 4, "G"),
            NodeSpec("C", 16000, 1 << 20, 8, "G"),
            NodeSpec("D", 1000, 1 << 20, 1, "G"),
        ],
        [
            ("B", PodSpec("b", 0, 0, 2, 1000), None),
            ("C", PodSpec("c", 0, 0, 4, 1000), None),
            ("D", PodSpec("d", 950, 0), None),
        ],
    )


# -- DotProd -------------------------------------------------------------------------------------
# int(100·(1 − (cpu_left/128000 · pod_cpu/128000 + gpu_free/8000 · pod_gpu/8000) / 2)); 0 if cpu does not fit.


@pytest.mark.parametrize(
    "spec, expected",
    [
        pytest.param(
            PodSpec("w", 8000, 0, 1, 1000),
            # pod: 8000/128000 = .0625, 1000/8000 = .125
            # A: .5·.0625 + 1·.125 = .15625      → 100·(1 − .078125) = 92.19 → 92
            # B: 1·.0625 + .25·.125 = .09375     → 100·(1 − .046875) = 95.31 → 95
            # C: .125·.0625 + .5·.125 = .0703125 → 100·(1 − .03515625) = 96.48 → 96
            # D: cpu_left 50 < 8000 → 0
            [92, 95, 96, 0],
            id="one whole card",
        ),
        pytest.param(
            PodSpec("s", 0, 0, 1, 500),
            # pod cpu 0 counts as 100m: 100/128000 = .00078125; gpu 500/8000 = .0625
            # A: .5·.00078125 + 1·.0625 = .062890625 → 100·(1 − .0314453125) = 96.86 → 96
            # B: 1·.00078125 + .25·.0625 = .01640625 → 100·(1 − .008203125) = 99.18 → 99
            # C: .125·.00078125 + .5·.0625 = .03134765625 → 100·(1 − .015673828125) = 98.43 → 98
            # D: cpu_left 50 < 100 (the non-zero default) → 0
            [96, 99, 98, 0],
            id="share pod without cpu request",
        ),
        pytest.param(
            PodSpec("c", 64000, 0),
            # pod .5, no gpu. A: .5·.5 = .25 → 100·(1 − .125) = 87.5 → 87; B: 1·.5 → 75; C, D: cpu does not fit → 0
            [87, 75, 0, 0],
            id="cpu-only pod",
        ),
    ],
)
def test_dotprod(abcd: ClusterState, spec: PodSpec, expected: list[int]) -> None:
    assert scores(DotProductScorer(), abcd, spec) == expected


# -- BestFit -------------------------------------------------------------------------------------
# raw = int(100·(1 − (.5·(cpu_left − pod_cpu)/128000 + .5·(gpu_free − pod_gpu)/8000))), then
# (raw − min)·100 // (max − min) over the nodes scored.


def test_bestfit(abcd: ClusterState) -> None:
    spec = PodSpec("w", 16000, 0, 1, 1000)
    # A: .5·48000/128000 + .5·7000/8000 = .1875 + .4375 = .625 → 37
    # B: .5·112000/128000 + .5·1000/8000 = .4375 + .0625 = .5  → 50
    # C: .5·0/128000 + .5·3000/8000 = .1875                    → 81
    # normalized: A (37−37)·100//44 = 0, B (50−37)·100//44 = 29, C 100
    state = abcd
    req = state.request(spec)
    nodes = np.array([0, 1, 2])
    assert BestFitScorer().score(state, req, nodes).values.tolist() == [0, 29, 100]
    # One node, or all equal: every score 0.
    assert BestFitScorer().score(state, req, np.array([1])).values.tolist() == [0]


def test_normalize_min_max() -> None:
    assert normalize_min_max(np.array([37, 50, 81])).tolist() == [0, 29, 100]
    assert normalize_min_max(np.array([5, 5, 5])).tolist() == [0, 0, 0]
    assert normalize_min_max(np.array([-10, 0, 10])).tolist() == [0, 50, 100]


# -- GpuPacking ----------------------------------------------------------------------------------


@pytest.fixture
def packing() -> ClusterState:
    # E8, E2, E1: empty nodes of 8, 2 and 1 cards (E1 runs a CPU-only pod: still "all cards free").
    # U: 4 cards, card 0 has 300 free, card 1 has 550 free, cards 2 and 3 free.
    return build(
        [
            NodeSpec("E8", 64000, 1 << 20, 8, "G"),
            NodeSpec("E2", 64000, 1 << 20, 2, "G"),
            NodeSpec("E1", 64000, 1 << 20, 1, "G"),
            NodeSpec("U", 64000, 1 << 20, 4, "G"),
        ],
        [
            ("E1", PodSpec("cpu", 1000, 1), None),
            ("U", PodSpec("u0", 0, 0, 1, 700), (0,)),
            ("U", PodSpec("u1", 0, 0, 1, 450), (1,)),
        ],
    )


@pytest.mark.parametrize(
    "spec, expected",
    [
        # Empty nodes: max(33 − n_free, n_free): E8 max(25, 8) = 25, E2 max(31, 2) = 31, E1 max(32, 1) = 32.
        # U (used), share 250: tightest card 0 (300 free) → max(100 − (300·100//1000)//10, 50) = 100 − 3 = 97
        (PodSpec("s", 0, 0, 1, 250), [25, 31, 32, 97]),
        # share 400: tightest card 1 (550 free) → 100 − 55//10 = 95
        (PodSpec("s", 0, 0, 1, 400), [25, 31, 32, 95]),
        # share 600: tightest card is a free card → max(50 − 1, 33) = 49
        (PodSpec("s", 0, 0, 1, 600), [25, 31, 32, 49]),
        # whole-card pods on a used node: max(50 − k, 33)
        (PodSpec("w", 0, 0, 1, 1000), [25, 31, 32, 49]),
        (PodSpec("w", 0, 0, 2, 1000), [25, 31, 32, 48]),
        # CPU-only pods score 0 everywhere
        (PodSpec("c", 1000, 1), [0, 0, 0, 0]),
    ],
)
def test_gpupacking(packing: ClusterState, spec: PodSpec, expected: list[int]) -> None:
    assert scores(GpuPackingScorer(), packing, spec) == expected


def test_gpupacking_large_k_floor() -> None:
    # max(50 − k, 33) bottoms out at 33 for k ≥ 17 (needs a wide node to be meaningful).
    state = build([NodeSpec("W", 1000, 1, 20, "G")], [("W", PodSpec("s", 0, 0, 1, 10), None)])
    assert scores(GpuPackingScorer(), state, PodSpec("w", 0, 0, 18, 1000)) == [33]


# -- GpuClustering -------------------------------------------------------------------------------
# 25·(8000 − gpu_free)//8000 + 75 (only the pod's kind) / 50 (its kind among others) / 25 (no GPU pod) / 0


@pytest.fixture
def clustering() -> ClusterState:
    return build(
        [NodeSpec(f"N{i}", 64000, 1 << 20, 8 if i == 4 else 4, "G") for i in range(5)],
        [
            ("N1", PodSpec("s1", 0, 0, 1, 500), None),
            ("N2", PodSpec("s2", 0, 0, 1, 500), None),
            ("N2", PodSpec("w2", 0, 0, 1, 1000), None),
            ("N3", PodSpec("w3", 0, 0, 2, 1000), None),
            ("N4", PodSpec("c4", 1000, 1), None),
        ],
    )


@pytest.mark.parametrize(
    "spec, expected",
    [
        # base: N0 25·4000//8000 = 12, N1 25·4500//8000 = 14, N2 25·5500//8000 = 17, N3 25·6000//8000 = 18,
        #       N4 (8 free cards) 0.  N0 and N4 host no GPU pod (+25).
        # share pod: N1 only shares +75, N2 shares among others +50, N3 only 2-card pods +0
        (PodSpec("s", 0, 0, 1, 300), [12 + 25, 14 + 75, 17 + 50, 18 + 0, 0 + 25]),
        # one whole card: N1 (shares only) +0, N2 (has a 1-card pod among others) +50
        (PodSpec("w", 0, 0, 1, 1000), [37, 14, 67, 18, 25]),
        # two whole cards: only N3 hosts 2-card pods, and only those → +75
        (PodSpec("w", 0, 0, 2, 1000), [37, 14, 17, 93, 25]),
        # CPU-only pods score 0 everywhere
        (PodSpec("c", 1000, 1), [0, 0, 0, 0, 0]),
    ],
)
def test_gpuclustering(clustering: ClusterState, spec: PodSpec, expected: list[int]) -> None:
    assert scores(GpuClusteringScorer(), clustering, spec) == expected


# -- FGD -----------------------------------------------------------------------------------------


def test_fgd_picks_the_card_that_fragments_least() -> None:
    # Typical workload: one 550-milli share pod. Node free [600, 1000]; pod: a 100 share.
    # card 0 → [500, 1000]: 500 < 550 is fragment → Frag 500, Δ = 0 − 500 → int(100·σ(−.5)) = 37
    # card 1 → [600, 900]: both still fit a 550 share → Frag 0, Δ = 0 → 50
    # FGD takes card 1; the default (tightest) rule would take card 0.
    typical = TypicalPods(np.array([0]), np.array([550]), np.array([1]), ((),), np.array([1.0]))
    state = build(
        [NodeSpec("n", 8000, 1 << 20, 2, "G"), NodeSpec("m", 8000, 1 << 20, 1, "G")],
        [("n", PodSpec("u", 0, 0, 1, 400), (0,))],
    )
    req = state.request(PodSpec("p", 0, 0, 1, 100))
    scorer = make_scorer("fgd", typical)
    assert isinstance(scorer, FgdScorer)
    got = scorer.score(state, req, np.array([0, 1]))
    # node m: [1000] → [900]: still fits 550 → Δ 0 → 50
    assert got.values.tolist() == [50, 50] and got.cards.tolist() == [1, 0]
    assert default_cards(state, req, 0) == (0,)
    decision = decide(scorer, state, req, TieBreak(np.array([0, 1]), np.random.default_rng(0)))
    assert (decision.node, decision.cards) == (0, (1,))
    # Whole-card and CPU-only pods leave the card choice to the default rule.
    assert scorer.score(state, state.request(PodSpec("w", 0, 0, 1, 1000)), np.array([0, 1])).cards is None


def test_fgd_needs_typical_pods() -> None:
    with pytest.raises(ValueError, match="typical-pod distribution"):
        make_scorer("fgd")


# -- Random --------------------------------------------------------------------------------------


def test_random_is_uniform_over_nodes_and_fitting_cards() -> None:
    state = build(
        [NodeSpec(f"n{i}", 8000, 1 << 20, 4, "G") for i in range(3)], [("n0", PodSpec("u", 0, 0, 1, 800), (2,))]
    )
    scorer = RandomScorer()
    req = state.request(PodSpec("s", 0, 0, 1, 500))
    nodes = np.arange(3)
    result = scorer.score(state, req, nodes)
    assert result.values.tolist() == [0, 0, 0]
    tiebreak = TieBreak.seeded(3, 1)
    picks = np.bincount([scorer.choose(result, nodes, tiebreak) for _ in range(3000)], minlength=3)
    assert picks.min() > 850  # expected 1000 each
    cards = np.bincount([scorer.cards(state, req, 0, 0, result, tiebreak)[0] for _ in range(3000)], minlength=4)
    assert cards[2] == 0 and cards[[0, 1, 3]].min() > 850  # card 2 has 200 free: never; the rest ~1000
    whole = state.request(PodSpec("w", 0, 0, 2, 1000))
    assert scorer.cards(state, whole, 0, 0, result, tiebreak) == (0, 1)  # whole cards: default rule
    # Same seed, same stream.
    a, b = TieBreak.seeded(3, 9), TieBreak.seeded(3, 9)
    assert [scorer.choose(result, nodes, a) for _ in range(20)] == [scorer.choose(result, nodes, b) for _ in range(20)]


# -- registry ------------------------------------------------------------------------------------


def test_registry_names_and_aliases() -> None:
    assert scorer_names() == list(SCORERS)
    assert {
        "random",
        "least-allocated",
        "most-allocated",
        "balanced-allocation",
        "dotprod",
        "gpupacking",
        "gpuclustering",
        "bestfit",
        "fgd",
    } <= set(scorer_names())
    typical = TypicalPods(np.array([0]), np.array([500]), np.array([1]), ((),), np.array([1.0]))
    for alias, cls in [
        ("BestFit", BestFitScorer),
        ("best-fit", BestFitScorer),
        ("DotProduct", DotProductScorer),
        ("gpu-packing", GpuPackingScorer),
        (" GpuClustering ", GpuClusteringScorer),
        ("FGD", FgdScorer),
    ]:
        assert type(make_scorer(alias, typical)) is cls
    for name in scorer_names():
        assert make_scorer(name, typical).name == name
    with pytest.raises(UnknownPolicyError) as info:
        make_scorer("tetris")
    assert (
        "unknown policy 'tetris'" in str(info.value) and "bestfit" in str(info.value) and "ppo:PATH" in str(info.value)
    )
