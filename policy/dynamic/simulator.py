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
   retries unschedulable pods on cluster events; it does not hold the line in FIFO order); a node a
   rebalancer's eviction emptied is offered the same way, before the evicted pods come back. A pod
   that could not fit even on an empty node (or has no node of its GPU model) is rejected at once.
   A window that is not a whole number of scrape intervals ends with a shorter interval.
4. At every scrape (``ScrapeSettings.interval_s``) take the true usage of every running pod and
   sum it per node: that is the ground truth for SLA accounting over the following interval, and,
   with noise, misses and staleness, what the scheduler sees next (:mod:`.scrape`). The tick hooks
   (a rebalancer) run right after it; the waiting pods that fit in the room they free and then the
   pods they evicted are offered a node, and only then is the interval recorded: a move counts from
   the scrape it is made at. What the scheduler sees is the latest scrape in ``ClusterState.load``
   (the extender's view, which the feature encoder reads), and for the Trimaran scorers
   load-watcher's 15-minute mean and deviation with the pods bound after the scrape or less than
   60 s before it (:data:`~rlsched.policy.scorers.trimaran.LOAD_WATCHER_VIEW`).
5. Ties: every policy keeps the FGD protocol's seed-fixed node order, except the scorers that stand
   for kube-scheduler plugins (:attr:`Scorer.kube_scheduler_ties`: Trimaran's), whose ties go to a
   uniformly random node among the best as kube-scheduler's ``selectHost`` does, from a stream of
   their own seeded by the run's seed (``TieBreak.ties``).

Measured over the window only (:class:`DynamicResult`): time-averaged GPU allocation and FGD
fragmentation ("stranded GPUs"), queueing delay (one wait per stay in the pending queue: a window
pod's from its arrival to its placement, and a moved pod's from its eviction to its placement
again, so each eviction adds one; pods still waiting at the end count with the wait so far), SLA
violations (node-seconds above a utilization threshold, and the latency-sensitive pods on such
nodes), cost (price × the time a node holds any pod) and rejected pods.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import LATENCY_SENSITIVE, ClusterState, NodeSpec, Placement, PodRequest, PodSpec
from ..decision import decide
from ..delay_head import MAX_HOLDS_PER_POD
from ..feasibility import fits_on, unresolvable_mask
from ..fragmentation import Fragmentation
from ..resources import MILLI_PER_CARD
from ..scorers import Scorer, TieBreak
from ..scorers.trimaran import (
    DEFAULT_REQUESTS_MILLI_CORES,
    DEFAULT_REQUESTS_MULTIPLIER,
    METRICS_AGENT_REPORTING_INTERVAL_S,
    predict_cpu_milli_array,
    set_load_watcher_view,
)
from ..simulator import RequestCache
from ..typical import TypicalPods
from .arrivals import Arrival, ArrivalSettings, arrival_rate, draw_arrivals
from .objective import DynamicResult, SlaSettings
from .scrape import LoadScraper, ScrapeSettings
from .usage import UsageModel, UsageSettings

DEPART, SCRAPE, ARRIVE, RETURN = 0, 1, 2, 3
"""Event kinds, in the order they apply at equal times (RETURN: a held pod comes back)."""
MAX_HOLDS = MAX_HOLDS_PER_POD
"""A policy may hold one pod back at most this often (as in training and in the extender)."""


@dataclass(frozen=True)
class DynamicSettings:
    """Everything a living-cluster run needs besides the cluster, the pods and the policy."""

    arrivals: ArrivalSettings = field(default_factory=ArrivalSettings)
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    sla: SlaSettings = field(default_factory=SlaSettings)
    usage: UsageSettings = field(default_factory=UsageSettings)


class LivingCluster:
    """One run's cluster, pods and clock. :meth:`decisions` yields each pod that needs a decision;
    the caller answers with :meth:`place`, :meth:`hold`, or nothing (the pod waits for room)."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pods: Sequence[PodSpec],
        seed: int,
        typical: TypicalPods,
        settings: DynamicSettings,
        policy_name: str = "",
    ):
        self.state = ClusterState(nodes)
        self.settings = settings
        self.seed = seed
        self.requests = RequestCache(self.state)
        self.tiebreak = TieBreak.seeded(self.state.num_nodes, seed)
        # kube-scheduler's own tie rule for the scorers that stand for its plugins (Trimaran's), from a
        # stream of its own: every other policy's ties and draws are as before
        self.tiebreak.ties = np.random.default_rng([seed, 11])
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
        self.held_until = np.full(a, -np.inf)
        self.remaining = np.array([arr.lifetime for arr in self.arrivals], dtype=np.float64)
        """Seconds each pod still has to run once placed (less after an eviction)."""
        self.ends_at = np.full(a, np.inf)
        self.evictions = 0
        self._freed: list[int] = []
        """Nodes evictions emptied since the last offer of the waiting pods."""
        self._evicted: list[int] = []
        """Pods evicted since then, to be offered again at the same instant."""
        self.requeued_at = np.full(a, np.nan)
        """When each evicted pod went back to the pending queue (NaN: not waiting after an eviction)."""
        self.requeue_waits: list[float] = []
        """Each finished wait after an eviction (eviction → placement again), seconds."""
        self._misses_before = 0
        self.tick_hooks: list[Callable[[LivingCluster], None]] = []
        """Called after every measured scrape with the cluster (a rebalancer evicts pods here), before
        the interval that starts there is recorded."""
        self.holds = np.zeros(a, dtype=np.int64)
        self.waiting: list[int] = []
        self.rejected: list[int] = []
        self.scraper = LoadScraper(self.state.num_nodes, settings.scrape)
        self.events: list[tuple[float, int, int]] = []
        self.now = 0.0
        self.cpu_cap = self.state.cpu_cap.astype(np.float64)
        self.mem_cap = self.state.mem_cap.astype(np.float64)
        self.gpu_cap = np.maximum(self.state.gpu_count * MILLI_PER_CARD, 1).astype(np.float64)
        self.pod_now = (np.zeros(a), np.zeros(a), np.zeros(a))
        """Each pod's (cpu, memory, GPU) usage fractions at the latest scrape."""
        self.true_cpu = np.zeros(self.state.num_nodes)
        self.true_gpu = np.zeros(self.state.num_nodes)
        """True per-node utilization at the latest scrape, kept up to date as pods come and go."""
        u = self.usage
        self.pod_moments = np.stack(
            [
                u.cpu_mean * self.cpu_req,
                (u.cpu_std * self.cpu_req) ** 2,
                u.gpu_mean * self.gpu_req,
                (u.gpu_std * self.gpu_req) ** 2,
            ]
        )
        """float[4, pods]: each pod's lifetime-mean CPU use (millicores) and its scrape-to-scrape variance,
        then the same for GPU (milli)."""
        self.node_moments = np.zeros((4, self.state.num_nodes))
        """float[4, nodes]: :attr:`pod_moments` summed over each node's running pods (:meth:`hot_risk`)."""
        self.bound_at = np.full(a, -np.inf)
        """When each running pod was last bound, in the window (the start's population: −inf)."""
        self.predicted_cpu = predict_cpu_milli_array(
            self.cpu_req.astype(np.int64), DEFAULT_REQUESTS_MILLI_CORES, DEFAULT_REQUESTS_MULTIPLIER
        ).astype(np.float64)
        """Each pod's cpu as TargetLoadPacking predicts it (1.5 × request, 1000m without one)."""
        self.recent = np.zeros(a, dtype=bool)
        """Pods in Trimaran's recently-bound term now (:meth:`_refresh_recent`)."""
        self.recent_cpu = np.zeros(self.state.num_nodes)
        """:attr:`predicted_cpu` summed over each node's :attr:`recent` pods (the view's array, in place)."""
        self._filling = True
        set_load_watcher_view(self.state, *self.scraper.window, self.recent_cpu)
        self.result = DynamicResult.start(policy_name, seed, self.state, self.rate)

    def request(self, i: int) -> PodRequest:
        return self.requests(self.specs[i])

    # -- the caller's answers ------------------------------------------------------------------
    def place(self, i: int, node: int, cards: Sequence[int]) -> None:
        """Put pod ``i`` on ``node`` now; it leaves after its lifetime."""
        self.placements[i] = self.state.place(self.request(i), node, cards)
        self.node_of[i] = node
        if np.isnan(self.placed_at[i]):
            self.placed_at[i] = self.now  # the first placement: the arrival's wait ends here
        if not np.isnan(self.requeued_at[i]):
            self.requeue_waits.append(self.now - self.requeued_at[i])  # placed again after an eviction
            self.requeued_at[i] = np.nan
        self.ends_at[i] = self.now + self.remaining[i]
        heapq.heappush(self.events, (self.ends_at[i], DEPART, i))
        self._usage_moved(i, node, +1.0)
        # bound after the metrics' window ended: in TargetLoadPacking's recently-bound term
        self.bound_at[i] = -np.inf if self._filling else self.now
        self.recent[i] = True
        self.recent_cpu[node] += self.predicted_cpu[i]

    def evict(self, i: int) -> int:
        """Take running pod ``i`` off its node now (a migration): it comes back at once as a pending
        pod with the rest of its lifetime, and goes through a placement decision like any other; its
        wait from now to that placement is one of the run's waits. Returns the node it left."""
        if self.node_of[i] < 0:
            raise ValueError(f"pod {i} is not running")
        self.remaining[i] = max(self.ends_at[i] - self.now, self.settings.arrivals.min_lifetime_s)
        node = self._depart(i)
        self.evictions += 1
        self.requeued_at[i] = self.now
        self._freed.append(node)
        self._evicted.append(i)
        return node

    def running(self) -> np.ndarray:
        """Indices of the pods running now."""
        return np.flatnonzero(self.node_of >= 0)

    def hold(self, i: int, seconds: float) -> None:
        """Keep pod ``i`` back for ``seconds`` although it may fit (the delay action); it comes back then."""
        if seconds <= 0:
            raise ValueError("a hold needs a positive duration")
        self.held_until[i] = self.now + seconds
        self.holds[i] += 1
        heapq.heappush(self.events, (self.now + seconds, RETURN, i))

    def hot_after(self, node: int) -> bool:
        """Whether ``node``'s true utilization is now above the SLA threshold (CPU or GPU)."""
        sla = self.settings.sla
        return bool(self.true_cpu[node] > sla.cpu_threshold or self.true_gpu[node] > sla.gpu_threshold)

    def hot_risk(self, node: int) -> float:
        """The chance that a scrape finds ``node`` above the SLA threshold (CPU or GPU), from its running
        pods' lifetime-mean usage and spread (the usage model's truth, which no policy sees): each sum
        taken as normal, CPU and GPU as independent, clipping at the pods' caps ignored. Training's
        latency-sensitive reward reads it (rlsched.policy.dynamic.env)."""
        sla = self.settings.sla
        cpu_mean, cpu_var, gpu_mean, gpu_var = self.node_moments[:, node]
        p_cpu = _above(sla.cpu_threshold * self.cpu_cap[node], cpu_mean, cpu_var)
        p_gpu = _above(sla.gpu_threshold * self.gpu_cap[node], gpu_mean, gpu_var) if gpu_mean > 0 else 0.0
        return 1.0 - (1.0 - p_cpu) * (1.0 - p_gpu)

    # -- the clock -----------------------------------------------------------------------------
    def decisions(self) -> Iterator[int]:
        """Run the clock; yield every pod that needs a decision (see the module docstring)."""
        window = self.settings.arrivals.window_s
        interval = self.settings.scrape.interval_s
        initial = [i for i, a in enumerate(self.arrivals) if a.time < 0]
        step = max(1, len(initial) // 100)
        for k, i in enumerate(initial):
            yield from self._offer(i)
            if k % step == step - 1:
                self._scrape(-1 - k, record=False)
        self.placed_at[initial] = np.nan  # the start's population is not part of the measured delays
        self._filling = False
        self.result.initial_pods = len(initial)
        self.result.initial_waiting = len(self.waiting)
        self.result.rejected_initial = len(self.rejected)
        self._rejected_before = len(self.rejected)
        self._misses_before = self.scraper.misses
        self.events.extend((a.time, ARRIVE, i) for i, a in enumerate(self.arrivals) if a.time >= 0)
        # a window that is not a whole number of intervals ends with a shorter one (_scrape's seconds)
        self.events.extend((k * interval, SCRAPE, k) for k in range(scrape_ticks(window, interval)))
        heapq.heapify(self.events)
        while self.events:
            now, kind, i = heapq.heappop(self.events)
            if now >= window:
                break
            self.now = now
            if kind == DEPART:
                if self.node_of[i] < 0 or self.ends_at[i] != now:
                    continue  # evicted since: this departure belongs to a placement that no longer exists
                yield from self._offer_waiting(self._depart(i))
            elif kind in (ARRIVE, RETURN):
                yield from self._offer(i)
            else:
                self._scrape(i, record=True)
                for hook in self.tick_hooks:
                    hook(self)
            yield from self._replace_evicted()
            if kind == SCRAPE:
                # after the hooks' moves and their placements: the interval starts with the cluster
                # they left (recorded before them, each move showed one interval late)
                self._record()

    def _replace_evicted(self) -> Iterator[int]:
        """Room evictions freed goes to the pods that waited for it, then the evicted pods come back
        (in pod order), all at the eviction's instant, as a departure's room does."""
        while self._freed or self._evicted:
            freed, self._freed = self._freed, []
            for node in freed:
                yield from self._offer_waiting(node)
            evicted, self._evicted = sorted(self._evicted), []
            for i in evicted:
                yield from self._offer(i)

    def _offer_waiting(self, node: int) -> Iterator[int]:
        """Offer the waiting pods that now fit on ``node`` again, oldest first."""
        for j in list(self.waiting):
            if fits_on(self.state, self.request(j), node):
                self.waiting.remove(j)
                yield from self._offer(j, queued=True)

    def _offer(self, i: int, queued: bool = False) -> Iterator[int]:
        if not queued and unresolvable_mask(self.state, self.request(i)).all():
            self.rejected.append(i)  # could not fit even on an empty node: waiting would be forever
            return
        before = self.held_until[i]
        yield i
        if self.node_of[i] < 0 and self.held_until[i] == before:
            self.waiting.append(i)

    def _depart(self, i: int) -> int:
        placement = self.placements.pop(i)
        self.state.release(placement)
        self.node_of[i] = -1
        self._usage_moved(i, placement.node, -1.0)
        if self.recent[i]:  # a deleted pod leaves Trimaran's cache of bound pods
            self.recent[i] = False
            self.recent_cpu[placement.node] -= self.predicted_cpu[i]
        return placement.node

    def _usage_moved(self, i: int, node: int, sign: float) -> None:
        cpu_f, _, gpu_f = self.pod_now
        self.true_cpu[node] += sign * cpu_f[i] * self.cpu_req[i] / self.cpu_cap[node]
        self.true_gpu[node] += sign * gpu_f[i] * self.gpu_req[i] / self.gpu_cap[node]
        self.node_moments[:, node] += sign * self.pod_moments[:, i]

    def _scrape(self, tick: int, record: bool) -> None:
        """True usage now (every pod drawn, running or not, so a pod's usage at a tick is the same
        whichever policy placed it: common random numbers) and what Prometheus sees (``record``: a
        scrape of the window, whose interval :meth:`_record` accounts)."""
        state = self.state
        rng = np.random.default_rng([self.tick_base, tick + 1_000_000])
        self.pod_now = self.usage_model.instant(self.usage, np.arange(len(self.arrivals)), rng)
        running = np.flatnonzero(self.node_of >= 0)
        where = self.node_of[running]
        n = state.num_nodes
        cpu_f, mem_f, gpu_f = (x[running] for x in self.pod_now)
        self.true_cpu = np.bincount(where, cpu_f * self.cpu_req[running], minlength=n) / self.cpu_cap
        mem = np.bincount(where, mem_f * self.mem_req[running], minlength=n) / self.mem_cap
        self.true_gpu = np.bincount(where, gpu_f * self.gpu_req[running], minlength=n) / self.gpu_cap
        self.scraper.scrape(self.now, self.true_cpu, mem, self.noise_rng)
        stale = self.scraper.publish(state, self.now)
        self._refresh_recent()
        set_load_watcher_view(state, *self.scraper.window, self.recent_cpu)
        if record:
            self.result.stale_node_scrapes += stale

    def _record(self) -> None:
        """SLA accounting, allocation, stranding, cost and queue over the interval that starts now, with
        the cluster as it is now (the scrape's true usage, kept up to date as pods came and went since)."""
        state, sla = self.state, self.settings.sla
        interval, window = self.settings.scrape.interval_s, self.settings.arrivals.window_s
        self.result.add_interval(
            seconds=min(interval, window - self.now),
            allocated_gpu_milli=state.gpu_milli_allocated,
            frag_milli=self.measure.cluster_frag(state),
            hot=(self.true_cpu > sla.cpu_threshold) | (self.true_gpu > sla.gpu_threshold),
            ls_pods_per_node=state.ls_pods,
            busy=state.pods > 0,
            waiting=len(self.waiting),
            price=state.price,
            running_pods=int((self.node_of >= 0).sum()),
        )

    def _refresh_recent(self) -> None:
        """Trimaran's recently-bound term after a scrape that ends the metrics' window at ``now``
        (``targetloadpacking.go``): the running pods bound less than 60 s before it. While the start's
        population is placed, no time passes, so each scrape there shows every pod placed before it."""
        if self._filling:
            self.recent[:] = False
        else:
            self.recent = (self.node_of >= 0) & (self.bound_at > self.now - METRICS_AGENT_REPORTING_INTERVAL_S)
        where = self.node_of[self.recent]
        self.recent_cpu[:] = np.bincount(where, self.predicted_cpu[self.recent], minlength=self.state.num_nodes)

    def finish(self, seconds: float) -> DynamicResult:
        """The run's measures (call once :meth:`decisions` is exhausted)."""
        window = self.settings.arrivals.window_s
        rejected = set(self.rejected[getattr(self, "_rejected_before", 0) :])
        measured = [i for i, a in enumerate(self.arrivals) if 0 <= a.time < window and i not in rejected]
        arrived = np.array([self.arrivals[i].time for i in measured])
        placed = self.placed_at[measured]
        # one wait per stay in the queue: the window pods' first, then one per eviction (placed again,
        # or still waiting at the end with the wait so far), the start's population's moves included
        requeued = self.requeued_at[~np.isnan(self.requeued_at)]
        waits = np.concatenate(
            [
                np.where(np.isnan(placed), window - arrived, placed - arrived),
                np.array(self.requeue_waits, dtype=np.float64),
                window - requeued,
            ]
        )
        self.result.holds = int(self.holds.sum())
        self.result.evictions = self.evictions
        self.result.finish(
            waits=waits,
            still_waiting=int(np.isnan(placed).sum()) + len(requeued),
            window_pods=len(measured),
            rejected=len(rejected),
            scrape_misses=self.scraper.misses - self._misses_before,  # the window's scrapes only
            seconds=seconds,
        )
        return self.result


def scrape_ticks(window_s: float, interval_s: float) -> int:
    """Scrapes in a window: one every interval from 0, the last one possibly shorter (a float
    quotient a hair above a whole number, 1740 / 8.7, does not add a scrape of no length)."""
    return math.ceil(window_s / interval_s - 1e-9)


def _above(threshold: float, mean: float, var: float) -> float:
    """P(X > threshold) for X normal with this mean and variance (a step when the variance is 0)."""
    if var <= 0.0:
        return float(mean > threshold)
    return 0.5 * math.erfc((threshold - mean) / math.sqrt(2.0 * var))


def run_dynamic(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    scorer: Scorer,
    seed: int,
    typical: TypicalPods,
    settings: DynamicSettings | None = None,
    policy_name: str | None = None,
    tiebreak: TieBreak | None = None,
) -> DynamicResult:
    """One living-cluster run of ``scorer`` on ``seed`` (see the module docstring). ``tiebreak``
    replaces the seeded tie-break (the real-stack replay uses the extender's, ``TieBreak.by_name``),
    kube-scheduler's random ties for Trimaran included where it carries no ``ties`` stream."""
    start = time.perf_counter()
    cluster = LivingCluster(
        nodes, pods, seed, typical, settings or DynamicSettings(), scorer.name if policy_name is None else policy_name
    )
    if tiebreak is not None:
        cluster.tiebreak = tiebreak
    for i in cluster.decisions():
        serve_pod(cluster, i, scorer)
    return cluster.finish(time.perf_counter() - start)


def serve_pod(cluster: LivingCluster, i: int, scorer: Scorer) -> None:
    """``scorer``'s answer for pod ``i``: placed on the node it picks, held when its delay head (a
    ``verdict`` method) says delay, or left waiting when nothing fits."""
    req = cluster.request(i)
    decision = decide(scorer, cluster.state, req, cluster.tiebreak)
    if decision is None:
        return
    verdict_of = getattr(scorer, "verdict", None)
    if callable(verdict_of) and cluster.arrivals[i].time >= 0 and cluster.holds[i] < MAX_HOLDS:
        verdict = verdict_of(cluster.state, req, decision.feasible, decision.scores)
        if verdict is not None and verdict[0] == "delay":
            cluster.hold(i, float(verdict[2]))
            return
    cluster.place(i, decision.node, decision.cards)


def describe(settings: DynamicSettings) -> dict[str, Any]:
    """The settings as plain data, for reports."""
    from dataclasses import asdict

    return asdict(settings)
