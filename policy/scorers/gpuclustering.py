"""GpuClustering: keep GPU pods of one kind together (share pods with share pods, k-card pods with k-card pods).

``25·(8000 − gpu_free) // 8000`` plus 75 if the node hosts only pods of the pod's kind, 50 if it hosts
that kind among others, 25 if it hosts no GPU pod at all, 0 otherwise. CPU-only pods score 0.
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterState, PodRequest
from .base import NodeScores, Scorer

MAX_SPEC_GPU_MILLI = 8000


class GpuClusteringScorer(Scorer):
    name = "gpuclustering"

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        k = len(nodes)
        if not req.is_gpu:
            return NodeScores(np.zeros(k, dtype=np.int64))
        gpu_free = state.card_free[nodes].sum(axis=1)
        base = 25 * (MAX_SPEC_GPU_MILLI - gpu_free) // MAX_SPEC_GPU_MILLI
        same = state.kind_count[nodes, req.kind]
        total = state.gpu_pods[nodes]
        bonus = np.select([(total > 0) & (same == total), same > 0, total == 0], [75, 50, 25], default=0)
        return NodeScores((base + bonus).astype(np.int64))
