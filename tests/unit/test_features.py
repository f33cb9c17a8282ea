"""The observation encoding (policy/features.py): grouping, values, schema."""

from __future__ import annotations

import numpy as np
import pytest
from ppo_fixtures import filled_state, small_pods, small_typical

from rlsched.policy import ClusterState, Fragmentation, NodeSpec, PodSpec, feasible_nodes
from rlsched.policy.features import (
    CLUSTER_FEATURES,
    CLUSTER_SLICE,
    FEATURES,
    NUM_FEATURES,
    FeatureEncoder,
    _factorize,
    node_keys,
)
from rlsched.policy.scorers.fgd_cpu import CpuFragmentation

COL = {name: i for i, name in enumerate(FEATURES)}


def pods_with_candidates(state: ClusterState, seed: int = 5, n: int = 40):
    for pod in small_pods(n, seed):
        req = state.request(pod)
        nodes = feasible_nodes(state, req)
        if len(nodes):
            yield pod, req, nodes


def test_schema() -> None:
    assert len(FEATURES) == len(set(FEATURES)) == NUM_FEATURES
    assert FEATURES[CLUSTER_SLICE] == CLUSTER_FEATURES


@pytest.mark.parametrize("seed", range(4))
def test_group_rows_equal_per_node_rows(seed: int) -> None:
    """Grouping changes nothing: each node's own row equals its group's row (cluster columns aside)."""
    state = filled_state(seed)
    enc = FeatureEncoder(small_typical())
    node_cols = [i for i, name in enumerate(FEATURES) if name not in ("feasible_frac", "groups_frac")]
    for _, req, nodes in pods_with_candidates(state, seed):
        cand = enc.encode(state, req, nodes)
        assert cand.features.shape == (cand.num_groups, NUM_FEATURES) and cand.features.dtype == np.float32
        assert cand.count.sum() == len(nodes) and (np.bincount(cand.group) == cand.count).all()
        assert (cand.group[cand.rep] == np.arange(cand.num_groups)).all()
        assert np.isfinite(cand.features).all()
        for k, n in enumerate(nodes):
            alone = enc.encode(state, req, np.array([n]))
            assert np.allclose(alone.features[0, node_cols], cand.features[cand.group[k], node_cols], atol=1e-6)
            assert alone.prior[0] == pytest.approx(cand.prior[cand.group[k]])


def unique_by_first_position(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference: np.unique over rows, groups renumbered by their lowest position."""
    _, first, inverse, count = np.unique(rows, axis=0, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.reshape(-1)], count[order]


@pytest.mark.parametrize("seed", range(6))
def test_factorize_is_np_unique_renumbered_by_first_position(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    keys = rng.integers(0, int(rng.integers(1, 60)), size) * 7_919_000_003 - 10**12
    load = rng.choice([-1.0, 0.0, 0.25, 0.5, 0.9], size=(size, 2))
    first, group, count = _factorize(keys)
    for got, want in zip((first, group, count), unique_by_first_position(keys[:, None]), strict=True):
        assert got.dtype == np.int64 and (got == want).all()
    both = np.column_stack([keys.astype(np.float64), load])
    for got, want in zip(_factorize(keys, load), unique_by_first_position(both), strict=True):
        assert (got == want).all()
    assert (np.diff(first) > 0).all() and (group[first] == np.arange(len(first))).all()


def test_interchangeable_nodes_share_a_group_and_cards_map_per_node() -> None:
    nodes = [NodeSpec(f"n{i}", 32_000, 65_536, 4, "T4") for i in range(3)]
    state = ClusterState(nodes)
    share = state.request(PodSpec("s", 1000, 1024, 1, 500))
    state.place(share, 0, (2,))  # node 0 free: [1000, 1000, 500, 1000]
    state.place(share, 1, (0,))  # node 1 free: [500, 1000, 1000, 1000] — the same multiset
    enc = FeatureEncoder(small_typical())
    req = state.request(PodSpec("p", 1000, 1024, 1, 400))
    cand = enc.encode(state, req, np.arange(3))
    assert cand.num_groups == 2 and cand.group[0] == cand.group[1] != cand.group[2]
    cards = enc.node_cards(state, req, cand)
    # the same card *value* on each node of the group, found at that node's own index
    assert state.card_free[0, cards[0]] == state.card_free[1, cards[1]]
    for k in range(3):
        assert enc.cards_at(state, req, cand, k) == (int(cards[k]),)
        assert state.card_free[k, cards[k]] >= 400


def test_load_splits_groups() -> None:
    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(3)])
    enc = FeatureEncoder(small_typical())
    req = state.request(PodSpec("p", 1000, 1024, 1, 1000))
    assert enc.encode(state, req, np.arange(3)).num_groups == 1
    state.load[1] = [0.9, 0.5, 0.0, 0.0]
    cand = enc.encode(state, req, np.arange(3))
    assert cand.num_groups == 2
    assert cand.features[cand.group[1], COL["load_cpu"]] == pytest.approx(0.9)
    assert cand.features[cand.group[1], COL["load_known"]] == 1.0
    assert cand.features[cand.group[0], COL["load_known"]] == 0.0


def test_network_and_disk_load_neither_split_groups_nor_change_rows() -> None:
    """Nodes are grouped on the load the rows show (cpu and memory), the only columns training fills:
    with those unknown and network or disk load fresh, every row, ``groups_frac`` included, is the
    load-unknown one; with cpu known, network and disk still split no group."""
    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(4)])
    enc = FeatureEncoder(small_typical())
    req = state.request(PodSpec("p", 1000, 1024, 1, 1000))
    unknown = enc.encode(state, req, np.arange(4))
    state.load[:, 2] = [0.1, 0.2, 0.3, 0.4]  # network
    state.load[:, 3] = [0.4, 0.3, 0.2, 0.1]  # disk
    cand = enc.encode(state, req, np.arange(4))
    assert cand.num_groups == unknown.num_groups == 1
    assert np.array_equal(cand.features, unknown.features)
    state.load[:, 0] = [0.5, 0.5, 0.5, 0.7]  # cpu
    cand = enc.encode(state, req, np.arange(4))
    assert cand.num_groups == 2 and list(cand.group) == [0, 0, 0, 1]
    assert cand.features[0, COL["groups_frac"]] == pytest.approx(2 / 4)


def test_values_against_the_measures() -> None:
    state = filled_state(2)
    typical = small_typical()
    enc = FeatureEncoder(typical, cpu_weight=0.8)
    fgd = Fragmentation(typical, state.model_names)
    cpu = CpuFragmentation(typical, state.model_names, 0.8)
    for pod, req, nodes in pods_with_candidates(state, 9):
        cand = enc.encode(state, req, nodes)
        reps = nodes[cand.rep]
        pf = fgd.placement(state, req, reps)
        _, _, cdelta = cpu.placement(state, req, reps)
        x = cand.features
        assert np.allclose(x[:, COL["fgd_delta"]], pf.delta / 1000, atol=1e-5)
        assert np.allclose(x[:, COL["fgd_score"]], pf.score / 100, atol=1e-6)
        assert np.allclose(x[:, COL["fgdcpu_delta"]], cdelta / 1000, atol=1e-5)
        assert np.allclose(cand.prior, cdelta / 1000)
        assert np.allclose(x[:, COL["pod_cpu"]], pod.cpu_milli / 128_000)
        assert np.allclose(x[:, COL["cpu_free"]], state.cpu_free[reps] / 128_000)
        assert np.allclose(x[:, COL["card_free_0"]], state.card_free[reps].max(axis=1) / 1000)
        assert np.allclose(
            x[:, COL["gpu_left_total"]], (state.card_free[reps].sum(axis=1) - req.gpu_total) / 8000, atol=1e-6
        )
        assert np.allclose(x[:, COL["cluster_gpu_alloc"]], state.gpu_milli_allocated / state.gpu_milli_capacity)
        assert np.allclose(x[:, COL["feasible_frac"]], len(nodes) / state.num_nodes)


def node_and_after_columns(state: ClusterState, req, reps: np.ndarray, share_card: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The node and after-placing columns written as plain numpy (what the encoder's kernel replaces)."""

    def per_card(amount: np.ndarray, free: np.ndarray, scale: float) -> np.ndarray:
        return np.where(free > 0, np.minimum(amount / np.maximum(free, 1) / scale, 4.0), 4.0)

    cpu, mem = state.cpu_free[reps].astype(np.float64), state.mem_free[reps].astype(np.float64)
    cards = state.card_free[reps]
    total = cards.sum(axis=1).astype(np.float64)
    full = state.full_free[reps].astype(np.float64)
    ordered = np.zeros((len(reps), 8))
    slots = min(8, cards.shape[1])
    ordered[:, :slots] = -np.sort(-cards, axis=1)[:, :slots] / 1000
    cpu_left, mem_left = cpu - req.cpu_milli, mem - req.memory_mib
    if req.is_share:
        on_card = cards[np.arange(len(reps)), share_card]
        full_after, card_left = full - (on_card == 1000), (on_card - req.gpu_milli) / 1000
    else:
        full_after, card_left = full - req.num_gpu, np.zeros(len(reps))
    gpu_left = total - req.gpu_total
    columns = [
        cpu / 128_000,
        cpu / state.cpu_cap[reps],
        mem / 1_048_576,
        mem / state.mem_cap[reps],
        state.gpu_count[reps] / 8.0,
        full / 8.0,
        total / 8000,
        *ordered.T,
        per_card(cpu, full, 32_000),
        per_card(mem, full, 131_072),
        cpu_left / 128_000,
        cpu_left / state.cpu_cap[reps],
        mem_left / state.mem_cap[reps],
        gpu_left / 8000,
        full_after / 8.0,
        card_left,
        per_card(cpu_left, full_after, 32_000),
        per_card(mem_left, full_after, 131_072),
        0.5 * cpu_left / 128_000 + 0.5 * gpu_left / 8000,
    ]
    return np.column_stack(columns).astype(np.float32)


@pytest.mark.parametrize("seed", range(3))
def test_node_and_after_columns_are_the_numpy_expressions_bit_for_bit(seed: int) -> None:
    state = filled_state(seed)
    typical = small_typical()
    enc = FeatureEncoder(typical)
    cpu = CpuFragmentation(typical, state.model_names)
    first, last = FEATURES.index("cpu_free"), FEATURES.index("bestfit_left") + 1
    shares = 0
    for _, req, nodes in pods_with_candidates(state, seed + 20, 60):
        cand = enc.encode(state, req, nodes)
        reps = nodes[cand.rep]
        _, share_card, _ = cpu.placement(state, req, reps)
        want = node_and_after_columns(state, req, reps, share_card)
        assert cand.features[:, first:last].tobytes() == want.tobytes()
        if req.is_share:
            shares += 1
            assert (cand.card_free == state.card_free[reps, share_card]).all()
        else:
            assert (cand.card_free == -1).all()
    assert shares >= 5


def test_node_keys_follow_node_versions() -> None:
    state = filled_state(0, fills=5)
    keys = node_keys(state).copy()
    n = int(np.flatnonzero(state.card_free[:, 0] == 1000)[0])
    state.place(state.request(PodSpec("x", 1000, 0, 1, 1000)), n, (0,))
    after = node_keys(state)
    assert after[n] != keys[n]
    others = np.arange(state.num_nodes) != n
    assert (after[others] == keys[others]).all()


def test_qos_columns_and_groups_only_with_use_qos() -> None:
    from rlsched.policy.features import QOS_POD_CAP

    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(3)])
    for spec, node in ((PodSpec("ls", 100, 64, qos="LS"), 1), (PodSpec("be", 100, 64, qos="BE"), 2)):
        state.place(state.request(spec), node, ())
    req = state.request(PodSpec("p", 100, 64, 1, 1000, qos="Guaranteed"))
    plain = FeatureEncoder(small_typical()).encode(state, req, np.arange(3))
    assert plain.features[:, COL["pod_latency_sensitive"] : COL["node_other_pods"] + 1].sum() == 0
    cand = FeatureEncoder(small_typical(), use_qos=True).encode(state, req, np.arange(3))
    assert cand.num_groups == 3 and plain.num_groups == 2  # nodes 1 and 2 differ only in their pods' classes
    rows = cand.features[cand.group]
    assert rows[:, COL["pod_latency_sensitive"]].tolist() == [1.0, 1.0, 1.0]
    assert rows[:, COL["node_ls_pods"]].tolist() == [0.0, 1 / QOS_POD_CAP, 0.0]
    assert rows[:, COL["node_other_pods"]].tolist() == [0.0, 0.0, 1 / QOS_POD_CAP]
    # nodes equal in everything but their QoS counts: one group without QoS, two with
    twin = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 2, "T4") for i in range(2)])
    twin.place(twin.request(PodSpec("ls", 100, 64, qos="LS")), 0, ())
    twin.place(twin.request(PodSpec("be", 100, 64, qos="BE")), 1, ())
    assert FeatureEncoder(small_typical()).encode(twin, req, np.arange(2)).num_groups == 1
    assert FeatureEncoder(small_typical(), use_qos=True).encode(twin, req, np.arange(2)).num_groups == 2
