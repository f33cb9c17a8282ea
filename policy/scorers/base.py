"""The one scorer interface shared by hand-written heuristics and learned policies.

A scorer looks at the cluster state and one pod and scores the feasible nodes it is given; it may
also name the card a share pod should take on each node. Choosing among the scores (argmax with a
random tie-break, or sampling) is part of the policy too, so it lives here as :meth:`Scorer.choose`.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..cards import default_cards
from ..cluster import ClusterState, PodRequest

MAX_NODE_SCORE = 100
"""kube-scheduler's framework.MaxNodeScore; the FGD-paper scorers produce integers 0..100."""


@dataclass
class NodeScores:
    """Scores for the nodes a scorer was asked about, aligned with that node array."""

    values: np.ndarray
    """Higher is better. Integers for the FGD-paper and Kubernetes scorers, floats for learned ones."""
    cards: np.ndarray | None = None
    """For share pods: the card each node would give (-1: use the default rule). None: default rule."""


class Scorer(ABC):
    """Scores feasible nodes for one pod. Subclasses are small: one idea each."""

    name: ClassVar[str]
    kube_scheduler_ties: ClassVar[bool] = False
    """True for scorers that stand for a kube-scheduler score plugin (Trimaran's): where the run's
    :class:`TieBreak` carries a stream for it (the living-cluster simulator), their ties go uniformly at
    random, as kube-scheduler's ``selectHost`` splits them; elsewhere (the FGD protocol, the extender)
    they keep the fixed order like every other scorer."""

    @abstractmethod
    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        """Score ``nodes`` (indices of feasible nodes, ascending) for the pod ``req``."""

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        """Position (into ``nodes``) of the node to use: the highest score, ties by ``tiebreak``'s order
        (or kube-scheduler's rule, :attr:`kube_scheduler_ties`)."""
        if self.kube_scheduler_ties:
            return tiebreak.kube_argmax(scores.values, nodes)
        return tiebreak.argmax(scores.values, nodes)

    def cards(
        self,
        state: ClusterState,
        req: PodRequest,
        node: int,
        position: int,
        scores: NodeScores | None,
        tiebreak: TieBreak,
    ) -> tuple[int, ...]:
        """The card(s) the pod gets on ``node``: the scorer's own pick for share pods, else the default rule."""
        if req.is_share and scores is not None and scores.cards is not None:
            card = int(scores.cards[position])
            if card >= 0:
                return (card,)
        return default_cards(state, req, node)


class TieBreak:
    """How equal scores are split, and the randomness a policy may use.

    Ties go to the node that comes first in a random but seed-fixed order of the nodes (the FGD
    protocol's rule: with integer scores 0..100 ties are frequent, and a fixed order keeps filling
    the same node among equals rather than spreading pods over them). ``rank[n]`` is node ``n``'s
    place in that order; ``rng`` serves policies that sample (Random, learned policies). ``ties``, where
    a run sets it, is the stream of kube-scheduler's own rule (:meth:`kube_argmax`).
    """

    def __init__(self, rank: np.ndarray, rng: np.random.Generator, ties: np.random.Generator | None = None):
        self.rank = rank
        self.rng = rng
        self.ties = ties

    @classmethod
    def seeded(cls, num_nodes: int, seed: int) -> TieBreak:
        """A random node order and stream fixed by ``seed``."""
        rng = np.random.default_rng([seed, 1])
        return cls(rng.permutation(num_nodes), rng)

    @classmethod
    def by_name(cls, names: Sequence[str], seed: int = 0) -> TieBreak:
        """A node order derived from the names (stable while nodes come and go; for the extender)."""
        keys = np.array([zlib.crc32(f"{seed}/{name}".encode()) for name in names], dtype=np.int64)
        return cls(keys, np.random.default_rng(seed))

    def argmax(self, values: np.ndarray, nodes: np.ndarray) -> int:
        """Position of the highest value; among equal maxima the node first in the order."""
        if len(values) == 1:
            return 0
        best = np.flatnonzero(values == values.max())
        if len(best) == 1:
            return int(best[0])
        return int(best[np.argmin(self.rank[nodes[best]])])

    def planning(self) -> TieBreak:
        """The same order for what-if placements (a rebalancer's plan) without :attr:`ties`: a plan must
        not draw from the run's random ties (the live placements after it would differ from a run
        without the planner), and cannot foresee a random pick anyway, so it predicts the fixed order's."""
        return TieBreak(self.rank, self.rng)

    def kube_argmax(self, values: np.ndarray, nodes: np.ndarray) -> int:
        """kube-scheduler's ``selectHost``: uniformly at random among the highest values, one draw from
        :attr:`ties` per pod with tied maxima; without ``ties``, :meth:`argmax`."""
        if self.ties is None:
            return self.argmax(values, nodes)
        if len(values) == 1:
            return 0
        best = np.flatnonzero(values == values.max())
        if len(best) == 1:
            return int(best[0])
        return int(best[self.ties.integers(len(best))])


def normalize_min_max(values: np.ndarray) -> np.ndarray:
    """The FGD simulator's NormalizeScore: ``(s − min)·100 // (max − min)``; all 0 when max == min."""
    lo, hi = values.min(), values.max()
    if hi == lo:
        return np.zeros_like(values)
    scores: np.ndarray = (values - lo) * MAX_NODE_SCORE // (hi - lo)
    return scores
