"""GPU fragmentation as FGD (USENIX ATC'23) measures it, and its change when a pod is placed.

A node's fragmentation is the GPU milli that the typical pod will, in expectation, be unable to use:
``Frag = Σ_t p_t · frag_t`` where, if typical pod ``t`` fits the node (model allowed, enough cards with
free ≥ t's milli, enough free cpu), ``frag_t`` is the free milli on cards that cannot host ``t``;
otherwise all free GPU milli on the node is fragment (CPU-only typical pods always count all of it).

The per-candidate work (try the pod on every fitting card of every feasible node) runs in numba
kernels; the per-node "before" value is cached on the :class:`ClusterState` and refreshed only for
nodes whose ``node_version`` moved.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np

from .cluster import ClusterState, PodRequest, nonzero_cpu, nonzero_cpu_array
from .resources import MILLI_PER_CARD
from .typical import TypicalPods

_Kernel = TypeVar("_Kernel", bound=Callable[..., Any])
_Measure = TypeVar("_Measure")

MEASURES_KEPT = 4
"""How many GPU-model vocabularies a scorer keeps a measure for (:func:`for_models`)."""


def for_models(
    measures: dict[tuple[str, ...], _Measure], model_names: tuple[str, ...], make: Callable[[], _Measure]
) -> _Measure:
    """The measure for a cluster's GPU models from ``measures``, made when missing. Only the
    :data:`MEASURES_KEPT` latest vocabularies are kept: a serving scorer lives for weeks, and every
    node pool that scales to zero and back can bring a new set of models (one entry each, up to
    2^models of them, before)."""
    measure = measures.get(model_names)
    if measure is None:
        measure = measures[model_names] = make()
        while len(measures) > MEASURES_KEPT:
            del measures[next(iter(measures))]
    return measure


def kernel(fn: _Kernel) -> _Kernel:
    """``numba.njit(cache=True, nogil=True)`` with the kernel's own signature kept for the type checker.

    numba's decorator is untyped (to mypy every kernel would become ``Any``, its callers unchecked).
    numba ignores the annotations: it compiles one specialization per tuple of argument types it sees.
    """
    return cast(_Kernel, numba.njit(cache=True, nogil=True)(fn))


def numpy_kernel(fn: _Kernel) -> _Kernel:
    """:func:`kernel` with numpy's float semantics: ``x / 0.0`` gives inf or nan, as in numpy, where
    numba's default raises ``ZeroDivisionError`` (for kernels that replace numpy code value for value)."""
    return cast(_Kernel, numba.njit(cache=True, nogil=True, error_model="numpy")(fn))


@kernel
def _node_frag(
    row: np.ndarray,
    ncards: int,
    cpu_free: int,
    model: int,
    t_cpu: np.ndarray,
    t_milli: np.ndarray,
    t_num: np.ndarray,
    t_access: np.ndarray,
    t_weight: np.ndarray,
) -> float:
    total = 0
    for c in range(ncards):
        total += row[c]
    frag = 0.0
    for t in range(t_weight.shape[0]):
        h = t_milli[t]
        w = t_weight[t]
        if h == 0 or not t_access[t, model]:
            frag += w * total
            continue
        fit_cards = 0
        unusable = 0
        for c in range(ncards):
            f = row[c]
            if f >= h:
                fit_cards += 1
            else:
                unusable += f
        if fit_cards >= t_num[t] and cpu_free >= t_cpu[t]:
            frag += w * unusable
        else:
            frag += w * total
    return frag


@kernel
def _frag_rows(
    card_free: np.ndarray,
    gpu_count: np.ndarray,
    cpu_free: np.ndarray,
    model_id: np.ndarray,
    nodes: np.ndarray,
    t_cpu: np.ndarray,
    t_milli: np.ndarray,
    t_num: np.ndarray,
    t_access: np.ndarray,
    t_weight: np.ndarray,
    out: np.ndarray,
) -> None:
    for k in range(nodes.shape[0]):
        n = nodes[k]
        out[n] = _node_frag(
            card_free[n], gpu_count[n], cpu_free[n], model_id[n], t_cpu, t_milli, t_num, t_access, t_weight
        )


@kernel
def _fgd_score(delta: float) -> np.int64:
    # FGD's score: int64(sigmoid(ΔFrag / 1000) * MaxNodeScore), truncated like Go's conversion.
    return np.int64(100.0 / (1.0 + math.exp(-delta / 1000.0)))


@kernel
def _placement_deltas(
    card_free: np.ndarray,
    gpu_count: np.ndarray,
    cpu_free: np.ndarray,
    model_id: np.ndarray,
    frag: np.ndarray,
    nodes: np.ndarray,
    p_cpu: int,
    p_milli: int,
    p_num: int,
    share: bool,
    t_cpu: np.ndarray,
    t_milli: np.ndarray,
    t_num: np.ndarray,
    t_access: np.ndarray,
    t_weight: np.ndarray,
    out_score: np.ndarray,
    out_card: np.ndarray,
    out_delta: np.ndarray,
    out_best_delta: np.ndarray,
) -> None:
    ncols = card_free.shape[1]
    tmp = np.empty(ncols, dtype=card_free.dtype)
    for k in range(nodes.shape[0]):
        n = nodes[k]
        nc = gpu_count[n]
        cpu_after = cpu_free[n] - p_cpu
        before = frag[n]
        for c in range(ncols):
            tmp[c] = card_free[n, c]
        if share:
            best_card = -1
            best_score = np.int64(0)
            chosen_delta = 0.0
            max_delta = -1e300
            for c in range(nc):
                f = card_free[n, c]
                if f < p_milli:
                    continue
                seen = False
                for c2 in range(c):
                    if card_free[n, c2] == f:
                        seen = True
                        break
                if seen:  # same multiset of free milli as an earlier card: same score, earlier index wins
                    continue
                tmp[c] = f - p_milli
                after = _node_frag(tmp, nc, cpu_after, model_id[n], t_cpu, t_milli, t_num, t_access, t_weight)
                tmp[c] = f
                delta = before - after
                s = _fgd_score(delta)
                if best_card < 0 or s > best_score:
                    best_card = c
                    best_score = s
                    chosen_delta = delta
                if delta > max_delta:
                    max_delta = delta
            out_card[k] = best_card
            out_score[k] = best_score
            out_delta[k] = chosen_delta
            out_best_delta[k] = max_delta
        else:
            taken = 0
            for c in range(nc):
                if taken < p_num and tmp[c] == 1000:
                    tmp[c] = 0
                    taken += 1
            after = _node_frag(tmp, nc, cpu_after, model_id[n], t_cpu, t_milli, t_num, t_access, t_weight)
            delta = before - after
            out_card[k] = -1
            out_score[k] = _fgd_score(delta)
            out_delta[k] = delta
            out_best_delta[k] = delta


class Fragmentation:
    """FGD's fragmentation measure for one cluster state and one typical-pod distribution."""

    def __init__(self, typical: TypicalPods, model_names: tuple[str, ...]):
        assert MILLI_PER_CARD == 1000, "the kernels hard-code 1000 milli per card"
        self.typical = typical
        self.model_names = model_names
        self._t = (
            np.ascontiguousarray(nonzero_cpu_array(typical.cpu_milli)),
            np.ascontiguousarray(typical.gpu_milli, dtype=np.int64),
            np.ascontiguousarray(typical.num_gpu, dtype=np.int64),
            np.ascontiguousarray(typical.access(model_names)),
            np.ascontiguousarray(typical.weight, dtype=np.float64),
        )
        # The cache key says what the values depend on: two measures over the same typical pods
        # share it, and a new one never inherits another's values (an ``id()`` is reused once its
        # object is freed: a reloaded model read the previous model's fragmentation).
        digest = hashlib.blake2b(digest_size=16)
        for array in self._t:
            digest.update(array.tobytes())
        self._key = ("fragmentation", digest.digest())

    def node_frag(self, state: ClusterState) -> np.ndarray:
        """float[N]: each node's fragmentation now (cached; recomputed only for changed nodes)."""
        key = self._key
        cached = state.caches.get(key)
        if cached is None:
            frag = np.zeros(state.num_nodes, dtype=np.float64)
            versions = np.full(state.num_nodes, -1, dtype=np.int64)
            state.caches[key] = (frag, versions)
        else:
            frag, versions = cached
        stale = np.flatnonzero(versions != state.node_version)
        if len(stale):
            # The versions read before the rows: a model deciding in a worker thread runs this while
            # the event loop may place a pod (the kernel releases the GIL); stamping the version read
            # afterwards would mark a row computed before that placement as current.
            seen = state.node_version[stale]
            _frag_rows(state.card_free, state.gpu_count, state.cpu_free, state.model_id, stale, *self._t, frag)
            versions[stale] = seen
        return frag

    def cluster_frag(self, state: ClusterState) -> float:
        """Total fragmentation over all nodes, in GPU milli."""
        return float(self.node_frag(state).sum())

    def placement(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> PlacementFrag:
        """For each node in ``nodes``: FGD's integer score, its card (share pods) and ΔFrag."""
        frag = self.node_frag(state)
        k = len(nodes)
        score = np.empty(k, dtype=np.int64)
        card = np.empty(k, dtype=np.int64)
        delta = np.empty(k, dtype=np.float64)
        best_delta = np.empty(k, dtype=np.float64)
        _placement_deltas(
            state.card_free,
            state.gpu_count,
            state.cpu_free,
            state.model_id,
            frag,
            np.ascontiguousarray(nodes, dtype=np.int64),
            nonzero_cpu(req.cpu_milli),  # as the FGD simulator reads a pod: no request counts 100m
            req.gpu_milli if req.is_gpu else 0,
            req.num_gpu,
            req.is_share,
            *self._t,
            score,
            card,
            delta,
            best_delta,
        )
        return PlacementFrag(score=score, card=card, delta=delta, best_delta=best_delta)


class PlacementFrag:
    """Result of :meth:`Fragmentation.placement`, aligned with the node list it was given."""

    __slots__ = ("score", "card", "delta", "best_delta")

    def __init__(self, score: np.ndarray, card: np.ndarray, delta: np.ndarray, best_delta: np.ndarray):
        self.score = score
        """FGD's score 0..100 (int)."""
        self.card = card
        """The card FGD picks for a share pod (first card with the highest score); -1 otherwise."""
        self.delta = delta
        """Frag_before − Frag_after for that card (milli; higher is better)."""
        self.best_delta = best_delta
        """The highest Frag_before − Frag_after over the fitting cards."""
