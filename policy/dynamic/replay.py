"""The pure parts of the real-stack dynamic replay (``hack/replay_dynamic.py``, docs/replay.md).

The replay plays one living-cluster run (:mod:`.simulator`) on a real control plane: kube-scheduler
with our extender places the pods, kwok deletes each at the end of its lifetime, and the load
exporter publishes each pod's drawn usage to Prometheus. To compare like with like:

- :func:`draw_slice` takes the run's pods, times, lifetimes and usage from :class:`LivingCluster`
  itself (same seed, same draws as ``run_dynamic``), and :class:`Compression` maps simulated seconds
  to real ones (the real stack runs ``factor`` times faster than the simulated clock).
- :func:`usage_annotation` / :func:`usage_from_annotations` carry a pod's usage model (mean, spread
  and bounds per resource) on the pod, for the exporter to draw one scrape from, as the simulator does;
  :func:`usage_annotation_problem` says why an annotation (anyone can write one) cannot be used.
- :func:`measure_timelines` turns what the real stack did (each pod's creation, binding and
  deletion times, and the node utilization Prometheus holds at each scrape tick) into the simulator's
  measures (:class:`DynamicResult`'s names and units: simulated seconds, percentages). Every measure is
  sampled on the simulator's own grid (one sample per scrape interval, the state at that instant).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cluster import LATENCY_SENSITIVE, NodeSpec, PodSpec
from ..feasibility import unresolvable_mask
from ..typical import TypicalPods
from .objective import wait_summary
from .simulator import DynamicSettings, LivingCluster, scrape_ticks
from .usage import PodUsage

USAGE_ANNOTATION = "rlsched.io/usage"
"""A pod's usage model as JSON (:func:`usage_annotation`); read by ``hack/load_exporter.py --usage-annotations``."""
LIFETIME_ANNOTATION = "rlsched.io/lifetime"
"""How long a pod runs once Running, as a Go duration (``hack/kwok/pod-lifetime.yaml`` deletes it then)."""
ENDS_AT_ANNOTATION = "rlsched.io/ends-at"
"""When a pod ends, as an RFC 3339 time; takes precedence over the lifetime (the steady-state start's pods)."""

_USAGE_KEYS = ("cpu", "mem", "gpu", "cpuStd", "memStd", "gpuStd", "cpuMax", "memMax")
_USAGE_FIELDS = ("cpu_mean", "mem_mean", "gpu_mean", "cpu_std", "mem_std", "gpu_std", "cpu_max", "mem_max")


@dataclass(frozen=True)
class Compression:
    """Simulated time runs ``factor`` times faster on the real stack (``factor`` 6: 1 simulated hour
    in 10 real minutes, and the simulator's 30 s scrape interval is Prometheus' 5 s)."""

    factor: float

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"the compression factor must be positive, got {self.factor}")

    def real(self, sim_s: float) -> float:
        """Real seconds for ``sim_s`` simulated seconds."""
        return sim_s / self.factor

    def sim(self, real_s: float) -> float:
        """Simulated seconds for ``real_s`` real seconds."""
        return real_s * self.factor


@dataclass(frozen=True)
class SlicePod:
    """One pod of the slice, as the replay submits it."""

    index: int
    """Index into the run's arrivals (``LivingCluster.arrivals``)."""
    spec: PodSpec
    arrival_s: float
    """Simulated arrival time; negative for the steady-state start's pods."""
    lifetime_s: float
    """Simulated seconds it runs once placed (for a start pod: what is left of it)."""
    usage: dict[str, float]
    """Its usage model (:func:`usage_annotation`'s content)."""
    latency_sensitive: bool
    rejected: bool
    """No node could hold it even empty: the simulator rejects it at once, kube-scheduler keeps it pending."""

    @property
    def initial(self) -> bool:
        return self.arrival_s < 0


def usage_annotation(usage: PodUsage, i: int, gpu_milli: int, latency_sensitive: bool) -> dict[str, Any]:
    """Pod ``i``'s usage model as annotation content: means, spreads and bounds (fractions of what the
    pod holds, :class:`PodUsage`), the GPU milli it holds and whether it is latency-sensitive."""
    out: dict[str, Any] = {
        key: round(float(getattr(usage, name)[i]), 6) for key, name in zip(_USAGE_KEYS, _USAGE_FIELDS, strict=True)
    }
    out["gpuMilli"] = int(gpu_milli)
    out["ls"] = bool(latency_sensitive)
    return out


def usage_from_annotations(values: Sequence[Mapping[str, Any]]) -> PodUsage:
    """A :class:`PodUsage` over pods from their :func:`usage_annotation` contents (missing keys are 0)."""
    arrays = {
        name: np.array([float(v.get(key, 0.0)) for v in values], dtype=np.float64)
        for key, name in zip(_USAGE_KEYS, _USAGE_FIELDS, strict=True)
    }
    return PodUsage(**arrays)


def parse_usage_annotation(text: str) -> dict[str, Any] | None:
    """The annotation's content, or None when it is not a JSON object."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    return value if isinstance(value, dict) else None


USAGE_LIMIT = 1e6
"""The largest number a usage annotation may hold. Far above anything the model writes (the CPU and
memory caps are about 12 × the request, 8 whole cards are 8000 milli), low enough that no node's sum
of pods can overflow to infinity."""


_MAX_CV = 1e100
"""The largest spread / mean of one resource: past about 1e154 the square in ``UsageModel.instant``'s
lognormal sigma overflows and the draw is NaN."""
_JSON_TYPES = {str: "string", bool: "bool", list: "array", dict: "object", type(None): "null"}


def usage_annotation_problem(value: Mapping[str, Any]) -> str | None:
    """Why a usage annotation's content cannot be used, or None when it can.

    Every means, spread, bound and ``gpuMilli`` that is present must be a finite number in
    ``[0, USAGE_LIMIT]`` (not a bool, not a string), and ``ls`` a bool. The load exporter reads one
    annotation per pod of the cluster and anyone can write them: one bad pod must be skipped on its own,
    not stop every node's refresh, and ``NaN`` must not reach a published series, whose counters would
    then stay ``NaN`` for good (JSON allows neither ``NaN`` nor ``Infinity``, Python's parser does)."""
    for key in (*_USAGE_KEYS, "gpuMilli"):
        if key not in value:
            continue
        v = value[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            return f"{key} is not a number but a JSON {_JSON_TYPES.get(type(v), type(v).__name__)}"
        if not 0 <= v <= USAGE_LIMIT:  # False for NaN too
            return f"{key} is {v!r}, not in [0, {USAGE_LIMIT:g}]"
    for mean, std in (("cpu", "cpuStd"), ("mem", "memStd"), ("gpu", "gpuStd")):
        m, sd = value.get(mean, 0), value.get(std, 0)
        if m > 0 and sd / m > _MAX_CV:  # the scrape's lognormal sigma overflows: NaN draws
            return f"{std} / {mean} is {sd / m:.3g}, above {_MAX_CV:g}"
    if "ls" in value and not isinstance(value["ls"], bool):
        return f"ls is not true or false but a JSON {_JSON_TYPES.get(type(value['ls']), 'number')}"
    return None


def draw_slice(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], seed: int, typical: TypicalPods, settings: DynamicSettings
) -> tuple[LivingCluster, list[SlicePod]]:
    """The run ``run_dynamic(nodes, pods, ..., seed, typical, settings)`` would make: the same
    :class:`LivingCluster` (its arrivals, lifetimes and usage come from the seed alone, not from the
    policy), with each pod as the replay submits it. Start pods first, oldest first, then arrivals."""
    cluster = LivingCluster(nodes, pods, seed, typical, settings)
    out = []
    for i, (arrival, spec) in enumerate(zip(cluster.arrivals, cluster.specs, strict=True)):
        ls = spec.qos in LATENCY_SENSITIVE
        out.append(
            SlicePod(
                index=i,
                spec=spec,
                arrival_s=arrival.time,
                lifetime_s=arrival.lifetime,
                usage=usage_annotation(cluster.usage, i, spec.gpu_request_milli, ls),
                latency_sensitive=ls,
                rejected=bool(unresolvable_mask(cluster.state, cluster.request(i)).all()),
            )
        )
    return cluster, out


def sample_nodes(nodes: Sequence[NodeSpec], count: int, seed: int) -> list[NodeSpec]:
    """``count`` of ``nodes`` chosen without replacement by ``seed``, in their original order
    (deterministic: the same list, seed and count give the same sample)."""
    if count >= len(nodes):
        return list(nodes)
    rng = np.random.default_rng([seed, 12])
    keep = np.sort(rng.choice(len(nodes), size=count, replace=False))
    return [nodes[int(i)] for i in keep]


@dataclass
class PodTimeline:
    """What the real stack did with one pod, in real seconds on one clock (``time.time()``)."""

    pod: SlicePod
    created: float | None = None
    bound: float | None = None
    deleted: float | None = None
    node: str | None = None
    unschedulable: bool = False
    """kube-scheduler marked it ``Unschedulable`` at least once."""

    def running_at(self, t: float) -> bool:
        return self.bound is not None and self.bound <= t and (self.deleted is None or t < self.deleted)


def tick_times(window_s: float, interval_s: float) -> np.ndarray:
    """The simulator's measured scrape ticks in simulated seconds: 0, interval, ... (before the window's end)."""
    return np.arange(scrape_ticks(window_s, interval_s)) * interval_s


def measure_timelines(
    timelines: Sequence[PodTimeline],
    *,
    t0: float,
    compression: Compression,
    window_s: float,
    interval_s: float,
    gpu_capacity_milli: int,
    hot: np.ndarray,
    ls_pods: np.ndarray,
) -> dict[str, float]:
    """The simulator's measures of a real run (names and units of :class:`DynamicResult`).

    ``t0`` is the real time of simulated time 0. ``hot[k, n]`` says whether node ``n`` was above the
    SLA threshold at tick ``k`` (:func:`tick_times`), and ``ls_pods[k, n]`` how many latency-sensitive
    pods it held then, both as Prometheus published them. Allocation is sampled at the same ticks
    from the pods' bound and deleted times. Waits are creation → bound of the window's pods that could
    fit somewhere; a pod still pending at the end counts with its wait so far (as in the simulator).
    """
    ticks = tick_times(window_s, interval_s)
    if hot.shape[0] != len(ticks) or ls_pods.shape != hot.shape:
        raise ValueError(f"hot and ls_pods need {len(ticks)} ticks, got {hot.shape} and {ls_pods.shape}")
    seconds = np.minimum(interval_s, window_s - ticks)
    real_ticks = [t0 + compression.real(float(t)) for t in ticks]
    allocated = np.array(
        [sum(tl.pod.spec.gpu_request_milli for tl in timelines if tl.running_at(t)) for t in real_ticks],
        dtype=np.float64,
    )
    total = float(seconds.sum()) or 1.0
    nodes = hot.shape[1]
    end = t0 + compression.real(window_s)
    measured = [tl for tl in timelines if 0 <= tl.pod.arrival_s < window_s and not tl.pod.rejected]
    waits = []
    for tl in measured:
        if tl.created is None:
            continue
        done = tl.bound if tl.bound is not None and tl.bound < end else end
        waits.append(compression.sim(max(0.0, done - tl.created)))
    wait_mean, wait_p50, wait_p99 = wait_summary(np.array(waits, dtype=np.float64))
    window_all = [tl for tl in timelines if 0 <= tl.pod.arrival_s < window_s]
    return {
        "window_pods": float(len(measured)),
        "mean_allocated_gpu_pct": float((allocated * seconds).sum()) / total * 100 / max(gpu_capacity_milli, 1),
        "wait_mean_s": wait_mean,
        "wait_p50_s": wait_p50,
        "wait_p99_s": wait_p99,
        "still_waiting": float(sum(tl.bound is None or tl.bound >= end for tl in measured)),
        "sla_hot_node_pct": float((hot.sum(axis=1) * seconds).sum()) / total * 100 / max(nodes, 1),
        "sla_ls_pod_seconds": float(((ls_pods * hot).sum(axis=1) * seconds).sum()),
        "rejected": float(sum(tl.pod.rejected and (tl.bound is None or tl.bound >= end) for tl in window_all)),
    }


@dataclass(frozen=True)
class Tolerance:
    """How far a real-stack measure may be from the simulator's: ``|real − sim| ≤ max(absolute, relative·|sim|)``."""

    absolute: float
    relative: float

    def allows(self, real: float, sim: float) -> bool:
        return abs(real - sim) <= max(self.absolute, self.relative * abs(sim))


def relative_difference(real: float, sim: float) -> float | None:
    """(real − sim) ÷ |sim|; None when sim is 0."""
    return (real - sim) / abs(sim) if sim else None


def compare(
    real: Mapping[str, float], sim: Mapping[str, float], tolerances: Mapping[str, Tolerance]
) -> list[dict[str, Any]]:
    """One row per toleranced measure: both values, the relative difference and whether it is within."""
    rows = []
    for name, tol in tolerances.items():
        r, s = float(real[name]), float(sim[name])
        rows.append(
            {
                "metric": name,
                "real": r,
                "sim": s,
                "relDiff": relative_difference(r, s),
                "tolerance": {"absolute": tol.absolute, "relative": tol.relative},
                "ok": tol.allows(r, s),
            }
        )
    return rows


def format_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side table (Markdown)."""
    lines = [
        "| metric | real stack | simulator | rel. diff | tolerance | within |",
        "|---|---:|---:|---:|---|:-:|",
    ]
    for row in rows:
        rel = "n/a" if row["relDiff"] is None else f"{100 * row['relDiff']:+.1f} %"
        tol = row["tolerance"]
        lines.append(
            f"| {row['metric']} | {row['real']:.3f} | {row['sim']:.3f} | {rel} | "
            f"max({tol['absolute']:g}, {100 * tol['relative']:g} %) | {'yes' if row['ok'] else 'NO'} |"
        )
    return "\n".join(lines)
