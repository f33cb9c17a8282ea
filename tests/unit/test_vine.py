"""Branch rollouts with common random numbers (policy/ppo/vine.py) and the vine training loop."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import small_nodes, small_pods, small_typical, write_workload  # noqa: E402

from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingCore  # noqa: E402
from rlsched.policy.features import CLUSTER_FEATURES, FEATURES, FeatureEncoder  # noqa: E402
from rlsched.policy.learned import load_learned_scorer  # noqa: E402
from rlsched.policy.network import PolicyNetwork  # noqa: E402
from rlsched.policy.ppo import Args, train  # noqa: E402
from rlsched.policy.ppo.agent import Agent  # noqa: E402
from rlsched.policy.ppo.vine import (  # noqa: E402
    BranchBatch,
    BranchPoint,
    advantages,
    branch_points,
    collect_trunk,
    play_out,
    vine_loss,
)

RANK = 20.0


def core_and_net(seed: int = 0) -> tuple[SchedulingCore, PolicyNetwork]:
    typical = small_typical()
    core = SchedulingCore(
        small_nodes(),
        small_pods(),
        typical,
        EnvConfig(end_at=1.0, reward=RewardConfig(1.0, 0.0)),
        FeatureEncoder(typical),
    )
    torch.manual_seed(seed)
    agent = Agent(len(FEATURES), len(CLUSTER_FEATURES), (8, 8), 8, 50.0)
    return core, PolicyNetwork(agent.to_arrays(), prior_scale=50.0)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_a_copy_replays_the_same_future(mode: str) -> None:
    """Common random numbers: a pickled copy of the simulation, played by the same policy, ends with
    exactly the same return — also when the policy samples (the random stream is copied too)."""
    core, net = core_and_net()
    core.reset(7)
    for _ in range(20):
        core.step_node(int(core.candidates.nodes[0]))
    assert not core.done
    copy = pickle.loads(pickle.dumps(core))
    assert play_out(net, core, RANK, mode) == play_out(net, copy, RANK, mode)


def test_collect_trunk_tries_the_likeliest_groups_and_is_deterministic() -> None:
    core, net = core_and_net()
    points = branch_points(np.random.default_rng(1), (0.3, 0.9), 6)
    a, ua = collect_trunk(net, core, 11, points, 3, RANK, "sample")
    b, ub = collect_trunk(net, core, 11, points, 3, RANK, "sample")
    assert ua == ub and len(a) == len(b) > 0
    for p, q in zip(a, b, strict=True):
        np.testing.assert_array_equal(p.returns, q.returns)
        assert 2 <= len(p.actions) <= 3 and len(set(p.actions.tolist())) == len(p.actions)
        assert np.all(np.diff(p.logprobs) <= 1e-6), "the likeliest groups first"
        assert p.returns.dtype == np.float64 and np.all(p.returns <= 0)
        assert len(p.next_values) == len(p.first_rewards) == len(p.actions)
    assert [p.arrived for p in a] == sorted(p.arrived for p in a)


def point(returns: list[float], logprobs: list[float], groups: int = 3) -> BranchPoint:
    rng = np.random.default_rng(len(returns))
    return BranchPoint(
        x=rng.random((groups, len(FEATURES)), dtype=np.float32),
        prior=np.zeros(groups, np.float32),
        offset=np.zeros(groups, np.float32),
        count=np.ones(groups, np.float32),
        cluster=np.zeros(len(CLUSTER_FEATURES), np.float32),
        actions=np.arange(len(returns), dtype=np.int64),
        logprobs=np.array(logprobs, np.float32),
        returns=np.array(returns, np.float64),
        arrived=0.9,
    )


def test_advantages_are_centred_under_the_policy_weights() -> None:
    w, a = advantages(point([-1.0, -2.0, -4.0], [np.log(0.5), np.log(0.3), np.log(0.2)]))
    np.testing.assert_allclose(w, [0.5, 0.3, 0.2], rtol=1e-6)
    assert abs(float(w @ a)) < 1e-6 and a[0] > 0 > a[2]
    w, a = advantages(point([-3.0, -3.0], [-0.1, -2.0]))
    assert np.all(a == 0), "equal outcomes carry no signal"


def test_the_surrogate_raises_the_better_action() -> None:
    """A few optimizer steps on the vine loss move probability towards the action whose branch ended better."""
    torch.manual_seed(0)
    agent = Agent(len(FEATURES), len(CLUSTER_FEATURES), (8, 8), 8, 50.0)
    pts = [point([-1.0, -2.0, -2.0], [np.log(1 / 3)] * 3)]
    batch = BranchBatch(pts)
    pairs = np.arange(len(batch))
    before = agent.get_action_and_value(batch.ragged(pairs), torch.from_numpy(batch.action))[1].detach()
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2)
    for _ in range(20):
        loss, stats = vine_loss(agent, batch, pairs, clip_coef=0.2, adv_scale=1.0, ent_coef=0.0, vf_coef=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = agent.get_action_and_value(batch.ragged(pairs), torch.from_numpy(batch.action))[1].detach()
    assert after[0] > before[0] and after[1] < before[1]
    assert np.isfinite(stats["approx_kl"])


def vine_args(tmp_path: Path, **kw) -> Args:
    nodes, pods = write_workload(tmp_path)
    base = dict(
        exp_name="vine",
        seed=3,
        nodes=nodes,
        traces=(pods,),
        advantage="vine",
        vine_trunks=2,
        vine_points=3,
        vine_actions=2,
        vine_window=(0.3, 0.9),
        total_timesteps=18,
        num_minibatches=2,
        update_epochs=2,
        hidden=(8, 8),
        value_hidden=8,
        end_at=1.0,
        eval_every=1,
        checkpoint_every=1,
        val_seeds=(5,),
        out_dir=str(tmp_path / "runs"),
        progress=False,
        rank_scale=RANK,
        head_lr_scale=10.0,
        workers=1,  # one process unless a test asks for more (the default is one per core)
    )
    base.update(kw)
    return Args(**base)


def test_vine_run_exports_resumes_and_matches_across_worker_counts(tmp_path: Path) -> None:
    one = train(vine_args(tmp_path / "a"))
    assert len(one.history) == 4  # iteration 0 (validation of the start) + 3
    for row in one.history[1:]:
        for key in ("pg_loss", "v_loss", "approx_kl", "clipfrac", "head_l1", "grad_out.weight"):
            assert np.isfinite(row[key]), (key, row)
    assert load_learned_scorer(one.model_path).manifest["training"]["args"]["advantage"] == "vine"
    two = train(vine_args(tmp_path / "b", workers=2))
    assert [r.get("pg_loss") for r in one.history] == [r.get("pg_loss") for r in two.history]

    first = train(vine_args(tmp_path / "c", max_iterations=1))
    resumed = train(vine_args(tmp_path / "c", resume=str(Path(first.run_dir) / "checkpoint.pt")))
    a = torch.load(Path(one.run_dir) / "checkpoint.pt", weights_only=False)["agent"]
    b = torch.load(Path(resumed.run_dir) / "checkpoint.pt", weights_only=False)["agent"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
