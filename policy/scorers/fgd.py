"""FGD: place the pod where it increases GPU fragmentation the least (Weng et al., USENIX ATC'23).

``score = int(100·sigmoid((Frag_before − Frag_after) / 1000))`` with the fragmentation measure of
:mod:`rlsched.policy.fragmentation` over the typical-pod distribution. For a share pod every fitting
card is tried and the first card with the best score is the one the pod gets.
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterState, PodRequest
from ..fragmentation import Fragmentation, for_models
from ..typical import TypicalPods
from .base import NodeScores, Scorer


class FgdScorer(Scorer):
    name = "fgd"

    def __init__(self, typical: TypicalPods):
        self.typical = typical
        self._frag: dict[tuple[str, ...], Fragmentation] = {}

    def fragmentation(self, state: ClusterState) -> Fragmentation:
        """The fragmentation measure for this cluster's GPU models (one per model vocabulary)."""
        return for_models(self._frag, state.model_names, lambda: Fragmentation(self.typical, state.model_names))

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        result = self.fragmentation(state).placement(state, req, nodes)
        return NodeScores(result.score, result.card if req.is_share else None)
