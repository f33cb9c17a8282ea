"""Which card(s) of a node a pod gets — an explicit decision, not a side effect of scoring.

The default rule (used by every policy except FGD, which picks the share card that leaves the
least fragmentation): a share pod takes the fitting card with the least free milli (lowest index on
ties), a whole-card pod takes the lowest-index completely free cards.
"""

from __future__ import annotations

import numpy as np

from .cluster import ClusterState, PodRequest
from .resources import MILLI_PER_CARD


def tightest_card(state: ClusterState, req: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """For a share pod: per node in ``nodes``, the fitting card with the least free milli (-1 if none)."""
    free = state.card_free[nodes]
    fits = free >= req.gpu_milli
    # Cards that do not fit get a key above any real card; argmin takes the lowest index on ties.
    key = np.where(fits, free, MILLI_PER_CARD + 1)
    best = key.argmin(axis=1)
    return np.where(fits.any(axis=1), best, -1)


def default_cards(state: ClusterState, req: PodRequest, node: int) -> tuple[int, ...]:
    """The default card choice on ``node`` (see the module docstring); () for CPU-only pods."""
    if not req.is_gpu:
        return ()
    row = state.card_free[node]
    if req.is_share:
        card = int(tightest_card(state, req, np.array([node]))[0])
        if card < 0:
            raise ValueError(f"node {state.names[node]}: no card with {req.gpu_milli} milli free")
        return (card,)
    free_cards = np.flatnonzero(row[: state.gpu_count[node]] == MILLI_PER_CARD)
    if len(free_cards) < req.num_gpu:
        raise ValueError(f"node {state.names[node]}: {len(free_cards)} free card(s), pod needs {req.num_gpu}")
    return tuple(int(c) for c in free_cards[: req.num_gpu])
