"""Typical pods: FGD's model of the workload a cluster will see.

Pods are grouped by their request ``(cpu, gpu_milli, num_gpu, gpu_models)``; groups are sorted by
size, the largest kept until they cover ``coverage`` of all pods (CPU-only pods included), and
their frequencies renormalized to sum to one. On the openb default trace this keeps 35 specs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cluster import PodSpec
from .resources import QUANTITY_LIMIT

DEFAULT_COVERAGE = 0.95
"""Share of pods the kept groups must cover (FGD's popularity threshold, 95 %)."""


@dataclass(frozen=True)
class TypicalPods:
    """The typical-pod distribution as arrays of length ``T``."""

    cpu_milli: np.ndarray
    gpu_milli: np.ndarray
    """Milli per card (1000 for whole cards, 0 for CPU-only)."""
    num_gpu: np.ndarray
    gpu_models: tuple[tuple[str, ...], ...]
    weight: np.ndarray
    """Frequencies, summing to one."""

    def __len__(self) -> int:
        return len(self.weight)

    def to_json(self) -> list[dict[str, Any]]:
        """One entry per typical pod (for model manifests and the extender's configuration)."""
        return [
            {"cpuMilli": int(c), "gpuMilli": int(g), "numGpu": int(n), "gpuModels": list(m), "weight": float(w)}
            for c, g, n, m, w in zip(
                self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_models, self.weight, strict=True
            )
        ]

    @classmethod
    def from_json(cls, entries: Sequence[dict[str, Any]]) -> TypicalPods:
        """Inverse of :meth:`to_json`; raises ValueError naming the entry that is malformed."""
        if not entries:
            raise ValueError("typical pods: the list is empty")
        rows = []
        for i, e in enumerate(entries):
            try:
                row = (
                    int(e["cpuMilli"]),
                    int(e["gpuMilli"]),
                    int(e["numGpu"]),
                    tuple(str(m) for m in e.get("gpuModels", [])),
                    float(e["weight"]),
                )
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise ValueError(
                    f"typical pods[{i}]: expected cpuMilli, gpuMilli, numGpu, weight (and optional gpuModels): {exc}"
                ) from None
            if min(row[0], row[1], row[2]) < 0 or max(row[0], row[1], row[2]) > QUANTITY_LIMIT:
                raise ValueError(f"typical pods[{i}]: amounts must be from 0 to {QUANTITY_LIMIT}")
            if not 0 < row[4] < float("inf"):
                raise ValueError(f"typical pods[{i}]: weight must be a positive finite number")
            rows.append(row)
        weight = np.array([r[4] for r in rows])
        with np.errstate(over="ignore"):
            total = weight.sum()
        if not np.isfinite(total):  # 1e308 twice: every weight would read as 0
            raise ValueError("typical pods: the weights' sum is not a finite number; scale them down")
        return cls(
            cpu_milli=np.array([r[0] for r in rows], dtype=np.int64),
            gpu_milli=np.array([r[1] for r in rows], dtype=np.int64),
            num_gpu=np.array([r[2] for r in rows], dtype=np.int64),
            gpu_models=tuple(r[3] for r in rows),
            weight=weight / weight.sum(),
        )

    def access(self, model_names: Sequence[str]) -> np.ndarray:
        """bool[T, M + 1]: whether typical pod t may use model id m; the last column is CPU-only nodes."""
        access = np.ones((len(self), len(model_names) + 1), dtype=np.bool_)
        for t, models in enumerate(self.gpu_models):
            if models and self.num_gpu[t] > 0:
                allowed = set(models)
                access[t, : len(model_names)] = [m in allowed for m in model_names]
                access[t, -1] = False
        return access


def typical_pods(pods: Sequence[PodSpec], coverage: float = DEFAULT_COVERAGE) -> TypicalPods:
    """Build the typical-pod distribution from a workload (FGD protocol step 2)."""
    if not pods:
        raise ValueError("cannot build typical pods from an empty workload")
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    groups = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu, tuple(p.gpu_models)) for p in pods)
    # Largest groups first; the key breaks ties so the result does not depend on input order.
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
    total = len(pods)
    kept: list[tuple[tuple[Any, ...], int]] = []
    covered = 0
    for key, n in ordered:
        if covered >= coverage * total:
            break
        kept.append((key, n))
        covered += n
    weights = np.array([n for _, n in kept], dtype=np.float64) / covered
    return TypicalPods(
        cpu_milli=np.array([k[0] for k, _ in kept], dtype=np.int64),
        gpu_milli=np.array([k[1] for k, _ in kept], dtype=np.int64),
        num_gpu=np.array([k[2] for k, _ in kept], dtype=np.int64),
        gpu_models=tuple(k[3] for k, _ in kept),
        weight=weights,
    )
