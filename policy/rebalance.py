"""Which few running pods to move, and where: the rebalancer's planner (issue 15).

Placement alone cannot keep a living cluster tidy: as pods leave, a well-packed cluster drifts into
stranded GPUs and hot nodes, and only moving pods undoes that. This module decides the moves; it
knows nothing of Kubernetes or of the simulator. The operator (``operator/rebalancer*.py``) and the
living-cluster simulation (:mod:`rlsched.policy.dynamic.rebalancing`) both turn their running pods
into :class:`Candidate` s — after their own opt-in, PodDisruptionBudget, age and budget checks —
call :func:`plan_moves` on a :class:`ClusterState`, and evict the pods it names.

The heuristic (the baseline chooser; the learned chooser is the same function with more terms and
weights found by :mod:`rlsched.policy.dynamic.rebalance_search`, see "Learned terms" below):

- **Fragmentation gradient.** For a candidate on node ``a``: release it on a working copy of the
  state, ask the placement policy (``scorer``, FGD by default) where it would go now (``b``), and
  take the change of FGD's fragmentation measure over the typical pods on ``a`` and ``b``:
  ``(Frag_a + Frag_b)`` before minus after, in GPU milli (what the move un-strands).
- **Hot-node relief.** If ``a``'s measured CPU load (``state.load``, as Prometheus shows it) is above
  ``hot_threshold`` and ``b``'s stays at or below it with the pod's estimated load added, the move
  takes the pod's part of ``a``'s load off ``a``: its measured CPU use ÷ ``a``'s capacity when the
  caller knows it (``Candidate.cpu_usage_milli``, from per-pod metrics), else ``load_a × share``, where
  ``share`` is the pod's part of the CPU requested on ``a``. Counted ×1000, so that
  1000 units are a whole node's CPU taken off a hot node, as 1000 units of fragmentation are one GPU.
- ``gain = fragmentation_weight × Δfrag + hot_weight × 1000 × relief − migration_cost``; a move is
  proposed only if ``gain > min_gain``. Greedy: the best move is applied to the working copy (cards
  and estimated load), then the next is chosen, up to ``max_moves_per_cycle``; a pod moves at most
  once per plan. Ties go to a pod that is not latency-sensitive, then to the earlier candidate.

Learned terms (0 in the heuristic): the hot-node term weighs ``hot_weight + latency_sensitive_hot_weight``
for a latency-sensitive pod; ``latency_sensitive_weight × 1000`` for moving a latency-sensitive pod,
``pod_gpu_weight × its GPU milli``, and ``destination_load_weight × 1000 × b's CPU load after the move``
(clipped to [0, 1]) are added to the gain.

Exactness at a bearable cost: the removal term of every candidate is exact and cheap (one node); the
re-placement term is bounded above, per request shape, by the best ΔFrag of placing it on any other
node; the pod terms are exact, the destination term is bounded by its weight × 1000 when positive;
candidates are evaluated exactly (with the scorer's own decision) in order of that bound until no
bound can beat the best gain found. The result is the same as evaluating every candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cluster import LOAD_METRICS, ClusterState, Placement, PodRequest
from .decision import decide
from .feasibility import feasible_nodes
from .fragmentation import Fragmentation
from .resources import MILLI_PER_CARD
from .scorers import Scorer, TieBreak, make_scorer
from .typical import TypicalPods

CPU = LOAD_METRICS.index("cpu")
HOT_UNITS = float(MILLI_PER_CARD)
"""Gain units per whole node of CPU load taken off a hot node (1000, like milli per GPU)."""
_EPS = 1e-6


@dataclass(frozen=True)
class RebalanceSettings:
    """How the planner weighs moves. Gains are in *milli*: 1000 = one GPU's worth of stranded
    capacity un-stranded (FGD's measure), or one whole node's CPU load taken off a hot node."""

    max_moves_per_cycle: int = 2
    """Moves one plan may propose (default 2: few, safe migrations per cycle; budgets per hour and per
    pod lifetime are the caller's)."""
    min_gain: float = 0.0
    """Net gain (milli, after ``migration_cost``) a move must exceed (default 0: ``migration_cost``
    already prices the restart; raise it to demand a margin)."""
    hot_threshold: float = 0.9
    """Measured node CPU utilization (``state.load``, 0..1) above which a node is hot (default 0.9,
    the living cluster's SLA threshold)."""
    fragmentation_weight: float = 1.0
    """Weight of the fragmentation term (per milli of stranded GPU removed; default 1)."""
    hot_weight: float = 1.0
    """Weight of the hot-node term (per milli of a node's CPU load moved off it; default 1)."""
    migration_cost: float = 100.0
    """Milli subtracted from every move's gain: the price of restarting a pod (default 100, a tenth
    of a GPU un-stranded; an assumption, measured in docs/rebalancer.md against fewer and more moves)."""
    latency_sensitive_hot_weight: float = 0.0
    """Extra weight of the hot-node term when the moved pod is latency-sensitive (default 0: the
    heuristic; the learned chooser sets it, :mod:`rlsched.policy.dynamic.rebalance_search`)."""
    latency_sensitive_weight: float = 0.0
    """Milli added to the gain of moving a latency-sensitive pod (default 0; negative keeps them in place)."""
    pod_gpu_weight: float = 0.0
    """Milli added per GPU milli the moved pod holds (default 0; negative: restarting large jobs costs more)."""
    destination_load_weight: float = 0.0
    """Milli added per 0.001 of the destination's estimated CPU load after the move, clipped to
    [0, 1] (default 0; negative prefers cool destinations)."""

    def __post_init__(self) -> None:
        if self.max_moves_per_cycle < 0:
            raise ValueError("max_moves_per_cycle must not be negative")
        if self.fragmentation_weight < 0 or self.hot_weight < 0 or self.migration_cost < 0:
            raise ValueError("fragmentation_weight, hot_weight and migration_cost must not be negative")
        if not 0 < self.hot_threshold <= 1:
            raise ValueError("hot_threshold must be in (0, 1]")
        if self.hot_weight + self.latency_sensitive_hot_weight < 0:
            raise ValueError("hot_weight + latency_sensitive_hot_weight must not be negative")


@dataclass(frozen=True)
class Candidate:
    """A running pod that may be moved (opt-in, PDB, age and budget checks happen before, in the caller)."""

    key: str
    """The caller's id (namespace/name in the operator, the pod index in the simulator)."""
    node: int
    """Index of its node in the state."""
    request: PodRequest
    placement: Placement
    """Its cards; must be on ``node`` and match ``request`` (it is released from the working copy)."""
    latency_sensitive: bool
    cpu_usage_milli: float | None = None
    """Its measured CPU use, in millicores (per-pod metrics: cAdvisor's
    ``container_cpu_usage_seconds_total`` in a cluster, the simulator's scrape); None: estimated from
    its share of the CPU requested on its node."""


@dataclass(frozen=True)
class Move:
    """One proposed migration."""

    key: str
    from_node: int
    to_node: int
    """Where the placement policy would put the pod now (the caller's scheduler may differ)."""
    reason: str
    """``fragmentation`` or ``hot-node``: whichever term gave more of the gain."""
    gain: float
    """Net benefit after ``migration_cost``, in milli (see :class:`RebalanceSettings`)."""


def plan_moves(
    state: ClusterState,
    candidates: Sequence[Candidate],
    typical: TypicalPods,
    settings: RebalanceSettings,
    scorer: Scorer | None = None,
) -> list[Move]:
    """The moves worth making now, best first (see the module docstring). ``state`` is not changed.

    ``scorer`` is the placement policy that will re-place an evicted pod (default FGD over ``typical``).
    Raises ValueError when a candidate's placement is not on its node or does not match its request.
    """
    for c in candidates:
        p = c.placement
        if p.node != c.node or (p.cpu_milli, p.memory_mib, p.kind) != (
            c.request.cpu_milli,
            c.request.memory_mib,
            c.request.kind,
        ):
            raise ValueError(f"candidate {c.key!r}: its placement does not match its node or request")
    if settings.max_moves_per_cycle == 0 or not candidates:
        return []
    return _Planner(state, typical, settings, scorer or make_scorer("fgd", typical)).plan(candidates)


class _Planner:
    """One plan's working copy and caches."""

    def __init__(self, state: ClusterState, typical: TypicalPods, settings: RebalanceSettings, scorer: Scorer):
        self.work = state.copy()
        self.settings = settings
        self.scorer = scorer
        self.measure = Fragmentation(typical, state.model_names)
        self.tiebreak = TieBreak.by_name(state.names)

    def plan(self, candidates: Sequence[Candidate]) -> list[Move]:
        where = {k: c.placement for k, c in enumerate(candidates)}
        removal: dict[int, float] = {}
        moves: list[Move] = []
        for _ in range(self.settings.max_moves_per_cycle):
            best: tuple[Move, tuple[int, ...], int, float] | None = None
            for bound, k in self._bounds(candidates, where, removal):
                if best is not None and bound + _EPS < best[0].gain:
                    break
                found = self._exact(candidates[k], where[k])
                if found is None or found[0].gain <= self.settings.min_gain:
                    continue
                if best is None or _better(found[0], candidates[k], k, best[0], candidates[best[2]], best[2]):
                    best = (found[0], found[1], k, found[2])
            if best is None:
                break
            move, cards, k, est = best
            self._apply(candidates[k], where[k], move, cards, est)
            moves.append(move)
            del where[k]
            changed = (move.from_node, move.to_node)
            removal = {j: g for j, g in removal.items() if j in where and where[j].node not in changed}
        return moves

    # -- bounds --------------------------------------------------------------------------------
    def _bounds(
        self, candidates: Sequence[Candidate], where: dict[int, Placement], removal: dict[int, float]
    ) -> list[tuple[float, int]]:
        """(upper bound of the gain, index) for every candidate that might beat ``min_gain``, best first."""
        s = self.settings
        top: dict[tuple[int, int, int, int, bytes], tuple[tuple[int, float], tuple[int, float]]] = {}
        out = []
        for k, placement in where.items():
            c = candidates[k]
            if k not in removal:
                removal[k] = self._removal_gain(c, placement)
            shape = (c.request.cpu_milli, c.request.memory_mib, c.request.num_gpu, c.request.gpu_milli)
            key = (*shape, c.request.model_ok.tobytes())
            if key not in top:
                top[key] = self._best_two(c.request)
            (n1, d1), (_, d2) = top[key]
            place_best = d2 if n1 == placement.node else d1
            if place_best == -np.inf:
                continue  # nowhere else to go
            hot = self._hot_estimate(c, placement.node)
            bound = s.fragmentation_weight * (removal[k] + place_best) + _hot_weight(s, c) * HOT_UNITS * hot
            bound += _pod_terms(s, c) + max(s.destination_load_weight, 0.0) * HOT_UNITS - s.migration_cost
            if bound + _EPS > s.min_gain:
                out.append((bound, k))
        out.sort(key=lambda bk: (-bk[0], candidates[bk[1]].latency_sensitive, bk[1]))
        return out

    def _removal_gain(self, c: Candidate, placement: Placement) -> float:
        """Frag_a before − after releasing the pod from its node ``a`` (exact; the state is restored)."""
        work, a = self.work, placement.node
        before = float(self.measure.node_frag(work)[a])
        work.release(placement)
        try:
            after = float(self.measure.node_frag(work)[a])
        finally:
            work.place(c.request, a, placement.cards, overcommit=True)  # back as it was
        return before - after

    def _best_two(self, req: PodRequest) -> tuple[tuple[int, float], tuple[int, float]]:
        """The two best (node, ΔFrag of placing ``req`` there) over the nodes it fits now."""
        nodes = feasible_nodes(self.work, req)
        none = (-1, -np.inf)
        if len(nodes) == 0:
            return none, none
        deltas = self.measure.placement(self.work, req, nodes).best_delta
        order = np.argsort(-deltas, kind="stable")[:2]
        first = (int(nodes[order[0]]), float(deltas[order[0]]))
        return first, ((int(nodes[order[1]]), float(deltas[order[1]])) if len(order) > 1 else none)

    def _hot_estimate(self, c: Candidate, a: int) -> float:
        """The pod's estimated share of ``a``'s CPU load if ``a`` is hot (else 0)."""
        load = self.work.load[a, CPU]
        if not load > self.settings.hot_threshold:  # NaN (unknown) is not hot
            return 0.0
        return self._pod_load(c, a)

    def _pod_load(self, c: Candidate, a: int) -> float:
        """The pod's part of ``a``'s CPU load: its measured use ÷ ``a``'s capacity when known, else
        ``load_a × (pod cpu request ÷ cpu requested on a)`` (0 if the load is unknown)."""
        work = self.work
        if c.cpu_usage_milli is not None:
            return max(float(c.cpu_usage_milli), 0.0) / max(float(work.cpu_cap[a]), 1.0)
        load = work.load[a, CPU]
        requested = float(work.cpu_cap[a] - work.cpu_free[a])
        if np.isnan(load) or requested <= 0:
            return 0.0
        return float(load) * c.request.cpu_milli / requested

    # -- one exact evaluation ------------------------------------------------------------------
    def _exact(self, c: Candidate, placement: Placement) -> tuple[Move, tuple[int, ...], float] | None:
        """The move the placement policy would make for this pod now, its cards there and the pod's
        estimated load (the state is restored)."""
        work, a, s = self.work, placement.node, self.settings
        frag = self.measure.node_frag(work)
        before_a = float(frag[a])
        est = self._pod_load(c, a)
        hot = self._hot_estimate(c, a)
        work.release(placement)
        try:
            decision = decide(self.scorer, work, c.request, self.tiebreak)
            if decision is None or decision.node == a:
                return None
            b = decision.node
            frag = self.measure.node_frag(work)
            after_a, before_b = float(frag[a]), float(frag[b])
            there = work.place(c.request, b, decision.cards)
            after_b = float(self.measure.node_frag(work)[b])
            work.release(there)
        finally:
            work.place(c.request, a, placement.cards, overcommit=True)  # back as it was
        load_b = float(work.load[b, CPU])
        moved = est * float(work.cpu_cap[a]) / max(float(work.cpu_cap[b]), 1.0)
        if hot > 0 and (np.isnan(load_b) or load_b + moved > s.hot_threshold):
            hot = 0.0  # b unknown, or it would be hot too: no relief
        frag_term = s.fragmentation_weight * ((before_a - after_a) + (before_b - after_b))
        hot_term = _hot_weight(s, c) * HOT_UNITS * hot
        gain = frag_term + hot_term - s.migration_cost + _pod_terms(s, c)
        if s.destination_load_weight:
            dest = 0.0 if np.isnan(load_b) else min(max(load_b + moved, 0.0), 1.0)
            gain += s.destination_load_weight * HOT_UNITS * dest
        reason = "hot-node" if hot_term > frag_term else "fragmentation"
        move = Move(key=c.key, from_node=a, to_node=b, reason=reason, gain=float(gain))
        return move, decision.cards, est

    def _apply(self, c: Candidate, placement: Placement, move: Move, cards: tuple[int, ...], est: float) -> None:
        """Make the move on the working copy (cards, and the pod's estimated load between the nodes)."""
        work = self.work
        work.release(placement)
        work.place(c.request, move.to_node, cards)
        a, b = move.from_node, move.to_node
        if est > 0 and not np.isnan(work.load[b, CPU]):
            work.load[a, CPU] -= est
            work.load[b, CPU] += est * float(work.cpu_cap[a]) / max(float(work.cpu_cap[b]), 1.0)
            work.node_version[[a, b]] += 1


def _hot_weight(s: RebalanceSettings, c: Candidate) -> float:
    """The hot-node term's weight for this pod (the latency-sensitive extra included)."""
    return s.hot_weight + (s.latency_sensitive_hot_weight if c.latency_sensitive else 0.0)


def _pod_terms(s: RebalanceSettings, c: Candidate) -> float:
    """The gain terms that depend on the pod alone (exact, so the same in the bound)."""
    return s.latency_sensitive_weight * HOT_UNITS * c.latency_sensitive + s.pod_gpu_weight * c.request.gpu_total


def _better(m: Move, c: Candidate, k: int, best: Move, bc: Candidate, bk: int) -> bool:
    """Higher gain; at equal gain a pod that is not latency-sensitive; then the earlier candidate."""
    return (m.gain, not c.latency_sensitive, -k) > (best.gain, not bc.latency_sensitive, -bk)
