"""Each pod's measured CPU use, from Prometheus, for the rebalancer's planner.

Node load says a node is hot; only per-pod use says which pod makes it so (in the living-cluster
simulation a pod uses 0–12× its CPU request: docs/usage-model.md). cAdvisor, through every kubelet,
exports ``container_cpu_usage_seconds_total`` per container; kube-prometheus-stack scrapes it, and
:data:`DEFAULT_QUERY` sums its rate per pod. The answer is parsed defensively: an answer of more than
``max_series`` series is refused before it is decoded (by the Prometheus client, which counts them
in the bytes; a query function that answers decoded JSON is cut to ``max_series`` instead), a series
without ``namespace`` and ``pod`` labels or with a value that is not a finite, non-negative number is
skipped and counted, and a failed or malformed query yields an empty map (the planner then estimates
from request shares).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rlsched.extender.prometheus import vector_samples

from .settings import DEFAULT_POD_CPU_QUERY

DEFAULT_QUERY = DEFAULT_POD_CPU_QUERY
"""The operator's default ``rebalancer.podCpuQuery``."""


@dataclass
class PodUsageRead:
    """One query's result: ``namespace/name`` → millicores, and what was skipped."""

    milli: dict[str, float] = field(default_factory=dict)
    skipped: int = 0
    """Series without namespace and pod labels, or with a value that is not a finite number ≥ 0."""
    truncated: bool = False
    """More than ``max_series`` series came back; the rest were not read."""
    error: str = ""
    """Why the query gave nothing (empty when it answered)."""


async def read_pod_cpu(
    query: Callable[[str, int], Awaitable[Any]], promql: str = DEFAULT_QUERY, max_series: int = 200_000
) -> PodUsageRead:
    """Run ``promql`` with ``query`` (the Prometheus client's instant query, given the series cap: the
    decoded JSON answer) and read it into millicores per pod. Never raises for a bad answer."""
    out = PodUsageRead()
    try:
        samples, out.truncated = vector_samples(await query(promql, max_series), max_series)
    except ValueError as exc:
        out.error = f"not a usable Prometheus vector answer: {exc}"[:300]
        return out
    except Exception as exc:  # noqa: BLE001 - a Prometheus outage must not stop a rebalancing cycle
        out.error = f"{type(exc).__name__}: {exc}"[:300]
        return out
    for labels, cores in samples:
        namespace, pod = labels.get("namespace"), labels.get("pod")
        if not (isinstance(namespace, str) and isinstance(pod, str) and math.isfinite(cores) and cores >= 0):
            out.skipped += 1
            continue
        key = f"{namespace}/{pod}"
        out.milli[key] = out.milli.get(key, 0.0) + cores * 1000.0
    return out
