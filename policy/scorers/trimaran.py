"""Trimaran's load-aware scorers: TargetLoadPacking and LoadVariationRiskBalancing.

Ported from kubernetes-sigs/scheduler-plugins at commit 903da7df8279 (``v0.35.4-devel-37``,
2026-08-16): ``pkg/trimaran/targetloadpacking/targetloadpacking.go``,
``pkg/trimaran/loadvariationriskbalancing/{loadvariationriskbalancing,analysis}.go``,
``pkg/trimaran/resourcestats.go`` and the defaults in ``apis/config/v1/defaults.go``. Unlike the
NodeResources scorers (:mod:`.kubernetes`) they score *measured* utilization: a mean (0..1 of the
node) and its standard deviation over the metrics window, per cpu and memory ("What the scorers read",
below); Trimaran's load-watcher reports percents, so ``percent = 100 · load``.

TargetLoadPacking (CPU only; ``T`` = target utilization %, default 40)::

    pod     = Σ containers: limit if set, else round(request · 1.5) if set, else 1000m,  + overhead
    used    = (percent / 100) · capacity                                   # millicores, float
    missing = Σ pods bound to the node recently (below): their predicted cpu, like ``pod``
    P       = 100 · (used + pod + missing) / capacity     (P = 0 when capacity = 0)
    score   = round((100 − T) · P / T + T)          if P ≤ T     (40..100: pack up to the target)
            = round(T · (100 − P) / (100 − T))      if T < P ≤ 100  (T..0: then spread)
            = 0                                     if P > 100

LoadVariationRiskBalancing (per resource r in cpu, memory; margin ``m``, sensitivity ``s``, both 1)::

    μ_r     = clamp((clamp(avg, 0, A) + max(request, 0)) / A, 0, 1)     # A = allocatable
    σ_r     = clamp(clamp(std, 0, A) / A, 0, 1)
    σ_r     = σ_r ** (1 / s)   if s ≥ 0   (s = 0: exponent +Inf, as Go's float 1/0)
    σ_r     = clamp(m · σ_r, 0, 1)
    score_r = (1 − (μ_r + σ_r) / 2) · 100           (0 when A ≤ 0)
    score   = round(min(score_cpu, score_mem)) if both known, else round(the known one), else 0

``round`` is Go's ``math.Round`` (half away from zero, :func:`go_round`), not Python's. What
TargetLoadPacking predicts the pod from: a Kubernetes pod (the extender) carries its containers' cpu
limits and requests and its overhead (:class:`~rlsched.policy.cluster.CpuPrediction`), predicted
container by container as above (:func:`predict_pod_cpu_milli`; init containers are not counted, as
upstream); a trace pod has only a request, so it is one container with ``cpu_milli`` as a *request
without a limit* (×1.5; 0 means "no request" → 1000m). LoadVariationRiskBalancing sees the raw
requests with no default for zero (``GetResourceRequested``); memory is in MiB on both sides (Go's
bytes × 2⁻²⁰).

Missing load, as Trimaran does it: a node without metrics scores the minimum, 0, in both plugins.
TargetLoadPacking scores 0 where the cpu mean is NaN. LoadVariationRiskBalancing counts a resource as
measured when either its mean or its std is known (``GetResourceData``: any metric of that type), an
unknown part reading 0; with neither resource measured the node scores 0. So in the FGD mode (all
load NaN) both score every node 0 and the tie-break order alone places pods.

What the scorers read. Where a simulator models Trimaran's load-watcher it leaves its view in
``state.caches[LOAD_WATCHER_VIEW]`` (:func:`set_load_watcher_view`; the living-cluster simulator does):
the 15-minute mean and standard deviation of cpu and memory (load-watcher's Prometheus provider,
``avg_over_time`` / ``stddev_over_time``), and per node the predicted cpu of the pods bound to it that
the metrics may not show yet. TargetLoadPacking adds that term as ``targetloadpacking.go`` does: every
pod still on the node whose bind time ``t`` is after the metrics window's end ``E`` or less than
``metricsAgentReportingIntervalSeconds`` (60 s) before it (``t > E − 60``), predicted like the pod
being scored. Without a view (the FGD mode, the extender, and a copy of the state, which starts with
no caches) they read :attr:`ClusterState.load` as the mean and :attr:`ClusterState.load_std` as the
deviation, and the recently-bound term is 0. The recently-bound term predicts trace pods (the
living-cluster simulator's), so from their requests alone.

Ties: both set :attr:`Scorer.kube_scheduler_ties`, so where the run's tie-break carries kube-scheduler's
stream (the living-cluster simulator) a tie goes to a uniformly random node among the best, as
kube-scheduler's ``selectHost`` picks; in the FGD protocol and the extender, the fixed order.
"""

from __future__ import annotations

import math

import numpy as np

from ..cluster import LOAD_METRICS, ClusterState, CpuPrediction, PodRequest
from .base import MAX_NODE_SCORE, NodeScores, Scorer

DEFAULT_TARGET_UTILIZATION_PERCENT = 40
"""``DefaultTargetUtilizationPercent``: pack nodes up to 40 % cpu, then spread."""
DEFAULT_REQUESTS_MILLI_CORES = 1000
"""``DefaultRequestsMilliCores``: the predicted cpu of a container with neither request nor limit."""
DEFAULT_REQUESTS_MULTIPLIER = 1.5
"""``DefaultRequestsMultiplier``: a container with a request but no limit is predicted at 1.5× it."""
DEFAULT_SAFE_VARIANCE_MARGIN = 1.0
"""``DefaultSafeVarianceMargin``: the multiple of the (rooted) std added to the mean."""
DEFAULT_SAFE_VARIANCE_SENSITIVITY = 1.0
"""``DefaultSafeVarianceSensitivity``: the std is raised to ``1 / sensitivity``."""

METRICS_AGENT_REPORTING_INTERVAL_S = 60
"""``metricsAgentReportingIntervalSeconds``: a pod bound less than this before the metrics window's end
(or after it) counts in TargetLoadPacking's recently-bound term."""

CPU = LOAD_METRICS.index("cpu")
MEMORY = LOAD_METRICS.index("memory")

LOAD_WATCHER_VIEW = "trimaran-load-watcher"
"""Key in :attr:`ClusterState.caches` of what load-watcher shows the Trimaran scorers, where a simulator
models it (:func:`set_load_watcher_view`): ``(mean, std, recent_cpu, predictor)`` — mean and standard
deviation per node, columns as in :data:`LOAD_METRICS` (cpu and memory at least; 0..1, NaN: no sample
in the window), the predicted cpu
(millicores) of each node's recently bound pods, and the ``(default millicores, multiplier)`` that
predicted it."""


def set_load_watcher_view(
    state: ClusterState,
    mean: np.ndarray,
    std: np.ndarray,
    recent_cpu_milli: np.ndarray,
    default_requests_milli_cores: int = DEFAULT_REQUESTS_MILLI_CORES,
    default_requests_multiplier: float = DEFAULT_REQUESTS_MULTIPLIER,
) -> None:
    """Leave load-watcher's view for the Trimaran scorers on ``state`` (arrays kept by reference: the
    caller may update ``recent_cpu_milli`` in place as pods are bound and leave)."""
    predictor = np.array([default_requests_milli_cores, default_requests_multiplier], dtype=np.float64)
    state.caches[LOAD_WATCHER_VIEW] = (mean, std, recent_cpu_milli, predictor)


def go_round(x: np.ndarray) -> np.ndarray:
    """Go's ``int64(math.Round(x))``: to the nearest integer, halves away from zero (Python rounds them
    to even). Exact for every float: ``x − trunc(x)`` has no rounding error."""
    t = np.trunc(x)
    away = np.abs(x - t) >= 0.5
    rounded: np.ndarray = (t + np.where(away, np.sign(x), 0.0)).astype(np.int64)
    return rounded


# -- TargetLoadPacking -------------------------------------------------------------------------------


def predict_cpu_milli(cpu_milli: int, default_milli: int, multiplier: float) -> int:
    """``PredictUtilisation`` for a trace pod's one container, which has a request (or none) and never a
    limit: ``round(request · multiplier)``, or ``default_milli`` without a request."""
    if cpu_milli <= 0:
        return default_milli
    return int(go_round(np.array(cpu_milli * multiplier)))


def predict_pod_cpu_milli(prediction: CpuPrediction, default_milli: int, multiplier: float) -> int:
    """A Kubernetes pod's predicted cpu (millicores), as ``targetloadpacking.go`` sums it: each container's
    ``PredictUtilisation`` — its limit, else ``round(request · multiplier)``, else ``default_milli`` —
    plus the pod overhead's cpu."""
    requests: list[int] = go_round(np.asarray(prediction.requests_milli, dtype=np.float64) * multiplier).tolist()
    return prediction.limits_milli + sum(requests) + prediction.unset * default_milli


def predict_cpu_milli_array(cpu_milli: np.ndarray, default_milli: int, multiplier: float) -> np.ndarray:
    """:func:`predict_cpu_milli` for many pods at once (int64)."""
    req = np.asarray(cpu_milli, dtype=np.int64)
    predicted: np.ndarray = np.where(req > 0, go_round(req * multiplier), default_milli).astype(np.int64)
    return predicted


def target_load_packing_score(predicted_percent: np.ndarray, target: int) -> np.ndarray:
    """Scores 0..100 from the predicted cpu utilization in percent (node + pod), ``Score``'s branches."""
    p = np.asarray(predicted_percent, dtype=np.float64)
    packed = go_round((100 - target) * p / target + target)
    # 100 − target is 0 only for target 100, where P > target already means P > 100 (score 0).
    spread_room = float(100 - target) if target < 100 else 1.0
    penalised = go_round(target * (100 - p) / spread_room)
    return np.where(p > target, np.where(p > 100, 0, penalised), packed).astype(np.int64)


class TargetLoadPackingScorer(Scorer):
    """Pack cpu utilization up to a target (score rising to 100 at the target), then spread (falling
    to 0 at 100 %). Nodes with unknown cpu load score 0, as in Trimaran."""

    name = "target-load-packing"
    kube_scheduler_ties = True

    def __init__(
        self,
        target_utilization: int = DEFAULT_TARGET_UTILIZATION_PERCENT,
        default_requests_milli_cores: int = DEFAULT_REQUESTS_MILLI_CORES,
        default_requests_multiplier: float = DEFAULT_REQUESTS_MULTIPLIER,
    ):
        # Trimaran's defaulting turns a target ≤ 0 into 40 and sets no upper bound (a target above 100
        # gives scores above 100); we refuse both rather than guess.
        if not 0 < target_utilization <= 100:
            raise ValueError(f"target utilization must be in 1..100 percent (got {target_utilization})")
        if default_requests_milli_cores < 0 or not default_requests_multiplier >= 0:
            raise ValueError("the default cpu request and the requests multiplier must not be negative")
        self.target = int(target_utilization)
        self.default_milli = int(default_requests_milli_cores)
        self.multiplier = float(default_requests_multiplier)

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        view = state.caches.get(LOAD_WATCHER_VIEW)
        missing: np.ndarray | float = 0.0  # recently bound pods the metrics may not show yet
        if view is None:
            util = state.load[nodes, CPU]
        else:
            mean, _, recent, predictor = view
            if (float(predictor[0]), float(predictor[1])) != (float(self.default_milli), self.multiplier):
                raise ValueError(
                    f"the load-watcher view predicted recently bound pods at {predictor[0]:g}m / ×{predictor[1]:g}, "
                    f"this scorer at {self.default_milli}m / ×{self.multiplier:g}"
                )
            util, missing = mean[nodes, CPU], recent[nodes]
        known = ~np.isnan(util)
        percent = np.where(known, util, 0.0) * 100
        capacity = state.cpu_cap[nodes].astype(np.float64)
        used = (percent / 100) * capacity
        if req.cpu_prediction is None:  # a trace pod: its request alone
            pod = float(predict_cpu_milli(req.cpu_milli, self.default_milli, self.multiplier))
        else:
            pod = float(predict_pod_cpu_milli(req.cpu_prediction, self.default_milli, self.multiplier))
        has_cap = capacity != 0
        predicted = np.where(has_cap, 100 * (used + pod + missing) / np.where(has_cap, capacity, 1.0), 0.0)
        return NodeScores(np.where(known, target_load_packing_score(predicted, self.target), 0))


# -- LoadVariationRiskBalancing ----------------------------------------------------------------------


def risk_score(
    capacity: np.ndarray,
    requested: np.ndarray | float,
    used_avg: np.ndarray,
    used_std: np.ndarray,
    margin: float,
    sensitivity: float,
) -> np.ndarray:
    """``computeScore`` (with ``GetMuSigma``): ``(1 − (μ + σ)/2) · 100`` as a float, 0 where capacity ≤ 0.
    All four quantities in one absolute unit (millicores, MiB)."""
    cap = np.asarray(capacity, dtype=np.float64)
    positive = cap > 0
    safe_cap = np.where(positive, cap, 1.0)
    req = np.maximum(np.asarray(requested, dtype=np.float64), 0)
    avg = np.maximum(np.minimum(used_avg, cap), 0)
    std = np.maximum(np.minimum(used_std, cap), 0)
    mu = np.clip((avg + req) / safe_cap, 0, 1)
    sigma = np.clip(std / safe_cap, 0, 1)
    if sensitivity >= 0:
        sigma = np.power(sigma, math.inf if sensitivity == 0 else 1 / sensitivity)
    sigma = np.clip(sigma * margin, 0, 1)
    risk = (mu + sigma) / 2
    return np.where(positive, (1.0 - risk) * MAX_NODE_SCORE, 0.0)


class LoadVariationRiskBalancingScorer(Scorer):
    """Prefer nodes whose cpu and memory risk — mean utilization with the pod plus ``margin`` times the
    utilization's std (rooted by ``sensitivity``) — is lowest; the worse resource decides."""

    name = "load-variation-risk-balancing"
    kube_scheduler_ties = True

    def __init__(
        self,
        safe_variance_margin: float = DEFAULT_SAFE_VARIANCE_MARGIN,
        safe_variance_sensitivity: float = DEFAULT_SAFE_VARIANCE_SENSITIVITY,
    ):
        # Trimaran's defaulting turns a negative margin or sensitivity into 1; we refuse them instead.
        if not safe_variance_margin >= 0 or not safe_variance_sensitivity >= 0:
            raise ValueError("the safe variance margin and sensitivity must not be negative")
        self.margin = float(safe_variance_margin)
        self.sensitivity = float(safe_variance_sensitivity)

    def _resource(
        self, state: ClusterState, nodes: np.ndarray, column: int, capacity: np.ndarray, requested: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(score, measured) for one resource (``CreateResourceStats`` then ``computeScore``)."""
        view = state.caches.get(LOAD_WATCHER_VIEW)
        mean, spread = (state.load, state.load_std) if view is None else view[:2]
        avg, std = mean[nodes, column], spread[nodes, column]
        measured = ~(np.isnan(avg) & np.isnan(std))
        percent_avg = np.nan_to_num(avg, nan=0.0) * 100
        percent_std = np.nan_to_num(std, nan=0.0) * 100
        cap = capacity.astype(np.float64)
        score = risk_score(
            cap, float(requested), percent_avg * cap / 100, percent_std * cap / 100, self.margin, self.sensitivity
        )
        return np.where(measured, score, 0.0), measured

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        cpu, cpu_ok = self._resource(state, nodes, CPU, state.cpu_cap[nodes], req.cpu_milli)
        mem, mem_ok = self._resource(state, nodes, MEMORY, state.mem_cap[nodes], req.memory_mib)
        total = np.where(cpu_ok & mem_ok, np.minimum(cpu, mem), np.maximum(cpu, mem))
        return NodeScores(go_round(total))
