"""What a living-cluster run measures, and the one number that weighs it.

Every quantity is averaged over the measured window, sampled at each scrape (allocation too: a pod
placed and gone between two scrapes is not seen — against the exact integral, at most 0.004 points
on the openb runs); queueing delays are exact:

- ``mean_allocated_gpu_pct`` — GPU milli held by pods ÷ capacity.
- ``stranded_gpu_pct`` — FGD's fragmentation (free GPU that the typical pods cannot use) ÷ capacity.
- ``wait_p50_s`` / ``wait_p99_s`` / ``wait_mean_s`` — one wait per stay in the pending queue: arrival →
  placement of the window's pods, and eviction → placement again for each pod a rebalancer moved (as
  in a cluster, where the evicted pod's replacement is a new pod that queues); a pod still waiting at
  the end counts with the wait so far (a lower bound), and in ``still_waiting``.
- ``sla_hot_node_pct`` — node-seconds with true CPU or GPU utilization above the threshold ÷ all
  node-seconds; ``sla_ls_pod_seconds`` — latency-sensitive pod-seconds spent on such nodes (what a
  rebalancer would try to cut).
- ``cost_pct`` — price × busy node time ÷ price × all node time (a node is busy while any pod runs
  on it; an idle node could be scaled down).
- ``rejected`` — pods that could never fit (no node of their size or GPU model).

The objective is ``−(β·latency + (1−β)·cost + w_sla·SLA + w_stranded·stranded)`` with latency =
mean wait ÷ ``latency_scale_s`` and the others the fractions above; β and the weights are settings
(``SchedulingPolicy.spec.objective`` in a cluster).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import ClusterState


@dataclass(frozen=True)
class SlaSettings:
    """When a node counts as violating its SLA."""

    cpu_threshold: float = 0.9
    """True CPU use ÷ capacity above this is a violation (assumption: a node past 90 % CPU makes its
    latency-sensitive pods queue for CPU; Trimaran's own default target is lower, 40 %, because it
    aims at headroom, not at a violation)."""
    gpu_threshold: float = 0.9
    """True GPU utilization (÷ the node's cards) above this is a violation (assumption, like CPU)."""

    def __post_init__(self) -> None:
        if not (0 < self.cpu_threshold <= 1 and 0 < self.gpu_threshold <= 1):
            raise ValueError("SLA thresholds must be in (0, 1]")


@dataclass(frozen=True)
class ObjectiveWeights:
    """How one run's measures combine into one number (higher is better)."""

    beta: float = 0.5
    """Weight of latency against cost (β in the issue's −(β·latency + (1−β)·cost))."""
    sla: float = 1.0
    """Weight of the hot-node fraction."""
    stranded: float = 1.0
    """Weight of the stranded-GPU fraction."""
    latency_scale_s: float = 300.0
    """Mean wait that counts as latency 1.0 (assumption: five minutes is a long wait for a pod)."""

    def __post_init__(self) -> None:
        if not 0 <= self.beta <= 1 or self.sla < 0 or self.stranded < 0 or self.latency_scale_s <= 0:
            raise ValueError("need 0 <= beta <= 1, non-negative weights and a positive latency scale")


def wait_summary(waits: np.ndarray) -> tuple[float, float, float]:
    """(mean, p50, p99) of queueing delays in seconds; zeros when no pod was measured."""
    if not len(waits):
        return 0.0, 0.0, 0.0
    return float(waits.mean()), float(np.percentile(waits, 50)), float(np.percentile(waits, 99))


def objective_of(measures: Mapping[str, Any], weights: ObjectiveWeights) -> float:
    """The objective of one run's measures (:meth:`DynamicResult.summary`, or a run of the JSON that
    ``rlsched evaluate --mode dynamic`` writes): −(β·latency + (1−β)·cost + w_sla·SLA +
    w_stranded·stranded), higher is better."""
    latency = float(measures["wait_mean_s"]) / weights.latency_scale_s
    return -(
        weights.beta * latency
        + (1 - weights.beta) * float(measures["cost_pct"]) / 100
        + weights.sla * float(measures["sla_hot_node_pct"]) / 100
        + weights.stranded * float(measures["stranded_gpu_pct"]) / 100
    )


@dataclass
class DynamicResult:
    """One living-cluster run of one policy on one seed."""

    policy: str
    seed: int
    arrival_rate_per_s: float
    gpu_capacity_milli: int
    num_nodes: int
    price_total_per_s: float
    initial_pods: int = 0
    initial_waiting: int = 0
    rejected_initial: int = 0
    window_pods: int = 0
    """Pods that arrived in the window (and were not rejected); the waits are theirs and one per eviction."""
    mean_allocated_gpu_pct: float = 0.0
    stranded_gpu_pct: float = 0.0
    wait_mean_s: float = 0.0
    wait_p50_s: float = 0.0
    wait_p99_s: float = 0.0
    still_waiting: int = 0
    mean_waiting: float = 0.0
    sla_hot_node_pct: float = 0.0
    sla_ls_pod_seconds: float = 0.0
    cost_pct: float = 0.0
    rejected: int = 0
    holds: int = 0
    """Times a pod was held back by the policy (the delay action)."""
    evictions: int = 0
    """Pods moved by a rebalancer (evicted and placed again)."""
    pod_hours: float = 0.0
    """Running pod-hours over the window (for migrations per 100 pod-hours)."""
    stale_node_scrapes: int = 0
    scrape_misses: int = 0
    seconds: float = 0.0
    _t: float = field(default=0.0, repr=False)
    _sums: dict[str, float] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, policy: str, seed: int, state: ClusterState, rate: float) -> DynamicResult:
        return cls(
            policy=policy,
            seed=seed,
            arrival_rate_per_s=rate,
            gpu_capacity_milli=max(1, state.gpu_milli_capacity),
            num_nodes=state.num_nodes,
            price_total_per_s=float(state.price.sum()) / 3600.0,
        )

    def add_interval(
        self,
        seconds: float,
        allocated_gpu_milli: int,
        frag_milli: float,
        hot: np.ndarray,
        ls_pods_per_node: np.ndarray,
        busy: np.ndarray,
        waiting: int,
        price: np.ndarray,
        running_pods: int = 0,
    ) -> None:
        """Account ``seconds`` of the window with the cluster as it is now."""
        s = self._sums
        s["alloc"] = s.get("alloc", 0.0) + seconds * allocated_gpu_milli
        s["frag"] = s.get("frag", 0.0) + seconds * frag_milli
        s["hot"] = s.get("hot", 0.0) + seconds * float(hot.sum())
        s["ls_hot"] = s.get("ls_hot", 0.0) + seconds * float(ls_pods_per_node[hot].sum())
        s["busy_price"] = s.get("busy_price", 0.0) + seconds * float(price[busy].sum()) / 3600.0
        s["waiting"] = s.get("waiting", 0.0) + seconds * waiting
        s["pod_seconds"] = s.get("pod_seconds", 0.0) + seconds * running_pods
        self._t += seconds

    def finish(
        self,
        waits: np.ndarray,
        still_waiting: int,
        rejected: int,
        scrape_misses: int,
        seconds: float,
        window_pods: int | None = None,
    ) -> None:
        """Turn the sums into averages (``window_pods``: ``len(waits)`` unless moved pods added waits)."""
        t = self._t or 1.0
        s = self._sums
        self.window_pods = len(waits) if window_pods is None else window_pods
        self.mean_allocated_gpu_pct = s.get("alloc", 0.0) / t * 100 / self.gpu_capacity_milli
        self.stranded_gpu_pct = s.get("frag", 0.0) / t * 100 / self.gpu_capacity_milli
        self.sla_hot_node_pct = s.get("hot", 0.0) / t * 100 / self.num_nodes
        self.sla_ls_pod_seconds = s.get("ls_hot", 0.0)
        whole = self.price_total_per_s
        self.cost_pct = s.get("busy_price", 0.0) / t * 100 / whole if whole else 0.0
        self.mean_waiting = s.get("waiting", 0.0) / t
        self.pod_hours = s.get("pod_seconds", 0.0) / 3600.0
        self.wait_mean_s, self.wait_p50_s, self.wait_p99_s = wait_summary(waits)
        self.still_waiting = still_waiting
        self.rejected = rejected
        self.scrape_misses = scrape_misses
        self.seconds = seconds

    @property
    def migrations_per_100_pod_hours(self) -> float:
        return 100.0 * self.evictions / self.pod_hours if self.pod_hours else 0.0

    def objective(self, weights: ObjectiveWeights) -> float:
        """−(β·latency + (1−β)·cost + w_sla·SLA + w_stranded·stranded); higher is better."""
        return objective_of(self.__dict__, weights)

    def summary(self) -> dict[str, Any]:
        """The public fields, rounded, for JSON."""
        return {
            k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items() if not k.startswith("_")
        }
