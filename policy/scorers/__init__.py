"""Node scorers: the baseline heuristics and the registry that builds any policy by name.

Every scorer implements :class:`~rlsched.policy.scorers.base.Scorer`; learned policies loaded with
``ppo:PATH`` implement the same interface, so the simulator and the extender call them alike.
"""

from __future__ import annotations

from collections.abc import Callable

from ..typical import TypicalPods
from .base import MAX_NODE_SCORE, NodeScores, Scorer, TieBreak, normalize_min_max
from .bestfit import BestFitScorer
from .dotprod import DotProductScorer
from .fgd import FgdScorer
from .fgd_cpu import FgdCpuScorer
from .gpuclustering import GpuClusteringScorer
from .gpupacking import GpuPackingScorer
from .kubernetes import BalancedAllocationScorer, LeastAllocatedScorer, MostAllocatedScorer, ResourceWeights
from .random import RandomScorer
from .trimaran import LoadVariationRiskBalancingScorer, TargetLoadPackingScorer

__all__ = [
    "MAX_NODE_SCORE",
    "NodeScores",
    "Scorer",
    "TieBreak",
    "normalize_min_max",
    "BestFitScorer",
    "DotProductScorer",
    "FgdScorer",
    "FgdCpuScorer",
    "GpuClusteringScorer",
    "GpuPackingScorer",
    "LeastAllocatedScorer",
    "MostAllocatedScorer",
    "BalancedAllocationScorer",
    "ResourceWeights",
    "RandomScorer",
    "TargetLoadPackingScorer",
    "LoadVariationRiskBalancingScorer",
    "SCORERS",
    "scorer_names",
    "make_scorer",
    "UnknownPolicyError",
]


class UnknownPolicyError(ValueError):
    """A policy name that no scorer answers to."""


def _needs_typical(factory: Callable[[TypicalPods], Scorer]) -> Callable[[TypicalPods | None], Scorer]:
    def build(typical: TypicalPods | None) -> Scorer:
        if typical is None:
            raise ValueError("this policy needs the typical-pod distribution of the workload (policy.typical_pods)")
        return factory(typical)

    return build


SCORERS: dict[str, Callable[[TypicalPods | None], Scorer]] = {
    RandomScorer.name: lambda typical: RandomScorer(),
    LeastAllocatedScorer.name: lambda typical: LeastAllocatedScorer(),
    MostAllocatedScorer.name: lambda typical: MostAllocatedScorer(),
    BalancedAllocationScorer.name: lambda typical: BalancedAllocationScorer(),
    DotProductScorer.name: lambda typical: DotProductScorer(),
    GpuPackingScorer.name: lambda typical: GpuPackingScorer(),
    GpuClusteringScorer.name: lambda typical: GpuClusteringScorer(),
    BestFitScorer.name: lambda typical: BestFitScorer(),
    FgdScorer.name: _needs_typical(FgdScorer),
    FgdCpuScorer.name: _needs_typical(FgdCpuScorer),
    TargetLoadPackingScorer.name: lambda typical: TargetLoadPackingScorer(),
    LoadVariationRiskBalancingScorer.name: lambda typical: LoadVariationRiskBalancingScorer(),
}
"""Baseline scorers by canonical name."""

_ALIASES = {
    "leastallocated": "least-allocated",
    "mostallocated": "most-allocated",
    "balancedallocation": "balanced-allocation",
    "dotproduct": "dotprod",
    "best-fit": "bestfit",
    "gpu-packing": "gpupacking",
    "gpu-clustering": "gpuclustering",
    "fgdcpu": "fgd-cpu",
    "fgd_cpu": "fgd-cpu",
    "targetloadpacking": "target-load-packing",
    "loadvariationriskbalancing": "load-variation-risk-balancing",
}


def scorer_names() -> list[str]:
    """Canonical names of the built-in scorers (``ppo:PATH`` loads a learned one)."""
    return list(SCORERS)


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in SCORERS:
        raise UnknownPolicyError(
            f"unknown policy {name!r}; choose one of {', '.join(SCORERS)} or ppo:PATH for a trained model"
        )
    return key


def make_scorer(name: str, typical: TypicalPods | None = None) -> Scorer:
    """Build a scorer by name (case-insensitive; ``LeastAllocated``, ``FGD`` and the like work too);
    ``ppo:PATH`` loads a trained model, ``ppo-prior:PATH`` the same model with its network zeroed."""
    if name.startswith(("ppo:", "ppo-prior:")):
        from ..learned import learned_policy_path, load_learned_scorer  # deferred: the learned policy is optional

        learned = learned_policy_path(name)
        assert learned is not None  # the name starts with one of its prefixes
        path, prior_only = learned
        return load_learned_scorer(path, typical=typical, prior_only=prior_only)
    return SCORERS[canonical_name(name)](typical)
