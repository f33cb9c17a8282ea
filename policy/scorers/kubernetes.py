"""Kubernetes' NodeResourcesFit scoring strategies, as in kube-scheduler v1.37.2.

Ported from ``pkg/scheduler/framework/plugins/noderesources`` (least_allocated.go,
most_allocated.go, balanced_allocation.go, resource_allocation.go) with Go's integer arithmetic:

- LeastAllocated, per resource ``(A − R)·100 // A`` (0 if R > A); MostAllocated ``min(R, A)·100 // A``;
  both a weighted mean ``Σ s·w // Σ w`` over the resources the node has (A > 0). R is the node's
  *non-zero* requested plus the pod's non-zero request (a container without a cpu/memory request
  counts as 100m / 200 MB).
- BalancedAllocation (v1.34+ scores the *change* in balance): ``b(x) = int((1 − std(fractions))·100)``
  over the actual requested fractions (capped at 1), and the score is
  ``50 + (50 + b(with pod) − b(without pod)) // 2``. Best-effort pods (no request at all) score 0.
- An extended resource (our ``gpu``) the pod does not request is left out of the mean.

Resources are ``cpu`` (millicores), ``memory`` (bytes) and ``gpu`` (GPU milli: cards × 1000), the
last standing for the ``nvidia.com/gpu`` extended resource that GPU clusters add to
``scoringStrategy.resources``. Weights are configurable; the default is 1 each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster import MIB, ClusterState, PodRequest, nonzero_cpu, nonzero_mem_bytes
from ..resources import MILLI_PER_CARD
from .base import MAX_NODE_SCORE, NodeScores, Scorer

RESOURCES = ("cpu", "memory", "gpu")


@dataclass(frozen=True)
class ResourceWeights:
    """``scoringStrategy.resources``: a weight per resource, 0..100; weight 0 leaves a resource out."""

    weights: dict[str, int] = field(default_factory=lambda: {"cpu": 1, "memory": 1, "gpu": 1})

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(RESOURCES)
        if unknown:
            raise ValueError(f"unknown resource(s) {sorted(unknown)}; known: {', '.join(RESOURCES)}")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError("resource weights must not be negative")
        too_big = sorted(r for r, w in self.weights.items() if w > MAX_NODE_SCORE)
        if too_big:  # kube-scheduler's ValidateNodeResourcesFitArgs rejects these too
            raise ValueError(f"resource weight for {', '.join(too_big)} must be at most {MAX_NODE_SCORE}")


_Column = tuple[str, int, np.ndarray, np.ndarray, int]
"""(name, weight, allocatable[K], allocated[K], pod request) of one resource."""


def _columns(
    state: ClusterState, req: PodRequest, nodes: np.ndarray, nonzero: bool, weights: ResourceWeights
) -> list[_Column]:
    """Per configured resource: (name, weight, allocatable[K], allocated[K], pod request)."""
    cols: list[_Column] = []
    for name in RESOURCES:
        w = weights.weights.get(name, 0)
        if w == 0:
            continue
        if name == "cpu":
            alloc = state.cpu_cap[nodes]
            if nonzero:
                used, pod = state.nonzero_cpu_used[nodes], nonzero_cpu(req.cpu_milli)
            else:
                used, pod = alloc - state.cpu_free[nodes], req.cpu_milli
        elif name == "memory":
            alloc = state.mem_cap[nodes] * MIB
            if nonzero:
                used, pod = state.nonzero_mem_used_bytes[nodes], nonzero_mem_bytes(req.memory_mib)
            else:
                used, pod = alloc - state.mem_free[nodes] * MIB, req.memory_mib * MIB
        else:
            alloc = state.gpu_count[nodes] * MILLI_PER_CARD
            used = alloc - state.card_free[nodes].sum(axis=1)
            pod = req.gpu_total
            if pod == 0:  # an extended resource the pod does not request is not scored
                continue
        cols.append((name, w, alloc, used, pod))
    return cols


def _weighted_mean(per_resource: list[tuple[int, np.ndarray, np.ndarray]], k: int) -> np.ndarray:
    score = np.zeros(k, dtype=np.int64)
    weight_sum = np.zeros(k, dtype=np.int64)
    for w, s, present in per_resource:
        score += np.where(present, s * w, 0)
        weight_sum += np.where(present, w, 0)
    return np.where(weight_sum > 0, score // np.maximum(weight_sum, 1), 0)


class LeastAllocatedScorer(Scorer):
    """Prefer nodes with the most unrequested capacity (spreading)."""

    name = "least-allocated"

    def __init__(self, weights: ResourceWeights | None = None):
        self.weights = weights or ResourceWeights()

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        parts = []
        for _, w, alloc, used, pod in _columns(state, req, nodes, True, self.weights):
            requested = used + pod
            safe = np.maximum(alloc, 1)
            s = np.where(requested > alloc, 0, (alloc - requested) * MAX_NODE_SCORE // safe)
            parts.append((w, s, alloc > 0))
        return NodeScores(_weighted_mean(parts, len(nodes)))


class MostAllocatedScorer(Scorer):
    """Prefer nodes with the most requested capacity (bin packing)."""

    name = "most-allocated"

    def __init__(self, weights: ResourceWeights | None = None):
        self.weights = weights or ResourceWeights()

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        parts = []
        for _, w, alloc, used, pod in _columns(state, req, nodes, True, self.weights):
            requested = np.minimum(used + pod, alloc)
            s = requested * MAX_NODE_SCORE // np.maximum(alloc, 1)
            parts.append((w, s, alloc > 0))
        return NodeScores(_weighted_mean(parts, len(nodes)))


def balance_score(requested: list[np.ndarray], allocatable: list[np.ndarray]) -> np.ndarray:
    """``int((1 − std)·100)`` over the fractions of resources with allocatable > 0 (Go's float order)."""
    k = len(requested[0]) if requested else 0
    fractions = []
    for r, a in zip(requested, allocatable, strict=True):
        f = np.where(a > 0, np.minimum(r / np.maximum(a, 1), 1.0), np.nan)
        fractions.append(f)
    if not fractions:
        return np.full(k, MAX_NODE_SCORE, dtype=np.int64)
    frac = np.stack(fractions, axis=1)  # [K, R], nan where skipped
    present = ~np.isnan(frac)
    n = present.sum(axis=1)
    std = np.zeros(k)
    # Exactly two resources: |f0 − f1| / 2 (the common cpu+memory case).
    two = n == 2
    if two.any():
        # Columns of the two present resources, in resource order.
        order = np.argsort(~present[two], axis=1, kind="stable")
        rows = np.arange(two.sum())
        first, second = frac[two][rows, order[:, 0]], frac[two][rows, order[:, 1]]
        std[two] = np.abs((first - second) / 2)
    many = n > 2
    if many.any():
        f = np.where(present[many], frac[many], 0.0)
        total = np.zeros(many.sum())
        for j in range(f.shape[1]):
            total = total + f[:, j]
        mean = total / n[many]
        acc = np.zeros(many.sum())
        for j in range(f.shape[1]):
            acc = acc + np.where(present[many][:, j], (f[:, j] - mean) * (f[:, j] - mean), 0.0)
        std[many] = np.sqrt(acc / n[many])
    return ((1 - std) * MAX_NODE_SCORE).astype(np.int64)


class BalancedAllocationScorer(Scorer):
    """Prefer nodes whose resource fractions become more balanced by placing the pod."""

    name = "balanced-allocation"

    def __init__(self, weights: ResourceWeights | None = None):
        self.weights = weights or ResourceWeights()

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        cols = _columns(state, req, nodes, False, self.weights)
        if all(pod == 0 for *_, pod in cols):  # best-effort pod: BalancedAllocation skips scoring
            return NodeScores(np.zeros(len(nodes), dtype=np.int64))
        alloc = [a for _, _, a, _, _ in cols]
        with_pod = balance_score([u + p for _, _, _, u, p in cols], alloc)
        without = balance_score([u for _, _, _, u, _ in cols], alloc)
        half = MAX_NODE_SCORE // 2
        return NodeScores(half + (half + with_pod - without) // 2)
