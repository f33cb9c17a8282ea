"""Published results of the FGD paper on the openb traces, to compare our runs with.

Median unallocated GPU % at 100 % arrival over seeds 42–51 (Weng et al., USENIX ATC'23, on Alibaba's
``cluster-trace-gpu-v2023`` from github.com/alibaba/clusterdata). ``gpushare20`` has no published figures.

The figures hold for the published setup only: the 1,213-node GPU node list with one of the published
pod lists. :func:`published_setup` recognizes that setup by content (a fingerprint of the parsed specs,
so a renamed or re-encoded copy still matches, and a pod list named like one on another node list never
does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from .cluster import NodeSpec, PodSpec

POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")

PUBLISHED_UNALLOCATED_AT_100: dict[str, dict[str, float]] = {
    "default": dict(zip(POLICIES, (13.75, 9.45, 8.42, 8.20, 7.09, 4.77), strict=True)),
    "cpu050": dict(zip(POLICIES, (11.02, 6.94, 6.52, 6.47, 6.42, 5.00), strict=True)),
    "cpu200": dict(zip(POLICIES, (17.01, 12.24, 10.25, 9.87, 7.85, 5.18), strict=True)),
    "gpushare60": dict(zip(POLICIES, (17.22, 13.17, 13.03, 12.75, 10.91, 8.70), strict=True)),
    "gpushare100": dict(zip(POLICIES, (21.07, 17.93, 17.70, 17.78, 15.40, 13.36), strict=True)),
    "gpuspec10": dict(zip(POLICIES, (13.69, 9.75, 8.05, 7.77, 6.88, 5.30), strict=True)),
    "gpuspec25": dict(zip(POLICIES, (14.59, 14.55, 13.59, 13.22, 14.30, 6.08), strict=True)),
    "multigpu20": dict(zip(POLICIES, (13.16, 8.19, 6.62, 6.49, 6.27, 4.47), strict=True)),
    "multigpu40": dict(zip(POLICIES, (14.77, 5.91, 4.53, 4.43, 4.91, 3.10), strict=True)),
}

TOLERANCE_PP = {"random": 1.0}
"""How close a reproduction must be (percentage points); 0.5 for every policy not listed."""

OFFLINE_FLOOR_AT_100 = {"default": 3.10, "gpushare60": 6.65, "multigpu20": 2.66}
"""Offline lower bound (all pods known in advance) on the same arrival sequences."""


def trace_name(pods_path: str | Path) -> str | None:
    """``openb_pod_list_default.csv`` → ``default``; None for other files."""
    stem = Path(pods_path).stem
    prefix = "openb_pod_list_"
    return stem[len(prefix) :] if stem.startswith(prefix) else None


PUBLISHED_NODES_FINGERPRINT = "0da1223010275991"
""":func:`fingerprint_nodes` of ``openb_node_list_gpu_node.csv`` (1,213 nodes, 6,212 GPUs)."""

PUBLISHED_PODS_FINGERPRINTS: dict[str, str] = {
    "0ccae7742fb25414": "cpu050",
    "02607e8eaaac7ab8": "cpu200",
    "296f3fabcebd4c8d": "default",
    "0695cf5cc7a98f70": "gpushare100",
    "161bcb903832c6b0": "gpushare20",
    "56c7b36d42128b08": "gpushare60",
    "b625dbcc9dc9367a": "gpuspec10",
    "2bd3681fe9ec26dd": "gpuspec25",
    "902148b0ca406996": "multigpu20",
    "b7aa921ff4f464e8": "multigpu40",
}
""":func:`fingerprint_pods` of ``openb_pod_list_<name>.csv`` → ``<name>``."""


def _digest(lines: Iterable[str]) -> str:
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update(line.encode() + b"\n")
    return h.hexdigest()[:16]


def fingerprint_nodes(nodes: Iterable[NodeSpec]) -> str:
    """A short hash of what the simulator reads from a node list (order and file format do not count)."""
    return _digest(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpu_count},{n.gpu_model}" for n in nodes)


def fingerprint_pods(pods: Iterable[PodSpec]) -> str:
    """A short hash of what the FGD protocol reads from a pod list (requests and model constraints)."""
    return _digest(
        f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},{'|'.join(p.gpu_models)}" for p in pods
    )


def published_setup(nodes: Iterable[NodeSpec], pods: Iterable[PodSpec]) -> str | None:
    """The published trace name (``default``, ``cpu050``...) when both lists are the published ones, else None."""
    if fingerprint_nodes(nodes) != PUBLISHED_NODES_FINGERPRINT:
        return None
    return PUBLISHED_PODS_FINGERPRINTS.get(fingerprint_pods(pods))


def published(setup: str | None, policy: str) -> float | None:
    """The published median for this setup (:func:`published_setup`) and policy, if there is one."""
    return PUBLISHED_UNALLOCATED_AT_100.get(setup or "", {}).get(policy)
