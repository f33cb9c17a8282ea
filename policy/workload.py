"""Arrival sequences for the FGD evaluation protocol (step 3: inflate to a target GPU demand).

The name-sorted trace is shuffled with the seed. If it asks for less GPU than ``target`` × the
cluster's GPU capacity, copies of pods drawn uniformly (with replacement) from the trace are
appended until the next one would pass the target; if it asks for more, randomly chosen pods are
removed until it fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .cluster import PodSpec

DEFAULT_TARGET = 1.3
"""Arrived GPU demand at the end of a run, as a fraction of cluster GPU capacity (130 %)."""


def inflate(
    pods: Sequence[PodSpec], gpu_capacity_milli: int, seed: int, target: float = DEFAULT_TARGET
) -> list[PodSpec]:
    """The arrival sequence for one seed. Copies are named ``<pod>-clone-<k>``."""
    if not pods:
        raise ValueError("the workload has no pods")
    if gpu_capacity_milli <= 0:
        raise ValueError("the cluster has no GPU capacity to inflate the workload against")
    if target <= 0:
        raise ValueError(f"target must be positive, got {target}")
    rng = np.random.default_rng(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    sequence = [ordered[i] for i in rng.permutation(len(ordered))]
    target_milli = target * gpu_capacity_milli
    total = sum(p.gpu_request_milli for p in sequence)
    if total < target_milli:
        if not any(p.gpu_request_milli for p in ordered):
            raise ValueError("the workload asks for no GPU, so it cannot be inflated to a GPU target")
        clone = 0
        while True:
            pod = ordered[rng.integers(len(ordered))]
            if total + pod.gpu_request_milli > target_milli:
                break
            sequence.append(dataclasses.replace(pod, name=f"{pod.name}-clone-{clone}"))
            total += pod.gpu_request_milli
            clone += 1
    else:
        while total > target_milli:
            pod = sequence.pop(int(rng.integers(len(sequence))))
            total -= pod.gpu_request_milli
    return sequence
