"""Arrival sequences for the FGD evaluation protocol (step 3: inflate to a target GPU demand).

The name-sorted trace is shuffled with the seed. If it asks for less GPU than ``target`` × the
cluster's GPU capacity, copies of pods drawn uniformly (with replacement) from the trace are
appended until the next one would pass the target; if it asks for more, randomly chosen pods are
removed until it fits. A pod that alone asks for more than the target is refused up front
(:func:`check_inflatable`): it could never arrive, and removing it could leave no GPU pod to measure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from .cluster import PodSpec

DEFAULT_TARGET = 1.3
"""Arrived GPU demand at the end of a run, as a fraction of cluster GPU capacity (130 %)."""
MIN_TARGET, MAX_TARGET = 1.0, 10.0
"""The inflation targets the commands accept: below 100 % the headline point is never reached; above
1,000 % every run only adds failures (the FGD paper stops at 130 %), and a mistyped ``--target 1e9`` must
not append pods until the memory runs out."""
MAX_ARRIVALS = 1_000_000
"""Pods in one arrival sequence at most this (openb's default trace at 130 % is about 10,800): beyond it
the cluster is too large for its pods' sizes to fill by cloning, and a run would take hours."""


def target_problem(target: float, flag: str = "--target") -> str | None:
    """Why ``target`` cannot be an inflation target (None if it can): it must be a finite number in
    [MIN_TARGET, MAX_TARGET]. NaN passes every ``<`` test, so it is checked by name."""
    if not math.isfinite(target) or not MIN_TARGET <= target <= MAX_TARGET:
        return (
            f"{flag} must be at least {MIN_TARGET:.1f} and at most {MAX_TARGET:g}, a finite fraction of cluster GPU "
            f"capacity (arrivals up to less than 1.0 never reach the 100 % point the headline figure is read at), "
            f"got {target:g}"
        )
    return None


def check_inflatable(pods: Sequence[PodSpec], gpu_capacity_milli: int, target: float) -> None:
    """Raise ValueError, saying why, unless ``pods`` can be inflated to ``target`` × ``gpu_capacity_milli``
    within MAX_ARRIVALS pods (the expected count: the GPU still missing over the mean request). Callers
    that fan runs out to processes check here first, so that the refusal comes before any run starts."""
    if not pods:
        raise ValueError("the workload has no pods")
    if gpu_capacity_milli <= 0:
        raise ValueError("the cluster has no GPU capacity to inflate the workload against")
    if not (math.isfinite(target) and 0 < target <= MAX_TARGET):
        raise ValueError(f"target must be positive, finite and at most {MAX_TARGET:g}, got {target}")
    target_milli = target * gpu_capacity_milli
    too_big = next((p for p in pods if p.gpu_request_milli > target_milli), None)
    if too_big is not None:  # no arrival sequence can hold it: deflation removes it, and may empty the run
        raise ValueError(
            f"pod {too_big.name!r} alone asks for {too_big.gpu_request_milli / 1000:g} GPUs, more than {target:g} × "
            f"the cluster's GPU capacity ({gpu_capacity_milli / 1000:g} GPUs): no arrival sequence can hold it; "
            f"use a larger node list or remove such pods from the pod list"
        )
    total = sum(p.gpu_request_milli for p in pods)
    if total < target_milli:
        if not total:
            raise ValueError("the workload asks for no GPU, so it cannot be inflated to a GPU target")
        _check_arrivals(len(pods) + (target_milli - total) * len(pods) / total, target)


def inflate(
    pods: Sequence[PodSpec], gpu_capacity_milli: int, seed: int, target: float = DEFAULT_TARGET
) -> list[PodSpec]:
    """The arrival sequence for one seed. Copies are named ``<pod>-clone-<k>``."""
    check_inflatable(pods, gpu_capacity_milli, target)
    rng = np.random.default_rng(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    sequence = [ordered[i] for i in rng.permutation(len(ordered))]
    target_milli = target * gpu_capacity_milli
    total = sum(p.gpu_request_milli for p in sequence)
    if total < target_milli:
        clone = 0
        while True:
            pod = ordered[rng.integers(len(ordered))]
            if total + pod.gpu_request_milli > target_milli:
                break
            if len(sequence) >= MAX_ARRIVALS:  # the check above expects the mean; a skewed draw may run longer
                _check_arrivals(len(sequence) + 1, target)
            sequence.append(dataclasses.replace(pod, name=f"{pod.name}-clone-{clone}"))
            total += pod.gpu_request_milli
            clone += 1
    else:
        while total > target_milli:
            pod = sequence.pop(int(rng.integers(len(sequence))))
            total -= pod.gpu_request_milli
    return sequence


def _check_arrivals(expected: float, target: float) -> None:
    """Refuse an arrival sequence of more than MAX_ARRIVALS pods, before building it."""
    if expected > MAX_ARRIVALS:
        raise ValueError(
            f"inflating the workload to {target:g} × the cluster's GPU capacity takes about {expected:,.0f} pods, "
            f"more than {MAX_ARRIVALS:,}: the cluster is too large for these pods (or --target too high)"
        )
