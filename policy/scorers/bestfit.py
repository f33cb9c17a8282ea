"""BestFit: prefer the node with the least cpu and GPU left after placing the pod.

``100·(1 − (0.5·(cpu_left − pod_cpu)/128000 + 0.5·(gpu_free − pod_gpu)/8000))`` truncated, then
min-max normalized over the feasible nodes (integer arithmetic, as the FGD simulator does).
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterState, PodRequest, nonzero_cpu
from .base import MAX_NODE_SCORE, NodeScores, Scorer, normalize_min_max
from .dotprod import MAX_SPEC_CPU, MAX_SPEC_GPU


class BestFitScorer(Scorer):
    name = "bestfit"

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        cpu_rest = state.cpu_free[nodes] - nonzero_cpu(req.cpu_milli)
        gpu_rest = state.card_free[nodes].sum(axis=1) - req.gpu_total
        left = cpu_rest / MAX_SPEC_CPU * 0.5 + gpu_rest / MAX_SPEC_GPU * 0.5
        raw = ((1.0 - left) * MAX_NODE_SCORE).astype(np.int64)
        return NodeScores(normalize_min_max(raw))
