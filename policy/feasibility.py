"""Which nodes can host a pod — the one feasibility check for simulator, trainer and extender.

A node is feasible when cpu and memory fit and, for a GPU pod, the node's GPU model is allowed and
either some card has at least the share free (share pod) or ``num_gpu`` cards are completely free
(whole-card pod). A request of 0 always fits, as in kube-scheduler's NodeResourcesFit: running pods
are counted whatever they asked, so a node's free cpu or memory can be below 0.
"""

from __future__ import annotations

import numpy as np

from .cluster import ClusterState, PodRequest
from .resources import MILLI_PER_CARD, QUANTITY_LIMIT, amount_text


def feasible_mask(state: ClusterState, req: PodRequest) -> np.ndarray:
    """bool[N]: True where the pod fits now."""
    ok = np.ones(state.num_nodes, dtype=np.bool_)
    if req.cpu_milli > 0:
        ok &= state.cpu_free >= req.cpu_milli
    if req.memory_mib > 0:
        ok &= state.mem_free >= req.memory_mib
    if req.is_gpu:
        # model_id is -1 on CPU-only nodes, which indexes model_ok's last entry (False for GPU pods).
        ok &= req.model_ok[state.model_id]
        if req.is_share:
            ok &= state.max_card_free >= req.gpu_milli
        else:
            ok &= state.full_free >= req.num_gpu
    return ok


def fits_on(state: ClusterState, req: PodRequest, node: int) -> bool:
    """Whether ``req`` fits on ``node`` now: :func:`feasible_mask` for one node, without the arrays
    (the living-cluster mode asks it for each waiting pod after every departure)."""
    if state.short_of_cpu_or_memory(req, node):
        return False
    if not req.is_gpu:
        return True
    if not req.model_ok[state.model_id[node]]:
        return False
    if req.is_share:
        return bool(state.max_card_free[node] >= req.gpu_milli)
    return bool(state.full_free[node] >= req.num_gpu)


def fits_on_cards(state: ClusterState, req: PodRequest, node: int, cards: tuple[int, ...]) -> bool:
    """Whether ``req`` fits on ``node`` on exactly these ``cards`` now (a decision made on a state that
    others changed meanwhile: the node may still fit on other cards while the chosen ones are taken)."""
    if not fits_on(state, req, node):
        return False
    if not req.is_gpu:
        return True
    return len(cards) == req.num_gpu and all(
        0 <= c < state.gpu_count[node] and state.card_free[node, c] >= req.gpu_milli for c in cards
    )


def feasible_nodes(state: ClusterState, req: PodRequest) -> np.ndarray:
    """Indices of the feasible nodes, ascending."""
    return np.flatnonzero(feasible_mask(state, req))


def unresolvable_mask(state: ClusterState, req: PodRequest) -> np.ndarray:
    """bool[N]: True where the pod could not fit even on the empty node (preemption cannot help)."""
    bad = (state.cpu_cap < req.cpu_milli) | (state.mem_cap < req.memory_mib)
    if req.is_gpu:
        bad |= ~req.model_ok[state.model_id]
        bad |= state.gpu_count < req.num_gpu
    return bad


def infeasibility_reason(state: ClusterState, req: PodRequest, node: int, detail: bool = True) -> str:
    """A sentence a person can act on, saying why ``node`` cannot host the pod now ("" if it can).

    With ``detail`` the sentence includes the node's own numbers (free cpu, free cards); without, it
    depends only on the pod and the kind of shortfall, so that kube-scheduler's ``FailedScheduling``
    event, which counts identical reasons ("0/1000 nodes are available: 612 insufficient cpu ..."),
    stays short.
    """
    reasons = []
    if req.cpu_milli > 0 and state.cpu_free[node] < req.cpu_milli:
        reasons.append(
            f"insufficient cpu: pod requests {amount_text(req.cpu_milli, 'm')}, node has {state.cpu_free[node]}m free "
            f"of {state.cpu_cap[node]}m"
            if detail
            else f"insufficient cpu (pod requests {amount_text(req.cpu_milli, 'm')})"
        )
    if req.memory_mib > 0 and state.mem_free[node] < req.memory_mib:
        reasons.append(
            f"insufficient memory: pod requests {_mib(req.memory_mib)}, node has {state.mem_free[node]}Mi free "
            f"of {state.mem_cap[node]}Mi"
            if detail
            else f"insufficient memory (pod requests {_mib(req.memory_mib)})"
        )
    if req.is_gpu:
        model = state.model_names[state.model_id[node]] if state.model_id[node] >= 0 else ""
        if not model:
            reasons.append("node has no GPU")
        elif not req.model_ok[state.model_id[node]]:
            allowed = [m for i, m in enumerate(state.model_names) if req.model_ok[i]]
            reasons.append(
                f"GPU model {model} not allowed (pod allows {'|'.join(allowed)})"
                if allowed
                else f"GPU model {model} not allowed (the pod accepts only GPU models no node has)"
            )
        elif req.is_share and state.max_card_free[node] < req.gpu_milli:
            reasons.append(
                f"no GPU card with {req.gpu_milli} milli free (most free on one card: {state.max_card_free[node]})"
                if detail
                else f"no GPU card with {req.gpu_milli} milli free"
            )
        elif not req.is_share and state.full_free[node] < req.num_gpu:
            reasons.append(
                f"needs {_cards(req.num_gpu)} of {MILLI_PER_CARD} milli, node has "
                f"{state.full_free[node]} of {state.gpu_count[node]}"
                if detail
                else f"needs {_cards(req.num_gpu)}"
            )
    return "; ".join(reasons)


def _mib(memory_mib: int) -> str:
    """A pod's memory request in MiB; a saturated request (2**53 bytes) says so instead of its number."""
    return amount_text(memory_mib, "Mi") if memory_mib < QUANTITY_LIMIT >> 20 else amount_text(QUANTITY_LIMIT)


def _cards(num_gpu: int) -> str:
    if num_gpu >= QUANTITY_LIMIT:
        return "more whole free GPU cards than any node holds"
    return f"{num_gpu} whole free GPU card(s)"
