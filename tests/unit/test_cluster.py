"""The cluster model: specs, requests, place / release / copy and the per-node version counter."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec, default_cards, pod_request_problem
from rlsched.policy.cluster import COUNT_LIMIT, DEFAULT_MEMORY_REQUEST_BYTES, MIB, MUTABLE_ARRAYS, packed_copies
from rlsched.policy.resources import MEMORY_MIB_LIMIT, QUANTITY_LIMIT

NODES = [
    NodeSpec("v100", 32000, 65536, 4, "V100"),
    NodeSpec("cpu", 16000, 32768),
    NodeSpec("t4", 8000, 16384, 2, "T4"),
]


def snapshot(state: ClusterState) -> dict[str, np.ndarray]:
    return {name: getattr(state, name).copy() for name in MUTABLE_ARRAYS}


def assert_same(state: ClusterState, before: dict[str, np.ndarray], skip: tuple[str, ...] = ()) -> None:
    for name, value in before.items():
        if name in skip:
            continue
        np.testing.assert_array_equal(getattr(state, name), value, err_msg=name)


# -- specs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cpu_milli": -1}, "must not be negative"),
        ({"memory_mib": -1}, "must not be negative"),
        ({"gpu_count": -1}, "must not be negative"),
        ({"gpu_count": 2}, "no GPU model"),
        ({"price": -0.5}, "price"),
    ],
)
def test_node_spec_rejects(kwargs, message) -> None:
    args = {"name": "n", "cpu_milli": 1000, "memory_mib": 1000} | kwargs
    with pytest.raises(ValueError, match=message) as info:
        NodeSpec(**args)
    assert "'n'" in str(info.value)


@pytest.mark.parametrize(
    "cpu, mem, num, milli, problem",
    [
        (1000, 1000, 0, 0, None),
        (1000, 1000, 1, 500, None),
        (1000, 1000, 1, 1000, None),
        (1000, 1000, 8, 1000, None),
        (-1, 0, 0, 0, "cpu and memory must not be negative"),
        (0, -1, 0, 0, "cpu and memory must not be negative"),
        (0, 0, -1, 0, "num_gpu must not be negative"),
        (0, 0, 0, 500, "gpu_milli is 500 but num_gpu is 0"),
        (0, 0, 1, 0, "gpu_milli must be in 1..1000"),
        (0, 0, 1, 1001, "gpu_milli must be in 1..1000"),
        (0, 0, 2, 500, "must take whole cards"),
    ],
)
def test_pod_request_problem(cpu, mem, num, milli, problem) -> None:
    got = pod_request_problem(cpu, mem, num, milli)
    if problem is None:
        assert got is None
        PodSpec("ok", cpu, mem, num, milli)
    else:
        assert got is not None and problem in got
        with pytest.raises(ValueError, match="'bad'"):
            PodSpec("bad", cpu, mem, num, milli)


def test_pod_spec_properties() -> None:
    share = PodSpec("s", 1000, 1000, 1, 300)
    whole = PodSpec("w", 1000, 1000, 3, 1000)
    one = PodSpec("o", 1000, 1000, 1, 1000)
    cpu = PodSpec("c", 1000, 1000)
    assert (share.is_share, whole.is_share, one.is_share, cpu.is_share) == (True, False, False, False)
    assert (share.gpu_request_milli, whole.gpu_request_milli, one.gpu_request_milli, cpu.gpu_request_milli) == (
        300,
        3000,
        1000,
        0,
    )


# -- ClusterState construction ---------------------------------------------------------------------


def test_state_layout() -> None:
    state = ClusterState(NODES)
    assert state.num_nodes == 3
    assert state.model_names == ("T4", "V100")  # sorted
    assert state.model_id.tolist() == [1, -1, 0]  # CPU-only node is -1
    assert state.max_cards == 4
    assert state.card_exists.tolist() == [[True] * 4, [False] * 4, [True, True, False, False]]
    assert state.card_free.tolist() == [[1000] * 4, [0] * 4, [1000, 1000, 0, 0]]
    assert state.full_free.tolist() == [4, 0, 2]
    assert state.max_card_free.tolist() == [1000, 0, 1000]
    assert state.gpu_milli_capacity == 6000
    assert state.gpu_milli_allocated == 0
    assert state.index == {"v100": 0, "cpu": 1, "t4": 2}


def test_cpu_only_cluster_has_one_card_column() -> None:
    state = ClusterState([NodeSpec("a", 1000, 1000)])
    assert state.max_cards == 1 and state.card_free.tolist() == [[0]] and state.gpu_milli_capacity == 0


def test_state_rejects_empty_and_duplicates() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        ClusterState([])
    with pytest.raises(ValueError, match="duplicate node names: a"):
        ClusterState([NodeSpec("a", 1, 1), NodeSpec("b", 1, 1), NodeSpec("a", 2, 2)])


def test_request_model_mask() -> None:
    state = ClusterState(NODES)
    any_gpu = state.request(PodSpec("p", 0, 0, 1, 500))
    assert any_gpu.model_ok.tolist() == [True, True, False] and not any_gpu.constrained
    v100 = state.request(PodSpec("p", 0, 0, 1, 500, ("V100",)))
    assert v100.model_ok.tolist() == [False, True, False] and v100.constrained
    absent = state.request(PodSpec("p", 0, 0, 1, 500, ("A100",)))
    assert absent.model_ok.tolist() == [False, False, False]
    cpu = state.request(PodSpec("p", 100, 0, 0, 0, ("V100",)))  # a model list on a CPU pod means nothing
    assert cpu.model_ok.tolist() == [True, True, True] and not cpu.constrained
    assert (any_gpu.kind, state.request(PodSpec("p", 0, 0, 3, 1000)).kind, cpu.kind) == (0, 3, -1)


# -- place -----------------------------------------------------------------------------------------


def test_place_updates_every_array() -> None:
    state = ClusterState(NODES)
    req = state.request(PodSpec("p", 4000, 8192, 1, 300))
    placement = state.place(req, 0, (2,))
    assert (placement.node, placement.cards, placement.milli_per_card, placement.kind) == (0, (2,), 300, 0)
    assert state.cpu_free.tolist() == [28000, 16000, 8000]
    assert state.mem_free.tolist() == [65536 - 8192, 32768, 16384]
    assert state.card_free[0].tolist() == [1000, 1000, 700, 1000]
    assert state.full_free[0] == 3 and state.max_card_free[0] == 1000
    assert state.kind_count[0].tolist() == [1, 0, 0, 0, 0] and state.gpu_pods.tolist() == [1, 0, 0]
    assert state.nonzero_cpu_used[0] == 4000 and state.nonzero_mem_used_bytes[0] == 8192 * MIB
    assert state.node_version.tolist() == [1, 0, 0]
    assert state.gpu_milli_allocated == 300

    whole = state.request(PodSpec("w", 0, 0, 2, 1000))
    state.place(whole, 2, (0, 1))
    assert state.full_free[2] == 0 and state.max_card_free[2] == 0 and state.kind_count[2, 2] == 1
    # A pod without cpu/memory requests counts Kubernetes' defaults in the nonzero columns only.
    assert state.cpu_free[2] == 8000 and state.nonzero_cpu_used[2] == 100
    assert state.nonzero_mem_used_bytes[2] == DEFAULT_MEMORY_REQUEST_BYTES
    assert state.node_version.tolist() == [1, 0, 1]


@pytest.mark.parametrize(
    "spec, node, cards, message",
    [
        (PodSpec("p", 40000, 0), 0, (), "not enough cpu or memory"),  # cpu oversubscribed
        (PodSpec("p", 0, 70000), 0, (), "not enough cpu or memory"),  # memory oversubscribed
        (PodSpec("p", 0, 0, 2, 1000), 0, (0,), r"asks for 2 card\(s\), got 1"),  # too few cards
        (PodSpec("p", 0, 0, 1, 500), 0, (0, 1), r"asks for 1 card\(s\), got 2"),  # too many cards
        (PodSpec("p", 0, 0), 0, (0,), r"asks for 0 card\(s\), got 1"),  # CPU pod with a card
        (PodSpec("p", 0, 0, 2, 1000), 0, (1, 1), "card ids repeat"),
        (PodSpec("p", 0, 0, 1, 500), 2, (2,), "card 2 has not 500 milli free"),  # beyond gpu_count
        (PodSpec("p", 0, 0, 1, 500), 2, (-1,), "card -1"),
        (PodSpec("p", 0, 0, 1, 500), 1, (0,), "card 0"),  # CPU-only node
        (PodSpec("p", 0, 0, 1, 500, ("T4",)), 0, (0,), "GPU model not allowed"),
    ],
)
def test_place_rejects_without_changing_state(spec, node, cards, message) -> None:
    state = ClusterState(NODES)
    before = snapshot(state)
    with pytest.raises(ValueError, match=message):
        state.place(state.request(spec), node, cards)
    assert_same(state, before)


def test_place_rejects_card_without_enough_milli() -> None:
    state = ClusterState(NODES)
    state.place(state.request(PodSpec("a", 0, 0, 1, 700)), 0, (0,))
    before = snapshot(state)
    with pytest.raises(ValueError, match="card 0 has not 400 milli free"):
        state.place(state.request(PodSpec("b", 0, 0, 1, 400)), 0, (0,))
    with pytest.raises(ValueError, match="card 0 has not 1000 milli free"):  # whole card on a shared card
        state.place(state.request(PodSpec("c", 0, 0, 2, 1000)), 0, (0, 1))
    assert_same(state, before)
    state.place(state.request(PodSpec("d", 0, 0, 1, 300)), 0, (0,))  # exactly what is left fits
    assert state.card_free[0, 0] == 0


# -- release ---------------------------------------------------------------------------------------


def test_release_restores_state_exactly() -> None:
    rng = np.random.default_rng(7)
    state = ClusterState(NODES)
    before = snapshot(state)
    specs = [
        PodSpec("a", 1000, 2048, 1, 300),
        PodSpec("b", 0, 0, 2, 1000),
        PodSpec("c", 500, 0),
        PodSpec("d", 0, 512, 1, 650),
        PodSpec("e", 2000, 1024, 1, 1000),
        PodSpec("f", 0, 0, 1, 50),
    ]
    placements = []
    for spec in specs:
        req = state.request(spec)
        node = 0 if spec.num_gpu else 1
        placements.append(state.place(req, node, default_cards(state, req, node)))
    assert state.gpu_milli_allocated == 300 + 2000 + 650 + 1000 + 50 == state.gpu_milli_capacity - 2000
    for i in rng.permutation(len(placements)):  # any order
        state.release(placements[i])
    assert_same(state, before, skip=("node_version",))
    # Every change bumped the node's version: 5 GPU pods on node 0 placed and released, 1 on node 1.
    assert state.node_version.tolist() == [10, 2, 0]


@pytest.mark.parametrize(
    "spec, node",
    [
        (PodSpec("gpu", 1000, 1000, 1, 500), 0),
        (PodSpec("cpu", 1000, 1000), 1),
        (PodSpec("mem-only", 0, 1000), 1),  # nothing but memory: the double release must still be caught
        (PodSpec("best-effort", 0, 0), 1),  # no request at all (it still counts 100m in the nonzero columns)
    ],
)
def test_double_release_is_rejected_and_harmless(spec, node) -> None:
    state = ClusterState(NODES)
    req = state.request(spec)
    placement = state.place(req, node, default_cards(state, req, node))
    state.release(placement)
    after_one = snapshot(state)
    with pytest.raises(ValueError, match="released more than was placed"):
        state.release(placement)
    assert_same(state, after_one)


# -- copy and versions -----------------------------------------------------------------------------


def test_copy_is_independent() -> None:
    state = ClusterState(NODES)
    state.place(state.request(PodSpec("a", 1000, 1000, 1, 500)), 0, (1,))
    state.load[0, 0] = 0.5
    state.caches["x"] = object()
    before = snapshot(state)
    other = state.copy()
    assert other.caches == {}
    for name in MUTABLE_ARRAYS:
        assert not np.shares_memory(getattr(other, name), getattr(state, name)), name
    req = other.request(PodSpec("b", 2000, 2000, 2, 1000))
    other.place(req, 0, default_cards(other, req, 0))
    other.load[1, 1] = 0.25
    assert_same(state, before)
    assert "x" in state.caches
    assert other.card_free[0].tolist() == [0, 500, 0, 1000] and state.card_free[0].tolist() == [1000, 500, 1000, 1000]
    assert other.nodes is state.nodes  # immutable specs are shared


def test_node_version_moves_only_for_the_changed_node() -> None:
    state = ClusterState(NODES)
    req = state.request(PodSpec("c", 100, 100))
    p = state.place(req, 1, ())
    assert state.node_version.tolist() == [0, 1, 0]
    state.release(p)
    assert state.node_version.tolist() == [0, 2, 0]


def test_pods_and_latency_sensitive_pods_are_counted_per_node() -> None:
    state = ClusterState(NODES)
    ls = state.request(PodSpec("ls", 1000, 1024, qos="LS"))
    guaranteed = state.request(PodSpec("g", 1000, 1024, 1, 500, qos="Guaranteed"))
    be = state.request(PodSpec("be", 1000, 1024, qos="BE"))
    assert ls.latency_sensitive and guaranteed.latency_sensitive and not be.latency_sensitive
    placed = [state.place(r, 0, default_cards(state, r, 0)) for r in (ls, guaranteed, be)]
    placed.append(state.place(be, 1, ()))
    assert state.pods.tolist()[:2] == [3, 1] and state.ls_pods.tolist()[:2] == [2, 0]
    assert [p.latency_sensitive for p in placed] == [True, True, False, False]
    state.release(placed[0])
    assert state.pods[0] == 2 and state.ls_pods[0] == 1
    with pytest.raises(ValueError, match="released more"):
        state.release(placed[3].__class__(**{**placed[3].__dict__, "latency_sensitive": True}))  # node 1 runs no LS pod
    assert state.pods[1] == 1 and state.ls_pods[1] == 0


def test_packed_copies_are_equal_fresh_strings_in_order():
    names = [f"node-{i}" for i in range(50)] + [""]
    copies = packed_copies(names)
    assert copies == names
    assert all(c is not n for c, n in zip(copies[:-1], names[:-1], strict=True))


def test_packed_copies_keep_names_that_hold_the_separator():
    names = ["a\0b", "c"]
    assert packed_copies(names) == names


def test_state_index_maps_every_name_after_packing():
    state = ClusterState([NodeSpec(f"n{i}", 4000, 8192, 1, "A100") for i in range(5)])
    assert [state.index[n] for n in ["n3", "n0", "n4"]] == [3, 0, 4]
    assert state.names == tuple(f"n{i}" for i in range(5))


def test_overcommitted_totals_stop_short_of_int64_and_release_exactly() -> None:
    """Running pods are counted whatever they ask, and a request reads as up to 2**53: 1,024 of the
    largest on one node wrapped its totals round (numpy warned, then the node read as nearly empty).
    Past COUNT_LIMIT a pod is refused instead; what was counted releases exactly."""
    state = ClusterState(NODES)
    before = snapshot(state)
    largest = PodSpec("huge", QUANTITY_LIMIT, MEMORY_MIB_LIMIT)
    placed, refused = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an int64 overflow warns
        for _ in range(1100):
            req = state.request(largest)
            try:
                placed.append(state.place(req, 1, (), overcommit=True))
            except ValueError as exc:
                assert "more than can be counted" in str(exc)
                refused += 1
        assert len(placed) == COUNT_LIMIT // QUANTITY_LIMIT == 512 and refused == 1100 - 512
        assert -COUNT_LIMIT <= int(state.cpu_free[1]) < 0 and -COUNT_LIMIT <= int(state.mem_free[1]) * MIB < 0
        assert (
            0 < int(state.nonzero_cpu_used[1]) <= COUNT_LIMIT
            and 0 < int(state.nonzero_mem_used_bytes[1]) <= COUNT_LIMIT
        )
        assert state.short_of_cpu_or_memory(state.request(PodSpec("small", 100, 100)), 1)
        small = state.place(state.request(PodSpec("nothing", 0, 0)), 1, ())  # fits anywhere; counted as 100m, 200 MB
        for p in [*placed, small]:
            state.release(p)
    assert_same(state, before, skip=("node_version",))


def test_the_cluster_cpu_feature_does_not_wrap_when_nodes_are_overcommitted_to_the_limit() -> None:
    """Each node's free cpu stops at −2**62, but three such nodes wrapped the int64 sum round: the
    model's ``cluster_cpu_free`` read a huge free cluster instead of a hopelessly overcommitted one."""
    from rlsched.policy.features import cluster_fill

    state = ClusterState([NodeSpec(f"n{i}", 32000, 65536, 4, "V100") for i in range(3)])
    huge = PodSpec("huge", QUANTITY_LIMIT, 1000)
    for node in range(3):
        for _ in range(COUNT_LIMIT // QUANTITY_LIMIT):
            state.place(state.request(huge), node, (), overcommit=True)
    assert cluster_fill(state)[2] < -1e12
