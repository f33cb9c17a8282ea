"""Published results of the FGD paper on the openb traces, to compare our runs with.

Median unallocated GPU % at 100 % arrival over seeds 42–51 (Weng et al., USENIX ATC'23; the table in
``../shared/data/openb/README.md``). ``gpushare20`` has no published figures.
"""
from __future__ import annotations

from pathlib import Path

POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")

PUBLISHED_UNALLOCATED_AT_100: dict[str, dict[str, float]] = {
    "default": dict(zip(POLICIES, (13.75, 9.45, 8.42, 8.20, 7.09, 4.77))),
    "cpu050": dict(zip(POLICIES, (11.02, 6.94, 6.52, 6.47, 6.42, 5.00))),
    "cpu200": dict(zip(POLICIES, (17.01, 12.24, 10.25, 9.87, 7.85, 5.18))),
    "gpushare60": dict(zip(POLICIES, (17.22, 13.17, 13.03, 12.75, 10.91, 8.70))),
    "gpushare100": dict(zip(POLICIES, (21.07, 17.93, 17.70, 17.78, 15.40, 13.36))),
    "gpuspec10": dict(zip(POLICIES, (13.69, 9.75, 8.05, 7.77, 6.88, 5.30))),
    "gpuspec25": dict(zip(POLICIES, (14.59, 14.55, 13.59, 13.22, 14.30, 6.08))),
    "multigpu20": dict(zip(POLICIES, (13.16, 8.19, 6.62, 6.49, 6.27, 4.47))),
    "multigpu40": dict(zip(POLICIES, (14.77, 5.91, 4.53, 4.43, 4.91, 3.10))),
}

TOLERANCE_PP = {"random": 1.0}
"""How close a reproduction must be (percentage points); 0.5 for every policy not listed."""

OFFLINE_FLOOR_AT_100 = {"default": 3.10, "gpushare60": 6.65, "multigpu20": 2.66}
"""Offline lower bound (all pods known in advance) on the same arrival sequences."""


def trace_name(pods_path: str | Path) -> str | None:
    """``openb_pod_list_default.csv`` → ``default``; None for other files."""
    stem = Path(pods_path).stem
    prefix = "openb_pod_list_"
    return stem[len(prefix):] if stem.startswith(prefix) else None


def published(pods_path: str | Path, policy: str) -> float | None:
    """The published median for this trace file and policy, if there is one."""
    name = trace_name(pods_path)
    return PUBLISHED_UNALLOCATED_AT_100.get(name or "", {}).get(policy)
