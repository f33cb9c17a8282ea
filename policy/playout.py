"""Play a scheduling episode with the numpy network: no torch, so evolution strategies (``rlsched
train --init``) and the vine trainer's rollouts share it, and the first runs without the ``train`` extra."""

from __future__ import annotations

from .env import SchedulingCore
from .network import PolicyNetwork, choose_node


def policy_step(net: PolicyNetwork, core: SchedulingCore, rank_scale: float, mode: str) -> tuple[int, int]:
    """(node, group) the policy picks for the current decision (``mode`` as in ``network.choose_node``)."""
    cand = core.candidates
    assert cand is not None, "no decision pending (the episode has ended)"
    s = net.scores(cand.features, cand.prior)
    r = core.rank_frac[cand.nodes]
    pos = choose_node(s[cand.group] - rank_scale * r, cand.nodes, core.tiebreak, mode)
    return int(cand.nodes[pos]), int(cand.group[pos])


def play_out(net: PolicyNetwork, core: SchedulingCore, rank_scale: float, mode: str) -> float:
    """Play the episode to its end with the policy; the sum of the rewards on the way."""
    total = 0.0
    while not core.done:
        node, _ = policy_step(net, core, rank_scale, mode)
        reward, _ = core.step_node(node)
        total += reward
    return total
