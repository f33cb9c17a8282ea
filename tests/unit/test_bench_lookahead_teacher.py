"""benchmarks/lookahead_teacher.py: the teacher judges its tried actions on the future it then plays."""

from __future__ import annotations

import pickle

import pytest
from benchmark_scripts import load_benchmark
from ppo_fixtures import small_nodes, small_pods, small_typical

from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingCore
from rlsched.policy.features import FeatureEncoder
from rlsched.policy.learned import DEFAULT_MODEL, load_learned_scorer
from rlsched.policy.network import PolicyNetwork
from rlsched.policy.playout import play_out, policy_step
from rlsched.policy.ppo.vine import group_node


@pytest.mark.parametrize("mode", ["sample", "greedy"])
def test_the_return_judged_for_the_kept_action_is_the_return_played(mode: str) -> None:
    """Common random numbers: after the teacher's decision, the model plays on from the same random
    stream as the copy that judged the action kept (in ``sample`` mode the model's own pick takes a
    draw; the copies must start after it, as the played trajectory does)."""
    teacher = load_benchmark("lookahead_teacher")
    typical = small_typical()
    scorer = load_learned_scorer(str(DEFAULT_MODEL), typical, prior_only=True)
    # a flat policy (prior scale 1 instead of 50, a small rank weight): its samples vary, so a copy one
    # draw off the played stream would end differently
    net, rank = PolicyNetwork(scorer.network.p, prior_scale=1.0), 1.0
    core = SchedulingCore(
        small_nodes(),
        small_pods(),
        typical,
        EnvConfig(end_at=1.0, reward=RewardConfig(1.0, 0.0)),
        FeatureEncoder(typical, scorer.encoder.cpu_weight),
    )
    core.reset(3)
    checked = 0
    while not core.done:
        if core.candidates.num_groups > 1 and core.arrived >= 0.5 * core.capacity:
            best, _, returns = teacher.teach(net, core, rank, mode, 3)
            played = pickle.loads(pickle.dumps(core))  # the teacher's trajectory from here, the model deciding
            reward, _ = played.step_node(group_node(played, best))
            assert reward + play_out(net, played, rank, mode) == returns.max()
            checked += 1
        node, _ = policy_step(net, core, rank, mode)
        core.step_node(node)
    assert checked >= 5
