"""The gymnasium environment and the simulation core (policy/env.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from ppo_fixtures import small_nodes, small_pods, small_typical

from rlsched.policy import ClusterState, feasible_nodes, run_sequence
from rlsched.policy.env import ActionLayout, EnvConfig, RewardConfig, SchedulingCore, SchedulingEnv, VectorCore
from rlsched.policy.features import CLUSTER_FEATURES, NUM_FEATURES, FeatureEncoder
from rlsched.policy.learned import LearnedScorer
from rlsched.policy.network import DecisionRule, PolicyNetwork, choose_node, param_shapes
from rlsched.policy.workload import inflate


def make_env(**config) -> SchedulingEnv:
    return SchedulingEnv(small_nodes(), small_pods(), small_typical(), EnvConfig(**config))


def test_check_env_passes() -> None:
    env = make_env()
    check_env(env, skip_render_check=True)


def test_check_env_with_delay_and_reject() -> None:
    check_env(make_env(allow_delay=True, allow_reject=True, end_at=1.0), skip_render_check=True)


def test_observation_mask_and_layout() -> None:
    env = make_env()
    obs, info = env.reset(seed=3)
    n = len(small_nodes())
    assert env.action_space.n == n + 2 == ActionLayout(n).size
    assert obs["nodes"].shape == (n, NUM_FEATURES)
    core = env.core
    mask = obs["action_mask"]
    assert (np.flatnonzero(mask[:n]) == feasible_nodes(core.state, core.req)).all()
    assert mask[n] == mask[n + 1] == 0  # delay and reject are off by default
    assert (obs["nodes"][mask[:n] == 0] == 0).all()
    assert (info["action_mask"] == mask).all()
    layout = ActionLayout(n)
    assert (layout.delay, layout.reject, layout.preempt(0)) == (n, n + 1, n + 2)


def test_masked_action_rejects_the_pod() -> None:
    env = make_env()
    obs, _ = env.reset(seed=4)
    bad = int(np.flatnonzero(obs["action_mask"] == 0)[0])
    failed_before = env.core.failed_pods
    _, reward, _, _, info = env.step(bad)
    assert info["invalid_action"] and env.core.failed_pods >= failed_before + 1
    assert reward <= 0


def test_same_seed_same_episode() -> None:
    def rollout(seed: int) -> list[float]:
        env = make_env()
        obs, _ = env.reset(seed=seed)
        rewards, done = [], False
        while not done:
            action = int(np.flatnonzero(obs["action_mask"])[0])
            obs, r, done, _, _ = env.step(action)
            rewards.append(r)
        return rewards

    assert rollout(11) == rollout(11)


def test_return_is_minus_the_failed_gpu() -> None:
    """With only the failure term, the undiscounted return is −(failed GPU milli) / capacity · 100."""
    cfg = EnvConfig(reward=RewardConfig(fail_weight=1.0, frag_weight=0.0))
    core = SchedulingCore(small_nodes(), small_pods(), small_typical(), cfg)
    core.reset(5)
    total = 0.0
    while not core.done:
        total += core.step_node(int(core.candidates.nodes[-1]))[0]
    assert core.failed_milli > 0
    assert total == pytest.approx(-core.failed_milli * 100 / core.capacity)
    assert core.episode_return == pytest.approx(total)


def test_delay_requeues_and_reject_fails() -> None:
    core = SchedulingCore(
        small_nodes(),
        small_pods(),
        small_typical(),
        EnvConfig(allow_delay=True, allow_reject=True, delay_pods=3, max_delays=1),
    )
    core.reset(2)
    pod, at, length = core.pod, core.position, len(core.queue)
    core.step_delay()
    assert len(core.queue) == length + 1 and core.queue[at + 1 + 3] is pod and core.delays[at + 4] == 1
    while core.pod is not pod:
        core.step_node(int(core.candidates.nodes[0]))
    assert not core.special_mask()[0]  # max_delays reached
    with pytest.raises(ValueError):
        core.step_delay()
    failed = core.failed_pods
    core.step_reject()
    assert core.failed_pods == failed + 1


def test_episode_ends_after_end_at() -> None:
    core = SchedulingCore(small_nodes(), small_pods(), small_typical(), EnvConfig(end_at=0.5))
    core.reset(1)
    while not core.done:
        core.step_node(int(core.candidates.nodes[0]))
    assert core.arrived > 0.5 * core.capacity
    assert core.position < len(core.queue)


def test_core_plays_exactly_like_the_served_scorer() -> None:
    """The trainer's rollout (core + numpy policy) and decide() with the learned scorer place every pod alike."""
    rng = np.random.default_rng(0)
    shapes = param_shapes(NUM_FEATURES, len(CLUSTER_FEATURES), (8, 8), 8)
    params = {k: rng.normal(scale=0.3, size=s).astype(np.float32) for k, s in shapes.items()}
    net = PolicyNetwork(params, prior_scale=20.0)
    typical = small_typical()
    rule = DecisionRule(rank_scale=15.0, mode="sample")
    scorer = LearnedScorer(net, FeatureEncoder(typical), rule)
    nodes, pods = small_nodes(), small_pods()
    seed = 9
    served = run_sequence(
        nodes,
        inflate(pods, ClusterState(nodes).gpu_milli_capacity, seed),
        scorer,
        seed,
        typical,
        record_placements=True,
    )
    core = SchedulingCore(nodes, pods, typical, EnvConfig(end_at=10.0))
    core.reset(seed)
    placed = []
    while not core.done:
        cand = core.candidates
        s = net.scores(cand.features, cand.prior)
        pos = choose_node(
            s[cand.group] - rule.rank_scale * core.rank_frac[cand.nodes], cand.nodes, core.tiebreak, "sample"
        )
        node = int(cand.nodes[pos])
        pod = core.pod
        core.step_node(node)
        placed.append((pod.name, core.state.names[node]))
    assert placed == [(p, n) for p, n, _ in served.placements]
    assert core.failed_pods == served.failed_pods


def test_vector_core_restarts_episodes_with_new_seeds() -> None:
    cores = [SchedulingCore(small_nodes(), small_pods(), small_typical(), EnvConfig(end_at=0.3)) for _ in range(2)]
    vec = VectorCore(cores, seed0=100)
    assert [c.seed for c in vec.cores] == [100, 101]
    for _ in range(200):
        for e, core in enumerate(vec.cores):
            _, done = core.step_node(int(core.candidates.nodes[0]))
            vec.after_step(e, done)
    finished = vec.pop_finished()
    assert finished and {f["seed"] for f in finished} >= {100, 101}
    assert all(c.seed >= 102 for c in vec.cores)
