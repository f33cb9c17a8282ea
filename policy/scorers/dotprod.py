"""DotProduct (Tetris): prefer the node whose free vector is least aligned with the pod's request.

``score = int(100·(1 − (cpu_left/128000 · pod_cpu/128000 + gpu_free/8000 · pod_gpu/8000) / 2))``
with the node's free cpu and total free GPU milli, and the pod's non-zero cpu request and total GPU
milli, normalized by the largest node spec (128 cores, 8 cards). 0 where the cpu does not fit.
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterState, PodRequest, nonzero_cpu
from .base import MAX_NODE_SCORE, NodeScores, Scorer

MAX_SPEC_CPU = 128_000.0
"""Largest node cpu in the FGD simulator (millicores), used to normalize."""
MAX_SPEC_GPU = 8_000.0
"""Largest node GPU capacity (milli), used to normalize."""


class DotProductScorer(Scorer):
    name = "dotprod"

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        pod_cpu = nonzero_cpu(req.cpu_milli)
        cpu_left = state.cpu_free[nodes]
        gpu_free = state.card_free[nodes].sum(axis=1)
        dot = (cpu_left / MAX_SPEC_CPU) * (pod_cpu / MAX_SPEC_CPU) + (gpu_free / MAX_SPEC_GPU) * (
            req.gpu_total / MAX_SPEC_GPU
        )
        score = (MAX_NODE_SCORE * (1 - dot / 2)).astype(np.int64)
        return NodeScores(np.where(cpu_left >= pod_cpu, score, 0))
