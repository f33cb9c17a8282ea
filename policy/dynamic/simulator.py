"""The living-cluster simulator: arrivals, departures, a pending queue, usage, load and cost.

One run, in order:

1. Draw the run's pods (:mod:`.arrivals`): the steady-state population at time 0, then Poisson
   arrivals over the measured window. Draw each pod's usage (:mod:`.usage`). Both come from
   streams of their own, so every policy sees the same pods, times and usage for a seed (common
   random numbers: differences between policies are the policies').
2. Place the initial population, oldest first, with the policy under test; a scrape after every
   1 % of it gives load-aware policies the load of what is already placed.
3. Replay the window: departures, arrivals and scrapes in time order (departures first at equal
   times). A pod that fits nowhere waits in the pending queue; after a departure from node ``n``
   only ``n`` gained room, so each waiting pod is tried again if it fits there (kube-scheduler
   retries unschedulable pods on cluster events; it does not hold the line in FIFO order). A pod
   that could not fit even on an empty node (or has no node of its GPU model) is rejected at once.
4. At every scrape (``ScrapeSettings.interval_s``) take the true usage of every running pod and
   sum it per node: that is the ground truth for SLA accounting over the following interval, and,
   with noise, misses and staleness, what the scheduler sees next (:mod:`.scrape`).

Measured over the window only (:class:`DynamicResult`): time-averaged GPU allocation and FGD
fragmentation ("stranded GPUs"), queueing delay (arrival → placement; pods still waiting at the
end count with the wait so far), SLA violations (node-seconds above a utilization threshold, and
the latency-sensitive pods on such nodes), cost (price × busy node time) and rejected pods.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import ClusterState, NodeSpec, Placement, PodSpec
from ..decision import decide
from ..feasibility import fits_on, unresolvable_mask
from ..fragmentation import Fragmentation
from ..resources import MILLI_PER_CARD
from ..scorers import Scorer, TieBreak
from ..simulator import RequestCache
from ..typical import TypicalPods
from .arrivals import Arrival, ArrivalSettings, arrival_rate, draw_arrivals
from .objective import DynamicResult, SlaSettings
from .scrape import LoadScraper, ScrapeSettings
from .usage import UsageModel, UsageSettings

DEPART, SCRAPE, ARRIVE = 0, 1, 2
"""Event kinds, in the order they apply at equal times."""
LATENCY_SENSITIVE = frozenset({"LS", "Guaranteed"})
"""QoS classes counted as latency-sensitive for SLA purposes (openb's LS; Kubernetes' Guaranteed)."""


@dataclass(frozen=True)
class DynamicSettings:
    """Everything a living-cluster run needs besides the cluster, the pods and the policy."""

    arrivals: ArrivalSettings = field(default_factory=ArrivalSettings)
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    sla: SlaSettings = field(default_factory=SlaSettings)
    usage: UsageSettings = field(default_factory=UsageSettings)


class _Run:
    """The mutable state of one run (kept in one place so the event handlers stay small)."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pods: Sequence[PodSpec],
        scorer: Scorer,
        seed: int,
        typical: TypicalPods,
        settings: DynamicSettings,
    ):
        self.state = ClusterState(nodes)
        self.scorer = scorer
        self.settings = settings
        self.requests = RequestCache(self.state)
        self.tiebreak = TieBreak.seeded(self.state.num_nodes, seed)
        self.measure = Fragmentation(typical, self.state.model_names)
        workload_rng, usage_rng, self.noise_rng, tick_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence([seed, 7]).spawn(4)
        )
        self.tick_base = int(tick_rng.integers(2**31))
        self.rate = arrival_rate(pods, self.state.gpu_milli_capacity, settings.arrivals)
        self.arrivals: list[Arrival] = draw_arrivals(
            pods, self.state.gpu_milli_capacity, settings.arrivals, workload_rng
        )
        self.specs = [pods[a.pod] for a in self.arrivals]
        self.usage_model = UsageModel(settings.usage)
        self.usage = self.usage_model.draw(self.specs, usage_rng)
        a = len(self.arrivals)
        self.cpu_req = np.array([p.cpu_milli for p in self.specs], dtype=np.float64)
        self.mem_req = np.array([p.memory_mib for p in self.specs], dtype=np.float64)
        self.gpu_req = np.array([p.gpu_request_milli for p in self.specs], dtype=np.float64)
        self.latency_sensitive = np.array([p.qos in LATENCY_SENSITIVE for p in self.specs])
        self.node_of = np.full(a, -1, dtype=np.int64)
        self.placements: dict[int, Placement] = {}
        self.placed_at = np.full(a, np.nan)
        self.waiting: list[int] = []
        self.rejected: list[int] = []
        self.scraper = LoadScraper(self.state.num_nodes, settings.scrape)
        self.events: list[tuple[float, int, int]] = []
        self.cpu_cap = self.state.cpu_cap.astype(np.float64)
        self.mem_cap = self.state.mem_cap.astype(np.float64)
        self.gpu_cap = np.maximum(self.state.gpu_count * MILLI_PER_CARD, 1).astype(np.float64)

    # -- placing -------------------------------------------------------------------------------
    def try_place(self, i: int, now: float) -> bool:
        req = self.requests(self.specs[i])
        decision = decide(self.scorer, self.state, req, self.tiebreak)
        if decision is None:
            return False
        self.placements[i] = self.state.place(req, decision.node, decision.cards)
        self.node_of[i] = decision.node
        self.placed_at[i] = now
        heapq.heappush(self.events, (now + self.arrivals[i].lifetime, DEPART, i))
        return True

    def arrive(self, i: int, now: float) -> None:
        req = self.requests(self.specs[i])
        if unresolvable_mask(self.state, req).all():
            self.rejected.append(i)  # could not fit even on an empty node: waiting would be forever
            return
        if not self.try_place(i, now):
            self.waiting.append(i)

    def depart(self, i: int, now: float) -> None:
        placement = self.placements.pop(i)
        self.state.release(placement)
        self.node_of[i] = -1
        node = placement.node
        still: list[int] = []
        for j in self.waiting:
            if fits_on(self.state, self.requests(self.specs[j]), node) and self.try_place(j, now):
                continue
            still.append(j)
        self.waiting = still

    # -- measuring -----------------------------------------------------------------------------
    def node_usage(self, tick: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """True per-node (cpu, memory, GPU) utilization fractions at scrape ``tick``."""
        running = np.flatnonzero(self.node_of >= 0)
        # Every pod's sample is drawn, running or not, so a pod's usage at a tick is the same
        # whichever policy placed it (common random numbers across policies).
        rng = np.random.default_rng([self.tick_base, tick + 1_000_000])
        everyone = np.arange(len(self.arrivals))
        cpu_f, mem_f, gpu_f = (x[running] for x in self.usage_model.instant(self.usage, everyone, rng))
        where = self.node_of[running]
        n = self.state.num_nodes
        cpu = np.bincount(where, cpu_f * self.cpu_req[running], minlength=n) / self.cpu_cap
        mem = np.bincount(where, mem_f * self.mem_req[running], minlength=n) / self.mem_cap
        gpu = np.bincount(where, gpu_f * self.gpu_req[running], minlength=n) / self.gpu_cap
        return cpu, mem, gpu


def run_dynamic(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    scorer: Scorer,
    seed: int,
    typical: TypicalPods,
    settings: DynamicSettings | None = None,
    policy_name: str | None = None,
) -> DynamicResult:
    """One living-cluster run of ``scorer`` on ``seed`` (see the module docstring)."""
    settings = settings or DynamicSettings()
    start = time.perf_counter()
    run = _Run(nodes, pods, scorer, seed, typical, settings)
    state, sla = run.state, settings.sla
    interval = settings.scrape.interval_s
    window = settings.arrivals.window_s
    initial = [i for i, a in enumerate(run.arrivals) if a.time < 0]
    step = max(1, len(initial) // 100)
    for k, i in enumerate(initial):
        run.arrive(i, 0.0)
        if k % step == step - 1:
            cpu, mem, _ = run.node_usage(-1 - k)
            run.scraper.scrape(0.0, cpu, mem, run.noise_rng)
            run.scraper.publish(state, 0.0)
    run.placed_at[initial] = np.nan  # the start's population is not part of the measured delays
    for i, a in enumerate(run.arrivals):
        if a.time >= 0:
            run.events.append((a.time, ARRIVE, i))
    ticks = int(window // interval)
    run.events.extend((k * interval, SCRAPE, k) for k in range(ticks))
    heapq.heapify(run.events)
    result = DynamicResult.start(scorer.name if policy_name is None else policy_name, seed, state, run.rate)
    result.initial_pods = len(initial)
    result.initial_waiting = len(run.waiting)
    result.rejected_initial = len(run.rejected)
    rejected_before = set(run.rejected)
    while run.events:
        now, kind, i = heapq.heappop(run.events)
        if now >= window:
            break
        if kind == DEPART:
            run.depart(i, now)
        elif kind == ARRIVE:
            run.arrive(i, now)
        else:
            cpu, mem, gpu = run.node_usage(i)
            busy = state.cpu_free < state.cpu_cap
            result.add_interval(
                seconds=min(interval, window - now),
                allocated_gpu_milli=state.gpu_milli_allocated,
                frag_milli=run.measure.cluster_frag(state),
                hot=(cpu > sla.cpu_threshold) | (gpu > sla.gpu_threshold),
                ls_pods_per_node=np.bincount(
                    run.node_of[run.latency_sensitive & (run.node_of >= 0)], minlength=state.num_nodes
                ),
                busy=busy,
                waiting=len(run.waiting),
                price=state.price,
            )
            run.scraper.scrape(now, cpu, mem, run.noise_rng)
            result.stale_node_scrapes += run.scraper.publish(state, now)
    rejected = set(run.rejected) - rejected_before
    measured = [i for i, a in enumerate(run.arrivals) if 0 <= a.time < window and i not in rejected]
    arrived = np.array([run.arrivals[i].time for i in measured])
    placed = run.placed_at[measured]
    waits = np.where(np.isnan(placed), window - arrived, placed - arrived)
    result.finish(
        waits=waits,
        still_waiting=int(np.isnan(placed).sum()),
        rejected=len(rejected),
        scrape_misses=run.scraper.misses,
        seconds=time.perf_counter() - start,
    )
    return result


def describe(settings: DynamicSettings) -> dict[str, Any]:
    """The settings as plain data, for reports."""
    from dataclasses import asdict

    return asdict(settings)
