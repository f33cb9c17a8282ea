"""Random: a uniformly random feasible node (the FGD paper's weakest baseline)."""
from __future__ import annotations

import numpy as np

from ..cluster import ClusterState, PodRequest
from .base import NodeScores, Scorer, TieBreak


class RandomScorer(Scorer):
    """Every feasible node scores the same; the choice is uniform over them."""

    name = "random"

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        return NodeScores(np.zeros(len(nodes), dtype=np.int64))

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        return int(tiebreak.rng.integers(len(nodes)))
