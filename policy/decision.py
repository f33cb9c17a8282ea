"""One scheduling decision: feasible nodes → scores → chosen node → cards.

The simulator, the gym environment's baseline mode and the extender all place a pod through
:func:`decide`, so a policy behaves the same wherever it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cluster import ClusterState, PodRequest
from .feasibility import feasible_nodes
from .scorers.base import NodeScores, Scorer, TieBreak


@dataclass(frozen=True)
class Decision:
    """Where a pod should go and why."""

    node: int
    cards: tuple[int, ...]
    feasible: np.ndarray
    """Indices of the feasible nodes that were considered."""
    scores: NodeScores | None
    """The scorer's output over ``feasible`` (None when only one node fitted: it goes there unscored)."""


def decide(
    scorer: Scorer, state: ClusterState, req: PodRequest, tiebreak: TieBreak, nodes: np.ndarray | None = None
) -> Decision | None:
    """Choose a node and cards for ``req``, or None when no node fits.

    ``nodes`` restricts the candidates (the extender passes the nodes kube-scheduler sent); they are
    filtered for feasibility here. With exactly one feasible node the pod goes there unscored (as
    kube-scheduler does), but the scorer still picks the card.
    """
    feasible = feasible_nodes(state, req)
    if nodes is not None:
        feasible = np.intersect1d(feasible, nodes, assume_unique=True)
    if len(feasible) == 0:
        return None
    scores = scorer.score(state, req, feasible)
    position = 0 if len(feasible) == 1 else scorer.choose(scores, feasible, tiebreak)
    node = int(feasible[position])
    cards = scorer.cards(state, req, node, position, scores, tiebreak)
    return Decision(node, cards, feasible, scores if len(feasible) > 1 else None)
