"""The delay head: whether to hold a pod back for a while although a node fits it now.

A learned model may carry, beside its placement network, a small linear head that answers one
question per pod: place it now, or hold it back ``hold_s`` seconds (the delay action: the extender
answers "delayed by policy … until …", the operator requeues the pod, the living cluster holds it).
Its inputs are seven columns the feature encoder already computes for every pod, by the encoder's
own functions (:data:`DELAY_INPUTS`; a test checks they agree with
:class:`~rlsched.policy.features.FeatureEncoder`'s rows)::

    z     = (inputs − center) / scale                 center, scale: measured on the training runs
    logit = z · weights + bias                        hold when logit > 0

What it can learn is "this kind of pod should wait while the cluster looks like this": at full
load, letting pods that ask for several cards wait lets smaller ones start first (shortest job
first by GPU size), which cuts the mean queueing delay; below full load any hold is pure waiting
(docs/dynamic.md, "A learned delay"). ``rlsched train-delay`` (:mod:`rlsched.policy.dynamic.delay_search`)
finds the weights on whole living-cluster runs.

``feasible_frac`` is left out on purpose: the extender sees only the nodes kube-scheduler passed to
it, which with ``percentageOfNodesToScore`` can be fewer than all feasible nodes, so the fraction
would differ between training and serving. The cluster-wide inputs come from the cache, whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cluster import ClusterState, PodRequest
from .features import POD_FEATURES, cluster_fill, pod_columns

DELAY_INPUTS = (
    "pod_gpu_total",
    "pod_num_gpu",
    "pod_is_share",
    "pod_is_cpu_only",
    "cluster_gpu_alloc",
    "cluster_full_free",
    "cluster_cpu_free",
)
"""The head's inputs: feature-encoder columns of the same names (docs/features.md)."""

_FILL = ("cluster_gpu_alloc", "cluster_full_free", "cluster_cpu_free")
"""The names of :func:`~rlsched.policy.features.cluster_fill`'s values."""

ARRAYS = ("delay_center", "delay_scale", "delay_weights", "delay_bias")
"""The head's arrays in a model file (beside the network's)."""


def delay_inputs(state: ClusterState, req: PodRequest) -> np.ndarray:
    """float64[len(DELAY_INPUTS)]: the head's inputs for ``req`` in ``state``, from the encoder's own
    column functions (:func:`~rlsched.policy.features.pod_columns`, :func:`~rlsched.policy.features.cluster_fill`)."""
    pod = dict(zip(POD_FEATURES, pod_columns(req), strict=True))
    pod.update(zip(_FILL, cluster_fill(state), strict=True))
    return np.array([pod[name] for name in DELAY_INPUTS], dtype=np.float64)


MAX_HOLD_S = 3600.0
"""The longest a delay may hold a pod back (an hour): a model's hold, its delay head's, and the
extender's check of every delay verdict it serves."""
MAX_HOLDS_PER_POD = 3
"""How often one pod may be held back: the living-cluster simulator and its training environment
stop asking after this many delays, and the extender serves the placement instead of a fourth."""


MIN_SCALE = 1e-6
"""Smallest input scale of a delay head (the trained ones are the inputs' spreads, far above it)."""


@dataclass(frozen=True)
class DelayHead:
    """A linear hold-or-place rule over :data:`DELAY_INPUTS` (see the module docstring)."""

    center: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    hold_s: float = 60.0
    """How long a hold lasts (seconds)."""

    def __post_init__(self) -> None:
        n = len(DELAY_INPUTS)
        for name in ("center", "scale", "weights"):
            a = np.asarray(getattr(self, name), dtype=np.float64)
            if a.shape != (n,) or not np.isfinite(a).all():
                raise ValueError(f"delay head {name}: need {n} finite numbers, got shape {a.shape}")
            object.__setattr__(self, name, a)
        if not (self.scale >= MIN_SCALE).all():  # a tinier scale makes inputs infinite, and inf × 0 is NaN
            raise ValueError(f"delay head scale: every entry must be positive (at least {MIN_SCALE:g})")
        if not np.isfinite(self.bias) or not 0 < self.hold_s <= MAX_HOLD_S:  # NaN and infinities too
            raise ValueError(f"delay head: need a finite bias and a hold of more than 0 and at most {MAX_HOLD_S:.0f} s")

    @classmethod
    def never(cls, center: np.ndarray, scale: np.ndarray, hold_s: float = 60.0) -> DelayHead:
        """The head that never holds (zero weights, bias −1): where a search starts."""
        return cls(center, scale, np.zeros(len(DELAY_INPUTS)), -1.0, hold_s)

    def logit(self, state: ClusterState, req: PodRequest) -> float:
        z = (delay_inputs(state, req) - self.center) / self.scale
        return float(z @ self.weights + self.bias)

    def holds(self, state: ClusterState, req: PodRequest) -> bool:
        """Whether the head holds the pod: a positive logit (NaN is not)."""
        return self.logit(state, req) > 0.0

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "delay_center": self.center.astype(np.float32),
            "delay_scale": self.scale.astype(np.float32),
            "delay_weights": self.weights.astype(np.float32),
            "delay_bias": np.asarray(self.bias, dtype=np.float32),
        }

    def manifest(self, training: Mapping[str, Any]) -> dict[str, Any]:
        """The model manifest's ``delayHead`` entry."""
        return {"inputs": list(DELAY_INPUTS), "holdS": float(self.hold_s), "training": dict(training)}

    @classmethod
    def from_model(cls, arrays: Mapping[str, np.ndarray], manifest: Mapping[str, Any]) -> DelayHead | None:
        """The head stored in a model file, or None when it has none (checked by the exporter's validation)."""
        entry = manifest.get("delayHead")
        if not entry:
            return None
        return cls(
            np.asarray(arrays["delay_center"], dtype=np.float64),
            np.asarray(arrays["delay_scale"], dtype=np.float64),
            np.asarray(arrays["delay_weights"], dtype=np.float64),
            float(arrays["delay_bias"]),
            float(entry["holdS"]),
        )


def check_manifest_entry(entry: Any, arrays: Mapping[str, np.ndarray]) -> str | None:
    """What is wrong with a model file's ``delayHead`` entry and arrays (None: nothing, or no head)."""
    present = [k for k in ARRAYS if k in arrays]
    if not entry:
        return f"arrays {present} without a delayHead entry in the manifest" if present else None
    if not isinstance(entry, dict):
        return "delayHead is not an object"
    if list(entry.get("inputs", [])) != list(DELAY_INPUTS):
        return f"delayHead inputs {entry.get('inputs')} differ from this rlsched's {list(DELAY_INPUTS)}"
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        return f"delayHead arrays missing: {missing}"
    try:
        DelayHead(
            np.asarray(arrays["delay_center"], dtype=np.float64),
            np.asarray(arrays["delay_scale"], dtype=np.float64),
            np.asarray(arrays["delay_weights"], dtype=np.float64),
            float(np.asarray(arrays["delay_bias"]).reshape(())),
            float(entry.get("holdS", 0)),
        )
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None
