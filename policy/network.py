"""The policy network in numpy (serving and rollouts), and the decision rule that turns scores into a node.

Layout (the torch twin in :mod:`rlsched.policy.ppo.agent` has the same parameters and names)::

    h1   = tanh(x @ w1 + b1)                     x: one feature row per candidate group [G, F]
    h2   = tanh(h1 @ w2 + b2)
    s    = prior_scale · prior + h2 @ w_out + b_out          node score (a logit), per group
    pool = [Σ_g (count_g / K) · h2_g,  max_g h2_g,  cluster]  pooled cluster summary
    v    = tanh(pool @ v1 + c1) @ v_out + c_out              value
    special = pool @ w_special + b_special                   logits of delay, reject

Every candidate node is scored by the same weights, so one model serves clusters of any size. The
prior is FGD-CPU's fragmentation change (in cards); the MLP learns a correction on top of it.

**Decision rule.** The logit of node ``i`` is ``s[group(i)] − rank_scale · r_i`` where ``r_i`` in
[0, 1) is node ``i``'s place in the :class:`~rlsched.policy.scorers.base.TieBreak` order: the same
seed-fixed order that makes FGD's ties consolidate pods on a few nodes, here as a soft preference.
``mode="sample"`` draws a node from the softmax of those logits with the tie-break's random stream
(how the policy was trained, and the default); ``mode="greedy"`` takes the largest logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .scorers.base import TieBreak

NETWORK_VERSION = 1
"""Version of the parameter layout above."""

SPECIAL_ACTIONS = ("delay", "reject")
"""Actions besides "schedule on node i", in the order of the special head's outputs."""

DECISION_MODES = ("sample", "greedy")


@dataclass(frozen=True)
class DecisionRule:
    """How node scores become a choice (stored in the model manifest)."""

    rank_scale: float = 80.0
    """Weight of the tie-break order in the logits (logit units per whole order)."""
    mode: str = "sample"
    """``sample`` (as trained) or ``greedy``."""

    def __post_init__(self) -> None:
        if self.mode not in DECISION_MODES:
            raise ValueError(f"decision mode must be one of {', '.join(DECISION_MODES)}, got {self.mode!r}")
        if not self.rank_scale >= 0:
            raise ValueError(f"rank_scale must be non-negative, got {self.rank_scale}")


def param_shapes(
    num_features: int, num_cluster: int, hidden: tuple[int, int], value_hidden: int
) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter array, by name."""
    h1, h2 = hidden
    pooled = 2 * h2 + num_cluster
    return {
        "w1": (num_features, h1),
        "b1": (h1,),
        "w2": (h1, h2),
        "b2": (h2,),
        "w_out": (h2,),
        "b_out": (),
        "v1": (pooled, value_hidden),
        "c1": (value_hidden,),
        "v_out": (value_hidden,),
        "c_out": (),
        "w_special": (pooled, len(SPECIAL_ACTIONS)),
        "b_special": (len(SPECIAL_ACTIONS),),
    }


class PolicyNetwork:
    """numpy inference for a trained policy (float32 weights, float32 activations)."""

    def __init__(self, params: dict[str, np.ndarray], prior_scale: float):
        self.p = {k: np.array(v, dtype=np.float32, order="C") for k, v in params.items()}
        self.prior_scale = float(prior_scale)
        self.hidden_size = self.p["w2"].shape[1]

    def hidden(self, x: np.ndarray) -> np.ndarray:
        """h2 for feature rows ``x`` [G, F]."""
        p = self.p
        h = np.tanh(x @ p["w1"] + p["b1"])
        return np.tanh(h @ p["w2"] + p["b2"])

    def scores(self, x: np.ndarray, prior: np.ndarray, h2: np.ndarray | None = None) -> np.ndarray:
        """float64[G]: the node score (logit before the tie-break term) per candidate group."""
        if h2 is None:
            h2 = self.hidden(x)
        out = h2 @ self.p["w_out"] + self.p["b_out"]
        return self.prior_scale * np.asarray(prior, dtype=np.float64) + out.astype(np.float64)

    def pooled(self, h2: np.ndarray, count: np.ndarray, cluster: np.ndarray) -> np.ndarray:
        """The pooled cluster summary the value and special heads read (zeros for the node parts when
        no node fits)."""
        if len(h2) == 0:
            zeros = np.zeros(self.hidden_size, dtype=np.float32)
            return np.concatenate([zeros, zeros, cluster]).astype(np.float32)
        w = (count / count.sum()).astype(np.float32)
        return np.concatenate([w @ h2, h2.max(axis=0), cluster]).astype(np.float32)

    def value(self, pooled: np.ndarray) -> float:
        p = self.p
        return float(np.tanh(pooled @ p["v1"] + p["c1"]) @ p["v_out"] + p["c_out"])

    def special_logits(self, pooled: np.ndarray) -> np.ndarray:
        return (pooled @ self.p["w_special"] + self.p["b_special"]).astype(np.float64)


# -- the decision rule -------------------------------------------------------------------------------


def rank_fraction(tiebreak: TieBreak, nodes: np.ndarray) -> np.ndarray:
    """float64[K]: each node's place in the tie-break order, scaled to [0, 1)."""
    rank = tiebreak.rank
    return rank[nodes] / (float(rank.max()) + 1.0)


def node_logits(group_scores: np.ndarray, group: np.ndarray, rank_frac: np.ndarray, rank_scale: float) -> np.ndarray:
    """float64[K]: per node, its group's score minus the tie-break term."""
    return group_scores[group] - rank_scale * rank_frac


def group_offsets(group: np.ndarray, rank_frac: np.ndarray, rank_scale: float, num_groups: int) -> np.ndarray:
    """float64[G]: ``log Σ_{i in g} exp(−rank_scale · r_i)``, so that softmax over groups of
    ``score_g + offset_g`` is the probability the node-level softmax gives each group."""
    z = -rank_scale * rank_frac
    top = np.full(num_groups, -np.inf)
    np.maximum.at(top, group, z)
    acc = np.zeros(num_groups)
    np.add.at(acc, group, np.exp(z - top[group]))
    return top + np.log(acc)


def sample_index(logits: np.ndarray, rng: np.random.Generator) -> int:
    """A draw from softmax(logits) using one uniform number from ``rng``."""
    z = np.exp(logits - logits.max())
    cdf = np.cumsum(z)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(z) - 1))


def choose_node(logits: np.ndarray, nodes: np.ndarray, tiebreak: TieBreak, mode: str) -> int:
    """Position (into ``nodes``) of the chosen node, given the node logits."""
    if len(logits) == 1:
        return 0
    if mode == "greedy":
        return tiebreak.argmax(logits, nodes)
    return sample_index(logits, tiebreak.rng)


def log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max()
    return z - (m + np.log(np.exp(z - m).sum()))
