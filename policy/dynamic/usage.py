"""What a pod actually uses of what it asked for: the usage model of the living cluster.

A scheduler that reads Prometheus load only learns something if the load behaves like a real
cluster's. So every number here comes from a published measurement of Alibaba's PAI GPU clusters
(the cluster-trace-gpu-v2020 trace behind "MLaaS in the Wild", Weng et al., NSDI'22; the openb trace
of the FGD paper, Weng et al., ATC'23, comes from the same platform and records requests only), and
every gap the measurements leave is a named assumption with its own setting. docs/usage-model.md
lists each source, each quote and each fit.

Shape, and why:

- A pod's **mean** usage over its life is one draw per pod and resource, expressed as a fraction of
  what the pod holds: CPU and memory as a fraction of the request, GPU as a fraction of the allocated
  GPU (a share of one card, or ``num_gpu`` whole cards). The published data are lifetime averages per
  instance (``pai_sensor_table``), so that is the level the model is fitted at.
- GPU: a zero-inflated logit-normal. A third of instances never touch the GPU and the rest spread
  over three orders of magnitude, which a Beta distribution cannot follow (it misses the quoted tail
  by 2.7 pp); the logit-normal meets all three quoted points within 0.3 pp.
- CPU and memory: a lognormal ratio usage / request. The trace shows pods above their CPU request
  (15.5 % of tasks), so the CPU ratio is not bounded by 1.
- Within its life a pod's usage varies around its mean: each Prometheus-like scrape draws a mean-one
  lognormal factor with a per-resource coefficient of variation. No publication of this trace gives
  that variability, so the three coefficients are stated assumptions (settings), not fits.
- Everything is drawn with numpy over arrays of pods, from the caller's ``np.random.Generator``; the
  number of random draws does not depend on the pod mix, so one seed gives the same stream for the
  same number of pods whatever they ask for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from ..cluster import PodSpec

_STANDARD_NORMAL = NormalDist()

FloatArray: TypeAlias = npt.NDArray[np.float64]
"""Float arrays over pods."""


@dataclass(frozen=True)
class UsageSettings:
    """The usage model's numbers: each field says where it comes from, or that it is an assumption.

    Sources (full quotes and the fits in docs/usage-model.md):

    [AN] analysis notebook of cluster-trace-gpu-v2020, github.com/alibaba/clusterdata,
         ``cluster-trace-gpu-v2020/analysis/analysis.ipynb`` (the figures of "MLaaS in the Wild",
         NSDI'22, computed on the full trace; stored outputs), cell "Figure 6: Task resource request
         and usage".
    [AF] affinode.io, "Alibaba PAI GPU Cluster Trace v2020" case study,
         https://affinode.io/case-studies/alibaba-gpu-v2020/case-study.html: a direct analysis of
         ``pai_sensor_table.gpu_wrk_util`` over all 3,033,232 instance records.
    """

    gpu_idle_fraction: float = 0.345
    """Share of GPU pods whose lifetime-mean GPU utilization is exactly zero. [AF]: "One third (34.5%)
    average exactly zero"."""
    gpu_logit_mu: float = -2.7965
    """Mean of logit(utilization) for the GPU pods that are not idle. Fit: least squares of
    ``logit(x) = mu + sigma * Phi^-1((F - idle) / (1 - idle))`` through the three points quoted in [AF]
    (median 1.5 %; 75.4 % of instances below 10 %; "Only 5% of instances average >= 50%")."""
    gpu_logit_sigma: float = 1.9491
    """Standard deviation of logit(utilization) for the non-idle GPU pods; same fit as ``gpu_logit_mu``."""
    cpu_ratio_median: float = 0.147
    """Median of lifetime-mean CPU usage / CPU request. Read from [AN] Figure 6(a) (task CPU request and
    usage CDFs, % of one core): request median 600 %, usage median 88 % (±16 %, one pixel of the stored
    figure), 88 / 600 = 0.147. Assumption: the median of the ratio equals the ratio of the medians."""
    cpu_ratio_sigma: float = 1.894
    """Log-space spread of CPU usage / request. Fit: with the median above, ``P(ratio < 1) = 0.8446``,
    [AN] printed output "cpu: plan > usage: 84.46%, plan < usage: 15.51%"; sigma = ln(1/median) / Phi^-1(0.8446)."""
    mem_ratio_median: float = 0.147
    """Median of lifetime-mean memory usage / memory request. Assumption: equal to the CPU median; the
    trace publishes no memory median ([AN] Figure 6(c) plots GPU memory used against host memory
    requested, a different quantity)."""
    mem_ratio_sigma: float = 1.105
    """Log-space spread of memory usage / request. Fit: with the median above, ``P(ratio < 1) = 0.9588``,
    [AN] printed output "mem: plan > usage: 95.88%, plan < usage: 4.12%" (``avg_mem`` against ``plan_mem``)."""
    cap_quantile: float = 0.99
    """Upper bound of a pod's CPU and memory ratio, as this quantile of the fitted lognormal (about 12x
    the request for CPU, 1.9x for memory with the defaults). Assumption: the trace shows usage above
    request but publishes no limit. A node's summed demand is not capped at its capacity (the SLA count
    reads it); what the simulated Prometheus publishes is, as a real node's series is
    (docs/usage-model.md)."""
    request_bounded_qos: tuple[str, ...] = ("Guaranteed",)
    """QoS classes whose CPU and memory usage never exceed the request. Kubernetes semantics: a
    Guaranteed pod has limits equal to requests (kubernetes.io/docs/concepts/workloads/pods/pod-qos/)."""
    qos_scale: Mapping[str, float] = field(default_factory=dict)
    """Multiplier of the mean CPU, memory and GPU usage per QoS class (``LS``, ``BE``, ``Burstable``,
    ``Guaranteed``); a missing class is 1. Assumption: no difference by default; neither paper
    publishes usage by QoS class."""
    cpu_cv: float = 0.3
    """Coefficient of variation of one scrape's CPU usage around the pod's mean. Assumption (no
    published per-instance temporal variability for this trace)."""
    mem_cv: float = 0.1
    """Coefficient of variation of one scrape's memory usage around the pod's mean. Assumption; the
    trace's ``max_mem`` / ``avg_mem`` per instance would calibrate it, but no distribution of that
    ratio is published."""
    gpu_cv: float = 0.3
    """Coefficient of variation of one scrape's GPU utilization around the pod's mean. Assumption."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.gpu_idle_fraction < 1.0:
            raise ValueError("gpu_idle_fraction must be in [0, 1)")
        for name in ("gpu_logit_sigma", "cpu_ratio_sigma", "mem_ratio_sigma", "cpu_ratio_median", "mem_ratio_median"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be positive")
        if not 0.5 < self.cap_quantile < 1.0:
            raise ValueError("cap_quantile must be in (0.5, 1)")
        for name in ("cpu_cv", "mem_cv", "gpu_cv"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"{name} must not be negative")
        if any(scale < 0.0 for scale in self.qos_scale.values()):
            raise ValueError("qos_scale values must not be negative")

    @property
    def cpu_cap(self) -> float:
        """Upper bound of a pod's CPU usage / request (the ``cap_quantile`` of the fitted lognormal)."""
        return lognormal_quantile(self.cap_quantile, self.cpu_ratio_median, self.cpu_ratio_sigma)

    @property
    def mem_cap(self) -> float:
        """Upper bound of a pod's memory usage / request (the ``cap_quantile`` of the fitted lognormal)."""
        return lognormal_quantile(self.cap_quantile, self.mem_ratio_median, self.mem_ratio_sigma)


@dataclass
class PodUsage:
    """Per-pod usage, arrays indexed like the pods given to :meth:`UsageModel.draw`.

    Fractions: CPU of the CPU request, memory of the memory request, GPU of the allocated GPU (the
    share of one card for a sharing pod, all ``num_gpu`` cards for a whole-GPU pod; 0 for CPU-only
    pods). ``*_std`` is the standard deviation of one scrape around the mean, in the same unit.
    ``cpu_max`` and ``mem_max`` bound every scrape (GPU is bounded by 1).
    """

    cpu_mean: FloatArray
    mem_mean: FloatArray
    gpu_mean: FloatArray
    cpu_std: FloatArray
    mem_std: FloatArray
    gpu_std: FloatArray
    cpu_max: FloatArray
    mem_max: FloatArray

    def __len__(self) -> int:
        return int(self.cpu_mean.shape[0])


class UsageModel:
    """Draws per-pod usage (:meth:`draw`) and one scrape of it (:meth:`instant`); seeded by the caller's rng."""

    def __init__(self, settings: UsageSettings | None = None) -> None:
        self.settings = settings if settings is not None else UsageSettings()

    def draw(self, pods: Sequence[PodSpec], rng: np.random.Generator, qos: Sequence[str] | None = None) -> PodUsage:
        """Each pod's lifetime-mean usage and its scrape-to-scrape spread.

        ``qos`` overrides the pods' QoS classes (default: each pod's ``PodSpec.qos``, the openb ``qos``
        column; an empty class has scale 1 and is not request-bounded).
        Random draws, in order: n CPU normals, n memory normals, n GPU uniforms, n GPU normals, for
        any pod mix.
        """
        s = self.settings
        n = len(pods)
        classes = list(qos) if qos is not None else [pod.qos for pod in pods]
        if len(classes) != n:
            raise ValueError(f"{len(classes)} QoS classes for {n} pods")
        z_cpu = rng.standard_normal(n)
        z_mem = rng.standard_normal(n)
        u_gpu = rng.random(n)
        z_gpu = rng.standard_normal(n)

        scale = np.array([s.qos_scale.get(c, 1.0) for c in classes], dtype=np.float64)
        bounded = np.array([c in s.request_bounded_qos for c in classes], dtype=bool)
        cpu_max = np.where(bounded, 1.0, s.cpu_cap)
        mem_max = np.where(bounded, 1.0, s.mem_cap)

        cpu_mean = np.minimum(s.cpu_ratio_median * np.exp(s.cpu_ratio_sigma * z_cpu) * scale, cpu_max)
        mem_mean = np.minimum(s.mem_ratio_median * np.exp(s.mem_ratio_sigma * z_mem) * scale, mem_max)
        has_gpu = np.array([pod.num_gpu > 0 for pod in pods], dtype=bool)
        busy = 1.0 / (1.0 + np.exp(-(s.gpu_logit_mu + s.gpu_logit_sigma * z_gpu)))
        gpu_mean = np.where(has_gpu & (u_gpu >= s.gpu_idle_fraction), np.minimum(busy * scale, 1.0), 0.0)
        return PodUsage(
            cpu_mean=cpu_mean,
            mem_mean=mem_mean,
            gpu_mean=gpu_mean,
            cpu_std=s.cpu_cv * cpu_mean,
            mem_std=s.mem_cv * mem_mean,
            gpu_std=s.gpu_cv * gpu_mean,
            cpu_max=cpu_max,
            mem_max=mem_max,
        )

    def instant(
        self, usage: PodUsage, idx: np.ndarray, rng: np.random.Generator
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """One scrape's (cpu, mem, gpu) fractions for the pods ``idx`` (indices into ``usage``).

        Each value is the pod's mean times a lognormal factor of mean 1 and the pod's coefficient of
        variation, clipped to ``[0, cpu_max]``, ``[0, mem_max]`` and ``[0, 1]``: a Guaranteed pod never
        passes its request, another pod may burst up to the cap, a GPU pod never passes its allocation
        (GPU sharing isolates shares, FGD §2.1). A pod whose mean is 0 reads 0. Draws 3·len(idx) normals.
        """
        idx = np.asarray(idx, dtype=np.intp)
        cpu = _scrape(usage.cpu_mean[idx], usage.cpu_std[idx], rng, usage.cpu_max[idx])
        mem = _scrape(usage.mem_mean[idx], usage.mem_std[idx], rng, usage.mem_max[idx])
        gpu = _scrape(usage.gpu_mean[idx], usage.gpu_std[idx], rng, np.ones(idx.shape[0]))
        return cpu, mem, gpu


def _scrape(mean: FloatArray, std: FloatArray, rng: np.random.Generator, upper: FloatArray) -> FloatArray:
    """``mean`` times a mean-one lognormal factor with coefficient of variation ``std / mean``, clipped."""
    z = rng.standard_normal(mean.shape[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        cv = np.where(mean > 0.0, std / np.where(mean > 0.0, mean, 1.0), 0.0)
    sigma = np.sqrt(np.log1p(cv * cv))
    value = mean * np.exp(sigma * z - 0.5 * sigma * sigma)
    result: FloatArray = np.clip(value, 0.0, upper)
    return result


def lognormal_quantile(q: float, median: float, sigma: float) -> float:
    """The ``q`` quantile of a lognormal with this median and log-space sigma."""
    return median * math.exp(sigma * _STANDARD_NORMAL.inv_cdf(q))


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    """P(X <= x) for a lognormal with this median and log-space sigma."""
    if x <= 0.0:
        return 0.0
    return _STANDARD_NORMAL.cdf(math.log(x / median) / sigma)


def gpu_utilization_cdf(x: float, settings: UsageSettings) -> float:
    """P(lifetime-mean GPU utilization <= x) of a GPU pod under ``settings`` (QoS scale 1), 0 <= x < 1."""
    if x < 0.0:
        return 0.0
    if x == 0.0:
        return settings.gpu_idle_fraction
    if x >= 1.0:
        return 1.0
    z = (math.log(x / (1.0 - x)) - settings.gpu_logit_mu) / settings.gpu_logit_sigma
    return settings.gpu_idle_fraction + (1.0 - settings.gpu_idle_fraction) * _STANDARD_NORMAL.cdf(z)
