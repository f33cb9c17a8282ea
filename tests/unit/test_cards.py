"""The default card rule: tightest fitting card for share pods, lowest-index free cards for whole-card pods."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec, default_cards, tightest_card


def with_free(rows: list[list[int]]) -> ClusterState:
    """Nodes of len(row) cards with the given free milli per card (made with place())."""
    state = ClusterState([NodeSpec(f"n{i}", 64000, 64000, len(row), "V100") for i, row in enumerate(rows)])
    for n, row in enumerate(rows):
        for c, free in enumerate(row):
            if free < 1000:
                state.place(state.request(PodSpec(f"u{n}{c}", 0, 0, 1, 1000 - free)), n, (c,))
    return state


@pytest.mark.parametrize(
    "row, milli, card",
    [
        ([1000, 300, 600, 300], 250, 1),  # least free that fits; lowest index among the two 300s
        ([1000, 300, 600, 300], 400, 2),
        ([1000, 300, 600, 300], 700, 0),
        ([1000, 300, 600, 300], 1000, 0),  # a whole card's worth only fits a free card
        ([200, 100, 150, 0], 300, -1),  # nothing fits
        ([500, 500], 500, 0),  # exact fit, tie → lowest index
    ],
)
def test_tightest_card(row, milli, card) -> None:
    state = with_free([row])
    req = state.request(PodSpec("p", 0, 0, 1, milli) if milli < 1000 else PodSpec("p", 0, 0, 1, 1000))
    assert tightest_card(state, req, np.array([0])).tolist() == [card]


def test_tightest_card_is_vectorized_over_nodes_and_ignores_missing_cards() -> None:
    # Node 1 has 2 cards in a 4-column layout: its missing columns hold 0 and can never be picked.
    state = with_free([[1000, 400, 1000, 1000], [700, 1000], [100, 100, 100, 100]])
    req = state.request(PodSpec("p", 0, 0, 1, 350))
    assert tightest_card(state, req, np.array([2, 0, 1])).tolist() == [-1, 1, 0]


def test_default_cards_share_and_cpu() -> None:
    state = with_free([[1000, 300, 600, 300]])
    assert default_cards(state, state.request(PodSpec("s", 0, 0, 1, 250)), 0) == (1,)
    assert default_cards(state, state.request(PodSpec("c", 100, 100)), 0) == ()
    full = with_free([[900, 0]])
    with pytest.raises(ValueError, match="no card with 999 milli free"):
        default_cards(full, full.request(PodSpec("s", 0, 0, 1, 999)), 0)


def test_default_cards_whole_takes_lowest_free_indices() -> None:
    state = with_free([[500, 1000, 0, 1000, 1000, 1000]])
    assert default_cards(state, state.request(PodSpec("w", 0, 0, 1, 1000)), 0) == (1,)
    assert default_cards(state, state.request(PodSpec("w", 0, 0, 3, 1000)), 0) == (1, 3, 4)
    assert default_cards(state, state.request(PodSpec("w", 0, 0, 4, 1000)), 0) == (1, 3, 4, 5)
    with pytest.raises(ValueError, match=r"4 free card\(s\), pod needs 5"):
        default_cards(state, state.request(PodSpec("w", 0, 0, 5, 1000)), 0)


def test_default_cards_never_beyond_gpu_count() -> None:
    state = ClusterState([NodeSpec("two", 8000, 8000, 2, "T4"), NodeSpec("eight", 8000, 8000, 8, "T4")])
    whole = state.request(PodSpec("w", 0, 0, 2, 1000))
    assert default_cards(state, whole, 0) == (0, 1)
    state.place(whole, 0, (0, 1))
    with pytest.raises(ValueError):
        default_cards(state, whole, 0)
    with pytest.raises(ValueError):
        default_cards(state, state.request(PodSpec("s", 0, 0, 1, 1)), 0)
    # The chosen cards are always accepted by place().
    share = state.request(PodSpec("s", 0, 0, 1, 10))
    cards = default_cards(state, share, 1)
    assert cards == (0,) and state.place(share, 1, cards).cards == (0,)
