"""Random: a uniformly random feasible node and, for a share pod, a uniformly random fitting card.

The FGD paper's weakest baseline (its artifact runs Random with random GPU selection).
"""

from __future__ import annotations

import numpy as np

from ..cards import default_cards
from ..cluster import ClusterState, PodRequest
from .base import NodeScores, Scorer, TieBreak


class RandomScorer(Scorer):
    """Every feasible node scores the same; the choice is uniform over them."""

    name = "random"

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        return NodeScores(np.zeros(len(nodes), dtype=np.int64))

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        return int(tiebreak.rng.integers(len(nodes)))

    def cards(
        self,
        state: ClusterState,
        req: PodRequest,
        node: int,
        position: int,
        scores: NodeScores | None,
        tiebreak: TieBreak,
    ) -> tuple[int, ...]:
        if not req.is_share:
            return default_cards(state, req, node)
        fitting = np.flatnonzero(state.card_free[node, : state.gpu_count[node]] >= req.gpu_milli)
        return (int(fitting[tiebreak.rng.integers(len(fitting))]),)
