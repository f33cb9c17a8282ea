"""The observation encoding (policy/features.py) at the edges of what it is given: nodes with no cpu or
memory, free amounts whose Python hashes collide, and prices near float64's largest value."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from ppo_fixtures import small_typical

from rlsched.extender.objects import node_spec
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_node
from rlsched.policy import ClusterState, NodeSpec, PodSpec, features, make_scorer
from rlsched.policy.features import FEATURES, FeatureEncoder, node_keys
from rlsched.policy.learned import SERVED_MODEL

COL = {name: i for i, name in enumerate(FEATURES)}
GPU = GpuConventions()


@pytest.fixture(scope="module")
def served_model():  # type: ignore[no-untyped-def]
    return make_scorer(f"ppo:{SERVED_MODEL}")


# -- nodes with no cpu or no memory ------------------------------------------------------------------


def test_nodes_without_cpu_or_memory_read_as_full_and_score_finite(served_model) -> None:  # type: ignore[no-untyped-def]
    """Allocatable cpu "0", or memory under 1 MiB (read as 0 MiB), is a node the extender accepts: its
    fractions read as no room (0), not NaN, and the served model still scores every node."""
    nodes = [
        NodeSpec("n0", 32_000, 65_536, 2, "T4"),
        node_spec(make_node("no-cpu", cpu="0"), GPU),
        node_spec(make_node("edge", memory="512Ki"), GPU),
    ]
    assert (nodes[1].cpu_milli, nodes[2].memory_mib) == (0, 0)
    state = ClusterState(nodes)
    req = state.request(PodSpec("best-effort", 0, 0))
    everywhere = np.arange(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cand = served_model.encoder.encode(state, req, everywhere)
        scores = served_model.score(state, req, everywhere).values
    rows = cand.features[cand.group]
    assert np.isfinite(rows).all() and np.isfinite(scores).all()
    assert rows[1, COL["cpu_free_frac"]] == rows[1, COL["cpu_left_frac"]] == 0.0
    assert rows[2, COL["mem_free_frac"]] == rows[2, COL["mem_left_frac"]] == 0.0
    assert rows[0, COL["cpu_free_frac"]] == rows[0, COL["mem_free_frac"]] == 1.0


# -- grouping: exact values, never their hashes ------------------------------------------------------


def overcommitted(cpu_over: tuple[int, ...], mem_over: tuple[int, ...] = ()) -> ClusterState:
    """Equal nodes, node i running pods (placed as another scheduler would) that ask ``cpu_over[i]``
    millicores and ``mem_over[i]`` MiB more than it has."""
    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(len(cpu_over))])
    biggest = 2**53 - 1  # the largest request a PodSpec takes
    for node, over in enumerate(cpu_over):
        cpu = 32_000 + over
        mem = 65_536 + (mem_over[node] if mem_over else 0)
        while cpu > 0 or mem > 0:
            step = state.request(PodSpec("running", min(cpu, biggest), min(mem, biggest)))
            state.place(step, node, (), overcommit=True)
            cpu, mem = cpu - step.cpu_milli, mem - step.memory_mib
    return state


@pytest.mark.parametrize(
    "cpu_over, mem_over",
    [
        ((1, 2), (0, 0)),  # hash(-1) == hash(-2)
        ((0, 2**61 - 1), (0, 0)),  # Python hashes ints modulo 2**61 - 1
        ((0, 0), (1, 2)),
    ],
)
@pytest.mark.parametrize("use_qos", [False, True])
def test_nodes_whose_free_amounts_hash_alike_stay_apart(cpu_over, mem_over, use_qos) -> None:  # type: ignore[no-untyped-def]
    state = overcommitted(cpu_over, mem_over)
    free = list(zip(state.cpu_free.tolist(), state.mem_free.tolist(), strict=True))
    assert free[0] != free[1] and hash(free[0]) == hash(free[1])
    assert node_keys(state)[0] != node_keys(state)[1]
    req = state.request(PodSpec("p", 0, 0, 1, 1000))  # asks no cpu or memory: fits both
    cand = FeatureEncoder(small_typical(), use_qos=use_qos).encode(state, req, np.arange(2))
    assert cand.num_groups == 2 and cand.group.tolist() == [0, 1]
    assert cand.features[1, COL["cpu_free"]] == np.float32(state.cpu_free[1] / 128_000)


def test_node_keys_still_group_equal_nodes() -> None:
    state = overcommitted((5, 5, 7), (3, 3, 3))
    keys = node_keys(state)
    assert keys[0] == keys[1] != keys[2]


def test_node_keys_stay_exact_when_their_table_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table of values seen is bounded: past it, every node is numbered afresh, and keys are still
    equal exactly where the nodes' values are."""
    monkeypatch.setattr(features, "NODE_KEY_TABLE_SLACK", 3)
    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(4)])
    rng = np.random.default_rng(0)
    for _ in range(60):
        node = int(rng.integers(4))
        state.place(state.request(PodSpec("p", int(rng.integers(3)), 0)), node, ())
        keys = node_keys(state)
        values = list(zip(state.cpu_free.tolist(), state.mem_free.tolist(), strict=True))
        for a in range(4):
            for b in range(4):
                assert (keys[a] == keys[b]) == (values[a] == values[b])
        assert keys.max() < 2 * 4 + 3 + 4  # small, as _with_counts needs


# -- prices ------------------------------------------------------------------------------------------


def test_mean_price_does_not_overflow() -> None:
    """Two nodes at 1e308 sum past float64's largest value; the mean (and ``price_rel``) stays right."""
    prices = (1.0, 2.0, 1e308, 1e308)
    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4", price=p) for i, p in enumerate(prices)])
    req = state.request(PodSpec("p", 1000, 1024, 1, 1000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cand = FeatureEncoder(small_typical()).encode(state, req, np.arange(4))
    price_rel = cand.features[cand.group, COL["price_rel"]]
    assert price_rel[2] == price_rel[3] == pytest.approx(2.0)
    assert price_rel[0] == price_rel[1] == 0.0  # 1 / 5e307 in float32
