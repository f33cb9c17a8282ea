"""The living cluster as a training environment (LivingCore) and ``rlsched train --mode dynamic``."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from openb_files import write_openb

from rlsched.policy import NodeSpec, PodSpec, typical_pods
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.env import LivingConfig, LivingCore, LivingReward
from rlsched.policy.dynamic.objective import SlaSettings
from rlsched.policy.dynamic.simulator import DynamicSettings

NODES = [NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(24)]
PODS = [
    PodSpec("w1", 8000, 16384, 1, 1000, (), 0, 900, "LS"),
    PodSpec("s1", 4000, 8192, 1, 500, (), 0, 600, "LS"),
    PodSpec("s2", 2000, 4096, 1, 250, (), 0, 300, "BE"),
    PodSpec("c1", 4000, 8192, 0, 0, (), 0, 1200, "BE"),
]
TYPICAL = typical_pods(PODS)


def core(**kw: object) -> LivingCore:
    settings = DynamicSettings(
        arrivals=ArrivalSettings(load=0.5, window_s=1800.0), sla=SlaSettings(cpu_threshold=0.3, gpu_threshold=0.3)
    )
    return LivingCore(NODES, PODS, TYPICAL, LivingConfig(settings, **kw))  # type: ignore[arg-type]


def play(c: LivingCore, pick: str = "first", delay_every: int = 0) -> list[float]:
    rewards: list[float] = []
    k = 0
    while not c.done:
        k += 1
        if delay_every and k % delay_every == 0 and c.special_mask()[0]:
            rewards.append(c.step_delay()[0])
            continue
        cand = c.candidates
        assert cand is not None and len(cand.nodes) >= 2
        node = int(cand.nodes[0] if pick == "first" else cand.nodes[-1])
        rewards.append(c.step_node(node)[0])
    return rewards


def test_an_episode_runs_to_its_end_with_a_metric() -> None:
    c = core()
    c.reset(3)
    rewards = play(c)
    assert c.decisions == len(rewards) > 10
    assert c.result is not None and c.episode_metric() == pytest.approx(-100 * c.result.objective(c.config.weights))
    assert c.episode_return == pytest.approx(sum(rewards))


def test_the_sla_reward_charges_decisions_that_leave_a_hot_node() -> None:
    c = core(reward=LivingReward(sla=1.0, frag=0.0))
    c.reset(3)
    rewards = play(c)
    assert set(np.round(rewards, 9)) <= {0.0, -1.0}
    assert -sum(rewards) == c.sla_hits > 0  # a low threshold (30 %): some decisions land on hot nodes


def test_the_same_seed_replays_the_same_episode() -> None:
    a, b = core(), core()
    a.reset(5)
    b.reset(5)
    assert play(a) == play(b)


def test_delay_holds_the_pod_and_costs_latency() -> None:
    c = core(allow_delay=True, hold_s=60.0, max_holds=1)
    c.reset(3)
    rewards = play(c, delay_every=3)
    assert c.result is not None and c.result.holds > 0
    # a hold costs hold_s / latency_scale_s = 60 / 300
    assert any(r == pytest.approx(-0.2) for r in rewards)
    assert c.result.wait_mean_s > 0


def test_no_reject_and_a_foreign_node_is_refused() -> None:
    c = core()
    c.reset(3)
    assert not c.special_mask()[1]
    with pytest.raises(ValueError):
        c.step_reject()
    cand = c.candidates
    assert cand is not None
    missing = next(n for n in range(len(NODES) + 1) if n not in set(cand.nodes.tolist()))
    with pytest.raises(ValueError):
        c.step_node(missing)


def test_a_pickled_core_restarts_its_episode() -> None:
    c = core()
    c.reset(4)
    first = c.candidates
    assert first is not None
    c.step_node(int(first.nodes[0]))
    restored = pickle.loads(pickle.dumps(c))
    assert restored.seed == 4 and restored.decisions == 0 and not restored.done
    assert restored.candidates is not None and restored.candidates.nodes.tolist() == first.nodes.tolist()


def test_train_in_the_living_cluster_and_serve_the_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from rlsched.policy import make_scorer
    from rlsched.policy.dynamic.simulator import run_dynamic
    from rlsched.policy.ppo import Args, train

    nodes, pods = write_openb(tmp_path, NODES, PODS)
    args = Args(
        exp_name="living", mode="dynamic", nodes=str(nodes), traces=(str(pods),), num_envs=2, num_steps=16,
        total_timesteps=64, num_minibatches=2, update_epochs=2, hidden=(8, 8), value_hidden=8, eval_every=2,
        checkpoint_every=100, val_seeds=(5,), out_dir=str(tmp_path / "runs"), progress=False, dynamic_window_s=900.0,
        dynamic_load=0.5, allow_delay=True,
    )  # fmt: skip
    result = train(args)
    assert result.steps == 64 and result.best_val is not None and np.isfinite(result.best_val)
    scorer = make_scorer(f"ppo:{result.model_path}", TYPICAL)
    served = run_dynamic(
        NODES, PODS, scorer, 7, TYPICAL, DynamicSettings(arrivals=ArrivalSettings(load=0.5, window_s=900.0))
    )
    assert served.window_pods > 0
    # The model was trained with the delay action: a delay head that always wins holds pods back
    # (at most MAX_HOLDS times each), one that never wins holds none, and the ablation never delays.
    settings = DynamicSettings(arrivals=ArrivalSettings(load=0.5, window_s=900.0))
    assert scorer.delays and scorer.hold_s == args.hold_s
    scorer.network.p["b_special"][0] = 1e9
    eager = run_dynamic(NODES, PODS, scorer, 7, TYPICAL, settings)
    assert eager.holds > 0 and eager.wait_p99_s >= args.hold_s
    scorer.network.p["b_special"][0] = -1e9
    assert run_dynamic(NODES, PODS, scorer, 7, TYPICAL, settings).holds == 0
    assert not make_scorer(f"ppo-prior:{result.model_path}", TYPICAL).delays  # type: ignore[attr-defined]


def test_the_bundled_living_cluster_model_loads_and_its_network_is_not_zero() -> None:
    from rlsched.policy.learned import load_learned_scorer

    path = Path(__file__).parents[2] / "policy" / "models" / "ppo-openb-dynamic.npz"
    scorer = load_learned_scorer(path)
    assert scorer.manifest["training"]["args"]["mode"] == "dynamic"
    prior = load_learned_scorer(path, prior_only=True)
    assert np.abs(scorer.network.p["w_out"]).sum() > 0 and prior.name == "ppo-prior"


def test_training_takes_the_objective_from_a_scheduling_policy(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from rlsched.policy.dynamic.objective import ObjectiveWeights
    from rlsched.policy.ppo import Args
    from rlsched.policy.ppo.trainer import make_living_cores

    nodes, pods = write_openb(tmp_path, NODES, PODS)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "kind: SchedulingPolicy\nspec:\n  objective: {beta: 0.8, strandedWeight: 5, slaGpuThreshold: 0.7}\n"
    )
    common = dict(mode="dynamic", nodes=str(nodes), traces=(str(pods),), num_envs=1, sla_threshold=0.6)
    config = make_living_cores(Args(**common, objective_from=str(policy)))[0].config  # type: ignore[arg-type]
    assert config.weights == ObjectiveWeights(beta=0.8, stranded=5.0)
    assert config.settings.sla == SlaSettings(cpu_threshold=0.9, gpu_threshold=0.7)  # the policy's, not --sla-threshold
    plain = make_living_cores(Args(**common))[0].config  # type: ignore[arg-type]
    assert plain.weights == ObjectiveWeights() and plain.settings.sla == SlaSettings(0.6, 0.6)
    policy.write_text("kind: SchedulingPolicy\nspec: {objective: {latencyScaleSeconds: -1}}\n")
    with pytest.raises(ValueError, match="latencyScaleSeconds"):
        make_living_cores(Args(**common, objective_from=str(policy)))  # type: ignore[arg-type]


def test_the_ls_reward_charges_the_expected_latency_sensitive_exposure_a_decision_adds() -> None:
    """``ls``: −(risk · LS pods after − before) × hours the pod stays; 0 weight changes nothing."""
    base, charged = core(reward=LivingReward(sla=0.0, frag=0.0)), core(reward=LivingReward(sla=0.0, frag=0.0, ls=2.0))
    base.reset(3)
    charged.reset(3)
    a, b = play(base), play(charged)
    assert set(a) == {0.0} and charged.ls_exposure > 0.0 and base.ls_exposure == 0.0
    assert -sum(b) == pytest.approx(2.0 * charged.ls_exposure)
    assert any(r < 0 for r in b)
    risks = [charged.cluster.hot_risk(n) for n in range(len(NODES))]
    assert all(0.0 <= r <= 1.0 for r in risks) and max(risks) > 0.0


def test_hot_risk_is_the_normal_tail_of_the_node_pods_usage() -> None:
    import math

    c = core()
    c.reset(3)
    cluster = c.cluster
    node = int(np.argmax(cluster.node_moments[0]))
    cpu_mean, cpu_var, gpu_mean, gpu_var = cluster.node_moments[:, node]
    running = [i for i in cluster.running() if cluster.node_of[i] == node]
    assert cpu_mean == pytest.approx(sum(cluster.pod_moments[0, i] for i in running))
    t_cpu = 0.3 * cluster.cpu_cap[node]
    t_gpu = 0.3 * cluster.gpu_cap[node]
    p_cpu = 0.5 * math.erfc((t_cpu - cpu_mean) / math.sqrt(2 * cpu_var))
    p_gpu = 0.5 * math.erfc((t_gpu - gpu_mean) / math.sqrt(2 * gpu_var)) if gpu_mean > 0 else 0.0
    assert cluster.hot_risk(node) == pytest.approx(1 - (1 - p_cpu) * (1 - p_gpu))


def test_a_pod_with_one_feasible_node_is_never_offered_the_delay() -> None:
    """Served, a pod with one feasible node is placed unscored and never held; training offered the
    delay for such pods too (two thirds of the delays offered at load 1.0), for a choice it never gets."""
    nodes = [NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(4)]
    settings = DynamicSettings(arrivals=ArrivalSettings(load=0.95, window_s=7200.0))
    c = LivingCore(nodes, PODS, TYPICAL, LivingConfig(settings, allow_delay=True))
    c.reset(5)
    decisions = 0
    while not c.done:
        cand = c.candidates
        assert cand is not None and len(cand.nodes) >= 2
        decisions += 1
        c.step_node(int(cand.nodes[0]))
    assert decisions > 0  # a few: most pods here have one node to go to
