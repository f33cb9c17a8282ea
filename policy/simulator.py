"""The FGD evaluation protocol: schedule an inflated arrival sequence once, pod by pod.

Protocol (docs/simulator.md, after the FGD paper's artifact): no departures; pods arrive one at a time in the
seeded, inflated order; a pod with no feasible node fails and is never retried; after every pod
the arrived GPU demand (failed pods included) and the allocated GPU milli are recorded. The
allocation curve at ``x`` % is the mean allocated % over the pod events whose arrived % rounds to
``x``; the headline is the unallocated GPU % at 100 % arrival, ``100 − curve[100]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cluster import LATENCY_SENSITIVE, ClusterState, NodeSpec, PodRequest, PodSpec
from .decision import decide
from .fragmentation import Fragmentation
from .scorers import Scorer, TieBreak, make_scorer
from .typical import TypicalPods, typical_pods
from .workload import DEFAULT_TARGET, inflate


@dataclass
class RunResult:
    """One policy on one seed."""

    policy: str
    seed: int
    curve: dict[int, float]
    """Arrived GPU % → mean allocated GPU % over the pod events at that arrived %."""
    pods: int
    failed_pods: int
    failed_gpu_pods: int
    failed_gpu_milli: int
    gpu_capacity_milli: int
    frag_at_100: float
    """FGD fragmentation of the cluster when arrivals first reach 100 %, as % of GPU capacity (at the
    end of the arrivals when they never do): measured at arrived % :attr:`frag_read_at`."""
    seconds: float
    placements: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list, repr=False)
    """(pod, node, cards) for every placed pod, when asked for."""
    frag_read_at: int | None = None
    """The arrived % (a point of :attr:`curve`) :attr:`frag_at_100` was measured at: 100, or past it when
    one pod took the arrivals over 100 %, or the last point when they never reached it; None when unknown
    (a result built by hand)."""

    def read_at(self, pct: int) -> int | None:
        """The point of the curve a figure "at ``pct`` %" is read from: ``pct`` itself when the curve has
        it, else the nearest recorded point below (arrivals that ended short of ``pct``, or one pod that
        took them over it); None when there is no point at or below ``pct``."""
        if pct in self.curve:
            return pct
        below = [x for x in self.curve if x <= pct]
        return max(below) if below else None

    def allocated_at(self, pct: int) -> float:
        """Allocated GPU % at ``pct`` % arrival (the nearest recorded point below if absent: :meth:`read_at`)."""
        point = self.read_at(pct)
        return self.curve[point] if point is not None else 0.0

    def unallocated_at(self, pct: int) -> float:
        """Unallocated GPU % at ``pct`` % arrival: the headline figure at 100."""
        return 100.0 - self.allocated_at(pct)

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "unallocated_gpu_pct_at_100": round(self.unallocated_at(100), 4),
            "unallocated_gpu_pct_at_130": round(self.unallocated_at(130), 4) if self.curve else None,
            "pods": self.pods,
            "failed_pods": self.failed_pods,
            "failed_gpu_pods": self.failed_gpu_pods,
            "failed_gpu_milli": self.failed_gpu_milli,
            "frag_pct_at_100": round(self.frag_at_100, 4),
            "seconds": round(self.seconds, 3),
        }


class RequestCache:
    """Pod specs → :class:`PodRequest` for one cluster; clones share one entry."""

    def __init__(self, state: ClusterState):
        self.state = state
        self._cache: dict[tuple[Any, ...], PodRequest] = {}

    def __call__(self, pod: PodSpec) -> PodRequest:
        key = (
            pod.cpu_milli,
            pod.memory_mib,
            pod.num_gpu,
            pod.gpu_milli,
            pod.gpu_models,
            pod.qos in LATENCY_SENSITIVE,
            pod.cpu_prediction,  # TargetLoadPacking predicts by it (a Kubernetes pod's limits)
        )
        req = self._cache.get(key)
        if req is None:
            req = self._cache[key] = self.state.request(pod)
        return req


class ProtocolMeter:
    """The protocol's measurement, pod by pod, after each pod's placement (or failure): arrived and
    allocated GPU milli into the curve, failures, and FGD fragmentation when arrivals first reach
    100 %. :func:`run_sequence` uses it, and so does anything that measures placements made
    elsewhere (``hack/replay_openb.py`` reads them back from a real cluster)."""

    def __init__(self, state: ClusterState, typical: TypicalPods):
        self.state = state
        self.capacity = state.gpu_milli_capacity
        self._measure = Fragmentation(typical, state.model_names)
        self.arrived = self.allocated = 0
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}
        self.failed = self.failed_gpu = self.failed_milli = 0
        self._frag_at_100: float | None = None
        self._frag_pct: int | None = None

    def record(self, req: PodRequest, placed: bool, failed: bool | None = None) -> None:
        """One arrival; ``state`` already holds the pod when ``placed``. ``failed`` defaults to
        ``not placed`` (False: neither placed nor counted as failed)."""
        if placed:
            self.allocated += req.gpu_total
        elif failed is None or failed:
            self.failed += 1
            if req.is_gpu:
                self.failed_gpu += 1
                self.failed_milli += req.gpu_total
        self.arrived += req.gpu_total
        pct = math.floor(self.arrived * 100 / self.capacity + 0.5)
        self._sums[pct] = self._sums.get(pct, 0.0) + self.allocated * 100 / self.capacity
        self._counts[pct] = self._counts.get(pct, 0) + 1
        if self._frag_at_100 is None and pct >= 100:
            self._frag_at_100 = self.frag_now()
            self._frag_pct = pct

    def frag_now(self) -> float:
        return self._measure.cluster_frag(self.state) * 100 / self.capacity

    def result(
        self,
        policy: str,
        seed: int,
        pods: int,
        seconds: float,
        placements: list[tuple[str, str, tuple[int, ...]]] | None = None,
    ) -> RunResult:
        curve = {pct: self._sums[pct] / self._counts[pct] for pct in sorted(self._sums)}
        return RunResult(
            policy=policy,
            seed=seed,
            curve=curve,
            pods=pods,
            failed_pods=self.failed,
            failed_gpu_pods=self.failed_gpu,
            failed_gpu_milli=self.failed_milli,
            gpu_capacity_milli=self.capacity,
            frag_at_100=self._frag_at_100 if self._frag_at_100 is not None else self.frag_now(),
            seconds=seconds,
            placements=placements or [],
            frag_read_at=self._frag_pct if self._frag_pct is not None else max(curve, default=None),
        )


def run_sequence(
    nodes: Sequence[NodeSpec],
    sequence: Sequence[PodSpec],
    scorer: Scorer,
    seed: int,
    typical: TypicalPods,
    policy_name: str | None = None,
    record_placements: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Schedule ``sequence`` on a fresh cluster with ``scorer`` and measure the allocation curve."""
    start = time.perf_counter()
    state = ClusterState(nodes)
    requests = RequestCache(state)
    tiebreak = TieBreak.seeded(state.num_nodes, seed)  # separate from the workload's stream
    meter = ProtocolMeter(state, typical)
    placements: list[tuple[str, str, tuple[int, ...]]] = []
    for i, pod in enumerate(sequence):
        req = requests(pod)
        decision = decide(scorer, state, req, tiebreak)
        if decision is not None:
            state.place(req, decision.node, decision.cards)
            if record_placements:
                placements.append((pod.name, state.names[decision.node], decision.cards))
        meter.record(req, placed=decision is not None)
        if progress is not None and i % 512 == 0:
            progress(i)
    return meter.result(policy_name or scorer.name, seed, len(sequence), time.perf_counter() - start, placements)


def run_fgd_protocol(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    policy: str | Scorer,
    seed: int,
    target: float = DEFAULT_TARGET,
    typical: TypicalPods | None = None,
    record_placements: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """One policy, one seed, the FGD protocol: typical pods from ``pods``, inflation, scheduling."""
    typical = typical or typical_pods(pods)
    scorer = make_scorer(policy, typical) if isinstance(policy, str) else policy
    capacity = ClusterState(nodes).gpu_milli_capacity
    sequence = inflate(pods, capacity, seed, target)
    name = policy if isinstance(policy, str) else policy.name
    return run_sequence(nodes, sequence, scorer, seed, typical, name, record_placements, progress)
