"""ClusterState.hold, which counts a nominated pod that does not fit yet in a trial copy, and a card
index place must refuse on a node with the widest card row."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec
from rlsched.policy.cluster import COUNT_LIMIT, MIB


def state() -> ClusterState:
    return ClusterState([NodeSpec("g", 8000, 16384, 4, "V100"), NodeSpec("cpu", 16000, 32768)])


def test_a_whole_card_hold_takes_as_many_free_cards_as_the_pod_asks() -> None:
    s = state()
    s.hold(s.request(PodSpec("n", 20000, 0, 2, 1000)), 0)  # short of cpu: held, not placed
    assert s.card_free[0].tolist() == [0, 0, 1000, 1000] and s.full_free[0] == 2
    assert int(s.cpu_free[0]) == 8000 - 20000


def test_a_share_hold_takes_its_share_of_every_card() -> None:
    s = state()
    s.place(s.request(PodSpec("r", 0, 0, 1, 500)), 0, (1,))
    s.hold(s.request(PodSpec("n", 20000, 0, 1, 600)), 0)
    assert s.card_free[0].tolist() == [400, 0, 400, 400]


def test_a_hold_counts_the_pod_on_its_node() -> None:
    s = state()
    s.hold(s.request(PodSpec("n", 20000, 0, 2, 1000)), 0)
    assert s.pods.tolist() == [1, 0] and s.gpu_pods.tolist() == [1, 0] and s.kind_count[0, 2] == 1
    assert s.node_version[0] == 1


def test_a_hold_past_what_a_node_can_count_is_refused_without_a_change() -> None:
    s = state()
    s.nonzero_mem_used_bytes[1] = COUNT_LIMIT - MIB // 2  # pods of a flood already counted there
    before = s.mem_free.copy(), s.nonzero_mem_used_bytes.copy()
    with pytest.raises(ValueError, match="more than can be counted"):
        s.hold(s.request(PodSpec("n", 0, 1)), 1)
    np.testing.assert_array_equal(s.mem_free, before[0])
    np.testing.assert_array_equal(s.nonzero_mem_used_bytes, before[1])


def test_place_refuses_a_negative_card_on_a_node_with_the_widest_card_row() -> None:
    s = state()
    with pytest.raises(ValueError, match="card -1"):
        s.place(s.request(PodSpec("p", 0, 0, 1, 500)), 0, (-1,))
    assert s.card_free[0].tolist() == [1000] * 4
