"""The arrival process of the living-cluster mode: which pods come, when, and for how long.

The openb trace is a snapshot of the pods of one cluster with their creation and deletion times,
but its own timeline is sparse: replayed as recorded it never fills more than about 1 % of the
GPUs (see ``docs/simulator.md``). So this mode keeps what the trace says about *each pod* — its
request, its QoS class and its lifetime (``deletion_time − creation_time``) — and replaces *when*
pods arrive with a Poisson process whose rate gives a chosen offered load:

    rate = load × GPU milli capacity ÷ E[GPU milli × lifetime]      (Little's law, M/G/∞)

Assumptions, each a setting:

- Pods are drawn from the trace uniformly with replacement, each with its own lifetime (the
  pairing of request and lifetime is the trace's). Lifetimes are capped at ``max_lifetime_s``
  (default 24 h): the trace's tail reaches 149 days, and without a cap a run would need months of
  simulated time to reach steady state. The 34 pods whose deletion time is the snapshot's end are
  censored; their observed lifetime is used as if it were complete.
- A pod runs for its lifetime once placed (a job does its work after it starts), so waiting
  delays its departure.
- The run starts in steady state rather than empty: the pods alive at time 0 of an M/G/∞ system
  are a Poisson(rate × E[lifetime]) number of length-biased draws, each with a uniform share of its
  lifetime left. They are placed oldest first by the policy under test, then the measured window
  of ``window_s`` seconds begins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..cluster import PodSpec
from ..resources import MILLI_PER_CARD


@dataclass(frozen=True)
class ArrivalSettings:
    """How pods arrive in the living-cluster mode."""

    load: float = 0.9
    """Offered GPU load: the mean GPU milli the arriving pods would hold ÷ cluster capacity."""
    window_s: float = 3600.0
    """Length of the measured window after the steady-state start, in seconds."""
    max_lifetime_s: float = 86400.0
    """Lifetimes above this are cut to it (assumption; see the module docstring)."""
    min_lifetime_s: float = 1.0
    """Lifetimes below this (zero in the trace) are raised to it."""

    def __post_init__(self) -> None:
        if not 0 < self.load <= 10:
            raise ValueError(f"load must be in (0, 10], got {self.load}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be positive, got {self.window_s}")
        if not 0 < self.min_lifetime_s <= self.max_lifetime_s:
            raise ValueError("need 0 < min_lifetime_s <= max_lifetime_s")


@dataclass(frozen=True)
class Arrival:
    """One pod of a run: which trace pod, when it arrives and how long it runs once placed."""

    pod: int
    """Index into the trace's pod list."""
    time: float
    """Arrival time in seconds; negative for the pods already running at the start."""
    lifetime: float
    """Seconds it runs once placed (for a pod running at the start: what is left of it)."""


def lifetimes(pods: Sequence[PodSpec], settings: ArrivalSettings) -> np.ndarray:
    """Each trace pod's lifetime in seconds, clipped to the settings' bounds."""
    if not pods:
        raise ValueError(
            "the living-cluster mode draws its arrivals from the trace's pods, and the pod list is empty: "
            "give a pod list with at least one pod"
        )
    missing = [p.name for p in pods if p.creation_time is None or p.deletion_time is None]
    if missing:
        raise ValueError(
            f"the living-cluster mode needs creation_time and deletion_time on every pod; {len(missing)} "
            f"pod(s) lack them (first: {missing[0]})"
        )
    life = np.array([float(p.deletion_time) - float(p.creation_time) for p in pods])  # type: ignore[arg-type]
    return np.clip(life, settings.min_lifetime_s, settings.max_lifetime_s)


def arrival_rate(pods: Sequence[PodSpec], gpu_capacity_milli: int, settings: ArrivalSettings) -> float:
    """Pods per second that offer ``settings.load`` of the GPU capacity (Little's law)."""
    life = lifetimes(pods, settings)
    gpu = np.array([p.gpu_request_milli for p in pods], dtype=np.float64)
    busy = float((gpu * life).mean())
    if not np.isfinite(busy):
        raise ValueError(
            f"the pods' mean GPU milli × lifetime is {busy}, not a finite number: check the trace's GPU "
            "requests and creation/deletion times"
        )
    if busy <= 0:
        raise ValueError("no pod in the trace asks for a GPU: the offered GPU load is undefined")
    if gpu_capacity_milli <= 0:
        raise ValueError("no node has a GPU: the offered GPU load, and so the arrival rate, is undefined")
    return settings.load * gpu_capacity_milli / busy


def draw_arrivals(
    pods: Sequence[PodSpec], gpu_capacity_milli: int, settings: ArrivalSettings, rng: np.random.Generator
) -> list[Arrival]:
    """The steady-state population at time 0 (oldest first) followed by the window's arrivals."""
    life = lifetimes(pods, settings)
    rate = arrival_rate(pods, gpu_capacity_milli, settings)
    # Pods alive at 0 in M/G/inf: Poisson(rate * E[L]) of them, drawn with probability ∝ lifetime,
    # each with Uniform(0, L) left to run (its age is the rest).
    alive = int(rng.poisson(rate * float(life.mean())))
    chosen = rng.choice(len(pods), size=alive, p=life / life.sum())
    left = rng.uniform(0.0, 1.0, size=alive) * life[chosen]
    age = life[chosen] - left
    initial = [
        Arrival(int(i), -float(a), max(float(r), settings.min_lifetime_s))
        for a, i, r in sorted(zip(age, chosen, left, strict=True), key=lambda t: -t[0])
    ]
    count = int(rng.poisson(rate * settings.window_s))
    times = np.sort(rng.uniform(0.0, settings.window_s, size=count))
    picks = rng.integers(0, len(pods), size=count)
    return initial + [Arrival(int(i), float(t), float(life[i])) for t, i in zip(times, picks, strict=True)]


def offered_gpu_cards(pods: Sequence[PodSpec], settings: ArrivalSettings, rate: float) -> float:
    """Mean whole cards the arrivals would hold at once (for reports): rate × E[GPU × lifetime]."""
    life = lifetimes(pods, settings)
    gpu = np.array([p.gpu_request_milli for p in pods], dtype=np.float64)
    return rate * float((gpu * life).mean()) / MILLI_PER_CARD
