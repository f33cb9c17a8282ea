"""Event-driven simulation: pods arrive at ``creation_time`` and leave at ``deletion_time``.

Unlike the FGD protocol (arrivals only), this replays the trace's own timeline, so capacity is
freed as pods finish. Events at the same time apply departures first. A pod that finds no
feasible node fails (it is not retried) unless ``retry_failed`` is set, in which case it waits in
a FIFO queue that is retried after every departure (like an unschedulable queue flushed on
cluster events); a waiting pod whose deletion time passes before it fits never runs and counts as
failed. Metrics are time-weighted over the replay.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .cluster import ClusterState, NodeSpec, Placement, PodSpec
from .decision import decide
from .fragmentation import Fragmentation
from .scorers import Scorer, TieBreak
from .simulator import RequestCache
from .typical import TypicalPods

ARRIVE, DEPART = 1, 0  # departures sort first at equal times


@dataclass
class EventRunResult:
    """One event-driven replay."""

    policy: str
    seed: int
    pods: int
    placed: int
    failed_pods: int
    mean_allocated_gpu_pct: float
    """Time-weighted mean of allocated GPU milli / capacity."""
    mean_frag_pct: float
    """Time-weighted mean of FGD fragmentation / capacity, sampled at every event."""
    peak_allocated_gpu_pct: float
    mean_wait_seconds: float
    """Mean time from arrival to placement over placed pods (0 without ``retry_failed``)."""
    seconds: float
    timeline: list[tuple[float, float]] = field(default_factory=list, repr=False)
    """(time, allocated GPU %) after every event."""

    def summary(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "timeline"}


def run_events(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    scorer: Scorer,
    seed: int,
    typical: TypicalPods,
    retry_failed: bool = False,
    policy_name: str | None = None,
) -> EventRunResult:
    """Replay ``pods`` by their creation and deletion times."""
    missing = [p.name for p in pods if p.creation_time is None]
    if missing:
        raise ValueError(
            f"event-driven replay needs creation_time on every pod; {len(missing)} pod(s) lack it "
            f"(first: {missing[0]}). Use the FGD protocol for traces without times."
        )
    start = time.perf_counter()
    state = ClusterState(nodes)
    requests = RequestCache(state)
    tiebreak = TieBreak.seeded(state.num_nodes, seed)
    measure = Fragmentation(typical, state.model_names)
    capacity = state.gpu_milli_capacity or 1
    events: list[tuple[float, int, int]] = [(float(p.creation_time), ARRIVE, i) for i, p in enumerate(pods)]  # type: ignore[arg-type]
    heapq.heapify(events)
    placements: dict[int, Placement] = {}
    arrived_at: dict[int, float] = {}
    waiting: deque[int] = deque()
    failed = placed = 0
    waits: list[float] = []
    allocated = 0
    area_alloc = area_frag = 0.0
    peak = 0.0
    last_t: float | None = None
    last_frag = 0.0
    timeline: list[tuple[float, float]] = []

    def try_place(i: int, now: float) -> bool:
        nonlocal allocated, placed
        pod = pods[i]
        req = requests(pod)
        decision = decide(scorer, state, req, tiebreak)
        if decision is None:
            return False
        placements[i] = state.place(req, decision.node, decision.cards)
        allocated += req.gpu_total
        placed += 1
        waits.append(now - arrived_at[i])
        if pod.deletion_time is not None:
            heapq.heappush(events, (float(pod.deletion_time), DEPART, i))
        return True

    while events:
        now, kind, i = heapq.heappop(events)
        if last_t is not None and now > last_t:
            area_alloc += (now - last_t) * allocated
            area_frag += (now - last_t) * last_frag
        if kind == ARRIVE:
            arrived_at[i] = now
            if not try_place(i, now):
                if retry_failed:
                    waiting.append(i)
                else:
                    failed += 1
        else:
            placement = placements.pop(i)
            state.release(placement)
            allocated -= placement.milli_per_card * len(placement.cards)
            for _ in range(len(waiting)):
                j = waiting.popleft()
                deleted = pods[j].deletion_time
                if deleted is not None and deleted <= now:
                    failed += 1  # deleted while still waiting: it never ran
                elif not try_place(j, now):
                    waiting.append(j)
        last_t = now
        last_frag = measure.cluster_frag(state)
        pct = allocated * 100 / capacity
        peak = max(peak, pct)
        timeline.append((now, pct))
    failed += len(waiting)
    span = (timeline[-1][0] - timeline[0][0]) if len(timeline) > 1 else 0.0
    return EventRunResult(
        policy=policy_name or scorer.name,
        seed=seed,
        pods=len(pods),
        placed=placed,
        failed_pods=failed,
        mean_allocated_gpu_pct=(area_alloc / span * 100 / capacity) if span else timeline[-1][1] if timeline else 0.0,
        mean_frag_pct=(area_frag / span * 100 / capacity) if span else 0.0,
        peak_allocated_gpu_pct=peak,
        mean_wait_seconds=sum(waits) / len(waits) if waits else 0.0,
        seconds=time.perf_counter() - start,
        timeline=timeline,
    )
