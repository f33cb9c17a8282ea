"""GpuPacking: fill partly used cards first, then free cards on used nodes, then empty nodes.

With ``n_free`` completely free cards on a node of ``n`` cards:

- all cards free: ``max(33 − n_free, n_free)`` (prefer small empty nodes);
- a whole-card pod asking ``k`` cards on a used node: ``max(50 − k, 33)``;
- a share pod: its tightest fitting card; if that card is completely free ``max(50 − 1, 33) = 49``,
  otherwise ``max(100 − (free·100 // 1000) // 10, 50)`` (fuller cards score higher).

CPU-only pods score 0 everywhere.
"""

from __future__ import annotations

import numpy as np

from ..cards import tightest_card
from ..cluster import ClusterState, PodRequest
from ..resources import MILLI_PER_CARD
from .base import MAX_NODE_SCORE, NodeScores, Scorer


class GpuPackingScorer(Scorer):
    name = "gpupacking"

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        k = len(nodes)
        if not req.is_gpu:
            return NodeScores(np.zeros(k, dtype=np.int64))
        n_cards = state.gpu_count[nodes]
        n_free = state.full_free[nodes]
        empty_node = np.maximum(MAX_NODE_SCORE // 3 - n_free, n_free)
        if req.is_share:
            card = tightest_card(state, req, nodes)
            free = state.card_free[nodes, np.maximum(card, 0)]
            on_free_card = max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3)
            on_used_card = np.maximum(MAX_NODE_SCORE - (free * 100 // MILLI_PER_CARD) // 10, MAX_NODE_SCORE // 2)
            used_node = np.where(free == MILLI_PER_CARD, on_free_card, on_used_card)
        else:
            used_node = np.full(k, max(MAX_NODE_SCORE // 2 - req.num_gpu, MAX_NODE_SCORE // 3), dtype=np.int64)
        return NodeScores(np.where(n_free == n_cards, empty_node, used_node).astype(np.int64))
