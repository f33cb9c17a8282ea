"""The rebalancer in the living cluster: a tick hook that moves pods, and the descheduler's anchor.

Every ``cycle_s`` seconds (at the first measured scrape at or after each multiple of it) the hook
picks pods to evict from the running ones that pass the same safety checks the operator applies
(older than ``min_age_s`` since their last start, moved fewer than ``max_moves_per_pod`` times,
within ``max_moves_per_hour`` over the last hour and ``max_moves_per_cycle`` per cycle), and evicts
them with :meth:`LivingCluster.evict`. An evicted pod comes back at once as a pending pod and is
placed by the run's own placement policy, so it may not land where the plan meant: the hook counts
landed-as-planned against elsewhere.

The choosers:

- ``heuristic`` — :func:`rlsched.policy.rebalance.plan_moves` (fragmentation gradient and hot-node
  relief) with the run's placement policy as the scorer; a pod's part of its node's CPU load is
  estimated from its share of the requested CPU.
- ``heuristic-usage`` — the same with each pod's measured CPU use (the simulator's last scrape of
  it, as per-pod metrics — cAdvisor's ``container_cpu_usage_seconds_total`` — would give it): the
  planner then sees which pod makes a node hot.
- ``high-node-utilization`` — the descheduler's HighNodeUtilization strategy, kubernetes-sigs/descheduler
  v0.36.0 (commit 8005cdf78391e2c071cfa653c462dfefc2de8856), ``pkg/framework/plugins/nodeutilization/
  highnodeutilization.go`` and ``nodeutilization.go``, followed in its semantics, not copied: a node
  whose *requested* cpu, memory and GPU (an extended resource, in milli) are all at or below
  ``thresholds`` percent of allocatable is underutilized; nothing happens when no node is, when all
  are, or when none is left to receive; the free room of the other nodes (allocatable − requested for
  cpu, memory, GPU milli and pods) is summed; underutilized nodes are visited in ascending order of
  their summed usage, their pods in eviction order (priority low to high, then QoS BestEffort,
  Burstable, Guaranteed; openb's ``BE`` read as BestEffort, ``Guaranteed`` as Guaranteed, the rest
  Burstable), each eviction subtracting the pod's request from the summed room, stopping when any
  resource of that room is no longer positive. Our per-cycle, per-hour and per-pod budgets and the
  minimum age play the part of the descheduler's ``maxNoOfPodsToEvictTotal`` and ``minPodAge`` so
  the two choosers run under the same safety rules.

- ``learned:FILE`` — the planner of ``heuristic-usage`` with the weights a search in this simulation
  found (:mod:`.rebalance_search`, ``rlsched train-rebalancer``; the file from
  :func:`rlsched.policy.rebalance_weights.write_weights_file`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from ..rebalance import Candidate, RebalanceSettings, plan_moves
from ..rebalance_weights import read_weights_file
from ..resources import MILLI_PER_CARD
from ..scorers import NodeScores, Scorer, TieBreak
from ..typical import TypicalPods
from .objective import DynamicResult
from .simulator import DynamicSettings, LivingCluster, serve_pod

REBALANCERS = ("none", "heuristic", "heuristic-usage", "high-node-utilization")
"""Names ``rlsched evaluate --mode dynamic --rebalancer`` accepts (and ``learned:FILE``)."""
LEARNED = "learned:"


def rebalancer_label(name: str) -> str:
    """How a chooser is named in a result row: ``learned:NAME`` for ``learned:FILE`` (NAME the file's name
    without its folder, so that two learned files make two rows, and the row reads the same wherever the
    file lies)."""
    return LEARNED + Path(name[len(LEARNED) :]).name if name.startswith(LEARNED) else name


def parse_rebalancers(text: str) -> list[str]:
    """``--rebalancer``'s comma-separated choosers, each once (``none,none`` would play every seed twice
    into one row); ValueError for an unknown one, an unreadable learned file, or two learned files whose
    rows would share a label (same file name in two folders)."""
    unique: dict[str, str] = {}  # the same file spelt two ways is one chooser
    for name in (r.strip() for r in text.split(",")):
        if name:
            same = LEARNED + str(Path(name[len(LEARNED) :]).resolve()) if name.startswith(LEARNED) else name
            unique.setdefault(same, name)
    names = list(unique.values()) or ["none"]
    labels: dict[str, str] = {}
    for name in names:
        check_rebalancer(name)
        label = rebalancer_label(name)
        if label in labels:
            raise ValueError(
                f"--rebalancer: {labels[label]} and {name} would both be reported as {label!r}; "
                "give the files distinct names"
            )
        labels[label] = name
    return names


def check_rebalancer(name: str) -> None:
    """Raise ValueError unless ``name`` is a chooser (a ``learned:FILE`` must read)."""
    if name.startswith(LEARNED):
        read_weights_file(name[len(LEARNED) :])
    elif name not in REBALANCERS:
        raise ValueError(f"unknown rebalancer {name!r}; choose from {', '.join(REBALANCERS)} or learned:FILE")


QOS_TIER = {"BE": 0, "BestEffort": 0, "Guaranteed": 2}
"""Eviction order of the descheduler's QoS fallback (lower first); classes not listed are Burstable (1)."""


@dataclass(frozen=True)
class HighNodeUtilizationSettings:
    """The descheduler strategy's arguments (``HighNodeUtilizationArgs``)."""

    cpu_pct: float = 20.0
    """Requested cpu ÷ allocatable, percent, at or below which a node may be underutilized (default
    20: the descheduler README's example)."""
    memory_pct: float = 20.0
    """The same for memory (default 20, the README's example)."""
    gpu_pct: float = 20.0
    """The same for GPU milli as an extended resource (default 20, like the others; the strategy
    ignores GPUs unless a threshold names them, which would make it blind to cards)."""
    max_pods: int = 110
    """Pods a node holds (the kubelet's default ``maxPods``), for the ``pods`` room."""
    interval_s: float = 300.0
    """Seconds between its cycles (default 300: the descheduler chart's ``deschedulingInterval``, 5m);
    replaces ``RebalancerSettings.cycle_s`` for this chooser."""


@dataclass(frozen=True)
class RebalancerSettings:
    """When and how much the simulated rebalancer may move."""

    cycle_s: float = 60.0
    """Seconds between the heuristic's cycles (default 60, with ``max_moves_per_cycle`` 2: a plan assumes
    its moves land one after the other, but all its evicted pods return together and see each other's
    freed room; on seeds 1-2, 10 moves every 300 s landed as planned 56 % of the time, 2 every 60 s 92 %)."""
    min_age_s: float = 600.0
    """A pod younger than this since its last start is not moved (default 10 minutes: let it warm up)."""
    max_moves_per_pod: int = 1
    """Times one pod may be moved over its life (default 1: no pod is bounced twice)."""
    max_moves_per_hour: int = 120
    """Evictions over any hour (default 120: about 2 per 100 pod-hours on openb at load 0.9, which
    runs ≈ 6,300 pods)."""
    max_moves_per_cycle: int = 2
    """Evictions per cycle (default 2, the planner's own default: 60 cycles an hour reach the hourly budget)."""
    plan: RebalanceSettings = field(default_factory=RebalanceSettings)
    """The heuristic's weights (its ``max_moves_per_cycle`` is replaced by what the budgets allow)."""
    high_node_utilization: HighNodeUtilizationSettings = field(default_factory=HighNodeUtilizationSettings)

    def __post_init__(self) -> None:
        if self.cycle_s <= 0 or self.min_age_s < 0:
            raise ValueError("cycle_s must be positive and min_age_s not negative")
        if min(self.max_moves_per_pod, self.max_moves_per_hour, self.max_moves_per_cycle) < 0:
            raise ValueError("budgets must not be negative")


@dataclass
class RebalanceStats:
    """What one run's rebalancer did."""

    cycles: int = 0
    evicted: int = 0
    landed_as_planned: int = 0
    landed_elsewhere: int = 0
    """Placed again, on another node than the plan's (the placement policy's tie-break or state moved)."""
    back_on_same_node: int = 0
    not_placed: int = 0
    """Still waiting (or gone) at the next cycle."""
    reasons: dict[str, int] = field(default_factory=dict)


class RebalanceHook:
    """A :attr:`LivingCluster.tick_hooks` entry: every ``cycle_s`` choose pods and evict them."""

    def __init__(
        self, chooser: str, settings: RebalancerSettings, typical: TypicalPods, scorer: Scorer | None = None
    ) -> None:
        if chooser not in REBALANCERS[1:]:
            raise ValueError(f"unknown rebalancer {chooser!r}; choose one of {', '.join(REBALANCERS)}")
        self.chooser = chooser
        self.settings = settings
        self.typical = typical
        self.scorer = scorer
        self.stats = RebalanceStats()
        self.next_cycle = 0.0
        self.recent: deque[float] = deque()
        self.moves: dict[int, int] = {}
        self.started: dict[int, float] = {}
        self.intended: dict[int, tuple[int, int]] = {}
        """Pod → (node it left, node the plan meant), until it is seen placed."""

    def __call__(self, cluster: LivingCluster) -> None:
        self.settle(cluster)  # the pods evicted at the last cycle were offered again right after it
        if cluster.now + 1e-9 < self.next_cycle:
            return
        hnu = self.chooser == "high-node-utilization"
        period = self.settings.high_node_utilization.interval_s if hnu else self.settings.cycle_s
        # the next slot of the schedule 0, period, 2·period, … (one a scrape cannot reach is skipped):
        # counted from this scrape instead, a period the scrape interval does not divide stretched to
        # the next whole number of scrapes (60 s at 45 s scrapes ran every 90 s)
        self.next_cycle = period * (math.floor((cluster.now + 1e-9) / period) + 1)
        s = self.settings
        while self.recent and self.recent[0] <= cluster.now - 3600.0:
            self.recent.popleft()
        allowed = min(s.max_moves_per_cycle, s.max_moves_per_hour - len(self.recent))
        self.stats.cycles += 1
        if allowed <= 0:
            return
        eligible = self._eligible(cluster)
        if hnu:
            chosen = high_node_utilization(cluster, eligible, allowed, s.high_node_utilization)
        else:
            chosen = self._heuristic(cluster, eligible, allowed)
        for i, target, reason in chosen:
            self.intended[i] = (cluster.evict(i), target)
            self.moves[i] = self.moves.get(i, 0) + 1
            self.started[i] = cluster.now
            self.recent.append(cluster.now)
            self.stats.evicted += 1
            self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1

    def _eligible(self, cluster: LivingCluster) -> list[int]:
        s = self.settings
        out = []
        for i in cluster.running():
            i = int(i)
            # since its last start: its move, its placement, or (the start's population, placed
            # before the window with no time recorded) its arrival
            placed = cluster.placed_at[i]
            start = self.started.get(i, cluster.arrivals[i].time if np.isnan(placed) else placed)
            if cluster.now - start >= s.min_age_s and self.moves.get(i, 0) < s.max_moves_per_pod:
                out.append(i)
        return out

    def _heuristic(self, cluster: LivingCluster, eligible: Sequence[int], allowed: int) -> list[tuple[int, int, str]]:
        cpu_now = cluster.pod_now[0] if self.chooser == "heuristic-usage" else None
        candidates = [
            Candidate(
                key=str(i),
                node=int(cluster.node_of[i]),
                request=cluster.request(i),
                placement=cluster.placements[i],
                latency_sensitive=bool(cluster.latency_sensitive[i]),
                cpu_usage_milli=None if cpu_now is None else float(cpu_now[i] * cluster.cpu_req[i]),
            )
            for i in eligible
        ]
        plan = replace(self.settings.plan, max_moves_per_cycle=allowed)
        scorer = None if self.scorer is None else SameTieBreak(self.scorer, cluster.tiebreak.planning())
        moves = plan_moves(cluster.state, candidates, self.typical, plan, scorer)
        return [(int(m.key), m.to_node, m.reason) for m in moves]

    def settle(self, cluster: LivingCluster) -> None:
        """Count where the pods evicted at the last cycle landed (called at the next scrape)."""
        for i, (left, meant) in self.intended.items():
            node = int(cluster.node_of[i])
            if node < 0:
                self.stats.not_placed += 1
            elif meant >= 0 and node == meant:
                self.stats.landed_as_planned += 1
            elif node == left:
                self.stats.back_on_same_node += 1
            else:
                self.stats.landed_elsewhere += 1
        self.intended.clear()


class SameTieBreak(Scorer):
    """The run's placement policy with the run's own tie-break, so that the plan predicts where an
    evicted pod lands (FGD's integer scores tie often; the planner's default order is by node name)."""

    def __init__(self, scorer: Scorer, tiebreak: TieBreak):
        self.inner = scorer
        self.tiebreak = tiebreak
        self.name = scorer.name  # type: ignore[misc]

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        return self.inner.score(state, req, nodes)

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        return self.inner.choose(scores, nodes, self.tiebreak)

    def cards(
        self,
        state: ClusterState,
        req: PodRequest,
        node: int,
        position: int,
        scores: NodeScores | None,
        tiebreak: TieBreak,
    ) -> tuple[int, ...]:
        return self.inner.cards(state, req, node, position, scores, self.tiebreak)


def high_node_utilization(
    cluster: LivingCluster, eligible: Sequence[int], allowed: int, settings: HighNodeUtilizationSettings
) -> list[tuple[int, int, str]]:
    """The descheduler's HighNodeUtilization over the cluster's requests (see the module docstring):
    ``(pod, -1, "high-node-utilization")`` per eviction, at most ``allowed``."""
    state = cluster.state
    cpu_used = (state.cpu_cap - state.cpu_free).astype(np.float64)
    mem_used = (state.mem_cap - state.mem_free).astype(np.float64)
    gpu_cap = (state.gpu_count * MILLI_PER_CARD).astype(np.float64)
    gpu_used = gpu_cap - state.card_free.sum(axis=1)
    pods = np.bincount(cluster.node_of[cluster.node_of >= 0], minlength=state.num_nodes).astype(np.float64)

    def pct(used: np.ndarray, cap: np.ndarray) -> np.ndarray:
        return np.where(cap > 0, used * 100.0 / np.maximum(cap, 1), 0.0)

    low = (
        (pct(cpu_used, state.cpu_cap) <= settings.cpu_pct)
        & (pct(mem_used, state.mem_cap) <= settings.memory_pct)
        & (pct(gpu_used, gpu_cap) <= settings.gpu_pct)
    )
    if not low.any() or low.all():
        return []
    room = np.array(
        [
            (state.cpu_cap - cpu_used)[~low].sum(),
            (state.mem_cap - mem_used)[~low].sum(),
            (gpu_cap - gpu_used)[~low].sum(),
            (settings.max_pods - pods)[~low].sum(),
        ]
    )
    # ascending summed usage: cpu in milli, memory in bytes, GPU milli and pods as counts (Go's sort key)
    usage = cpu_used + mem_used * (1 << 20) + gpu_used + pods
    order = sorted(np.flatnonzero(low), key=lambda n: (usage[n], n))
    by_node: dict[int, list[int]] = {}
    for i in eligible:
        by_node.setdefault(int(cluster.node_of[i]), []).append(i)
    chosen: list[tuple[int, int, str]] = []
    for node in order:
        if not (room > 0).all():
            break
        for i in sorted(by_node.get(int(node), []), key=lambda i: (QOS_TIER.get(cluster.specs[i].qos, 1), i)):
            if len(chosen) >= allowed:
                return chosen
            chosen.append((i, -1, "high-node-utilization"))
            spec = cluster.specs[i]
            room -= (spec.cpu_milli, spec.memory_mib, spec.gpu_request_milli, 1)
            if not (room > 0).all():
                break
    return chosen


def run_rebalanced(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    scorer: Scorer,
    seed: int,
    typical: TypicalPods,
    rebalancer: str,
    settings: DynamicSettings | None = None,
    rebalancing: RebalancerSettings | None = None,
    policy_name: str | None = None,
) -> tuple[DynamicResult, RebalanceStats]:
    """One living-cluster run of ``scorer`` on ``seed`` with a rebalancer (``none`` too: the same loop)."""
    start = time.perf_counter()
    name = scorer.name if policy_name is None else policy_name
    cluster = LivingCluster(nodes, pods, seed, typical, settings or DynamicSettings(), name)
    hook = None
    rebalancing = rebalancing or RebalancerSettings()
    if rebalancer.startswith(LEARNED):
        plan, _ = read_weights_file(rebalancer[len(LEARNED) :])
        rebalancer, rebalancing = "heuristic-usage", replace(rebalancing, plan=plan)  # the same planner
    if rebalancer != "none":
        hook = RebalanceHook(rebalancer, rebalancing, typical, scorer)
        cluster.tick_hooks.append(hook)
    for i in cluster.decisions():
        serve_pod(cluster, i, scorer)  # the delay head too, as in run_dynamic
    result = cluster.finish(time.perf_counter() - start)
    if hook is None:
        return result, RebalanceStats()
    hook.settle(cluster)
    return result, hook.stats
