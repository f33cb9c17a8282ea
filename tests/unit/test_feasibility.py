"""Feasibility: the one check shared by simulator, trainer and extender, and its filter reasons."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy import (
    ClusterState,
    NodeSpec,
    PodSpec,
    feasible_mask,
    feasible_nodes,
    infeasibility_reason,
    unresolvable_mask,
)


def state_with(card_rows: dict[str, list[int]], nodes: list[NodeSpec]) -> ClusterState:
    """A state whose cards have the given free milli (set through place(), never by writing arrays)."""
    state = ClusterState(nodes)
    for name, row in card_rows.items():
        n = state.index[name]
        for c, free in enumerate(row):
            if free < 1000:
                state.place(state.request(PodSpec(f"{name}-{c}", 0, 0, 1, 1000 - free)), n, (c,))
    return state


def test_share_pod_needs_one_card_with_enough_free() -> None:
    # n0: the only partly free card has 500 free, the others are full → a 600 share does not fit.
    # n1: same total free (500 + 500) spread over two cards → still no card with 600.
    # n2: one card with 600 free → fits exactly.
    nodes = [NodeSpec(f"n{i}", 8000, 8000, 4, "V100") for i in range(3)]
    state = state_with({"n0": [500, 0, 0, 0], "n1": [500, 500, 0, 0], "n2": [0, 600, 0, 0]}, nodes)
    req = state.request(PodSpec("p", 0, 0, 1, 600))
    assert feasible_mask(state, req).tolist() == [False, False, True]
    assert infeasibility_reason(state, req, 0) == "no GPU card with 600 milli free (most free on one card: 500)"
    assert infeasibility_reason(state, req, 2) == ""
    # ...and a 500 share fits on n0 and n1.
    assert feasible_nodes(state, state.request(PodSpec("q", 0, 0, 1, 500))).tolist() == [0, 1, 2]


def test_whole_card_pods_need_completely_free_cards() -> None:
    # 3800 milli free in total, but only two cards completely free.
    nodes = [NodeSpec("n", 8000, 8000, 4, "V100")]
    state = state_with({"n": [1000, 900, 1000, 900]}, nodes)
    assert state.full_free[0] == 2
    assert feasible_mask(state, state.request(PodSpec("two", 0, 0, 2, 1000))).tolist() == [True]
    three = state.request(PodSpec("three", 0, 0, 3, 1000))
    assert feasible_mask(state, three).tolist() == [False]
    assert infeasibility_reason(state, three, 0) == "needs 3 whole free GPU card(s) of 1000 milli, node has 2 of 4"
    # One whole card is a whole-card pod too: a 900-free card does not count.
    full = state_with({"n": [900, 900, 900, 900]}, nodes)
    assert feasible_mask(full, full.request(PodSpec("one", 0, 0, 1, 1000))).tolist() == [False]
    assert feasible_mask(full, full.request(PodSpec("share", 0, 0, 1, 900))).tolist() == [True]


def test_model_constraint_and_cpu_only_nodes() -> None:
    nodes = [
        NodeSpec("cpu", 64000, 64000),
        NodeSpec("v100", 64000, 64000, 2, "V100"),
        NodeSpec("t4", 64000, 64000, 2, "T4"),
    ]
    state = ClusterState(nodes)
    assert state.model_id.tolist() == [-1, 1, 0]
    v100 = state.request(PodSpec("p", 0, 0, 1, 500, ("V100",)))
    assert feasible_mask(state, v100).tolist() == [False, True, False]
    assert infeasibility_reason(state, v100, 0) == "node has no GPU"
    assert infeasibility_reason(state, v100, 2) == "GPU model T4 not allowed (pod allows V100)"
    anywhere = state.request(PodSpec("p", 0, 0, 1, 500))
    assert feasible_mask(state, anywhere).tolist() == [False, True, True]  # -1 never indexes a real model
    both = state.request(PodSpec("p", 0, 0, 2, 1000, ("T4", "V100")))
    assert feasible_mask(state, both).tolist() == [False, True, True]
    absent = state.request(PodSpec("p", 0, 0, 1, 500, ("A100",)))
    assert feasible_mask(state, absent).tolist() == [False, False, False]
    assert (
        infeasibility_reason(state, absent, 1)
        == "GPU model V100 not allowed (the pod accepts only GPU models no node has)"
    )
    cpu_pod = state.request(PodSpec("c", 1000, 1000))
    assert feasible_mask(state, cpu_pod).tolist() == [True, True, True]


def test_zero_card_nodes_and_unresolvable() -> None:
    nodes = [NodeSpec("cpu", 4000, 4000), NodeSpec("g2", 4000, 4000, 2, "G2"), NodeSpec("g8", 4000, 4000, 8, "G2")]
    state = ClusterState(nodes)
    four = state.request(PodSpec("p", 1000, 1000, 4, 1000))
    assert feasible_mask(state, four).tolist() == [False, False, True]
    assert unresolvable_mask(state, four).tolist() == [True, True, False]
    # Fill g8 completely: now it is infeasible but not unresolvable (preemption could help).
    state.place(state.request(PodSpec("fill", 0, 0, 8, 1000)), 2, range(8))
    assert feasible_mask(state, four).tolist() == [False, False, False]
    assert unresolvable_mask(state, four).tolist() == [True, True, False]
    big_cpu = state.request(PodSpec("big", 5000, 0))
    assert unresolvable_mask(state, big_cpu).tolist() == [True, True, True]
    v100 = state.request(PodSpec("v", 0, 0, 1, 100, ("V100",)))
    assert unresolvable_mask(state, v100).tolist() == [True, True, True]


def test_cpu_and_memory_reasons() -> None:
    state = ClusterState([NodeSpec("n", 4000, 2048, 1, "T4")])
    state.place(state.request(PodSpec("a", 3000, 1024)), 0, ())
    req = state.request(PodSpec("p", 2000, 2048, 1, 500))
    assert not feasible_mask(state, req)[0]
    assert infeasibility_reason(state, req, 0) == (
        "insufficient cpu: pod requests 2000m, node has 1000m free of 4000m; "
        "insufficient memory: pod requests 2048Mi, node has 1024Mi free of 2048Mi"
    )
    fits = state.request(PodSpec("q", 1000, 1024, 1, 1000))
    assert feasible_mask(state, fits).tolist() == [True] and infeasibility_reason(state, fits, 0) == ""


def test_cards_beyond_gpu_count_are_never_free() -> None:
    # A 2-card node in a cluster whose widest node has 8 cards: columns 2..7 exist in card_free but are
    # 0 and never counted, so a 3-card pod never fits and a share pod never lands there.
    state = ClusterState([NodeSpec("small", 8000, 8000, 2, "T4"), NodeSpec("wide", 8000, 8000, 8, "T4")])
    assert state.card_free[0].tolist() == [1000, 1000, 0, 0, 0, 0, 0, 0]
    assert feasible_mask(state, state.request(PodSpec("p", 0, 0, 3, 1000))).tolist() == [False, True]
    state.place(state.request(PodSpec("a", 0, 0, 2, 1000)), 0, (0, 1))
    assert feasible_mask(state, state.request(PodSpec("s", 0, 0, 1, 1))).tolist() == [False, True]


def test_feasible_nodes_sorted_and_matches_mask() -> None:
    rng = np.random.default_rng(3)
    cards = rng.integers(0, 5, size=20)
    nodes = [NodeSpec(f"n{i}", 4000, 4000, int(k), "T4" if k else "") for i, k in enumerate(cards)]
    state = ClusterState(nodes)
    req = state.request(PodSpec("p", 100, 100, 1, 700))
    got = feasible_nodes(state, req)
    assert got.tolist() == sorted(got.tolist())
    assert got.tolist() == np.flatnonzero(feasible_mask(state, req)).tolist()
    assert got.tolist() == [i for i, n in enumerate(nodes) if n.gpu_count > 0]
    assert 0 < len(got) < len(nodes)  # the seed gives both kinds of node


@pytest.mark.parametrize("spec", [PodSpec("c", 0, 0), PodSpec("s", 0, 0, 1, 1), PodSpec("w", 0, 0, 1, 1000)])
def test_empty_requests_fit_any_capable_node(spec: PodSpec) -> None:
    state = ClusterState([NodeSpec("z", 0, 0), NodeSpec("g", 0, 0, 1, "T4")])
    expected = [not spec.num_gpu, True]
    assert feasible_mask(state, state.request(spec)).tolist() == expected


def test_reasons_without_detail_depend_only_on_the_pod() -> None:
    """kube-scheduler's FailedScheduling event counts identical reasons: summaries must not carry node numbers."""
    state = ClusterState([NodeSpec("a", 2000, 4096, 2, "T4"), NodeSpec("b", 3000, 8192, 4, "T4")])
    big = state.request(PodSpec("p", 4000, 16384, 2, 1000))
    assert (
        infeasibility_reason(state, big, 0, detail=False)
        == infeasibility_reason(state, big, 1, detail=False)
        == ("insufficient cpu (pod requests 4000m); insufficient memory (pod requests 16384Mi)")
    )
    state.place(state.request(PodSpec("x", 0, 0, 1, 700)), 0, (0,))
    state.place(state.request(PodSpec("y", 0, 0, 1, 400)), 0, (1,))
    share = state.request(PodSpec("s", 100, 100, 1, 700))
    assert infeasibility_reason(state, share, 0, detail=False) == "no GPU card with 700 milli free"
    assert infeasibility_reason(state, share, 0) == "no GPU card with 700 milli free (most free on one card: 600)"
