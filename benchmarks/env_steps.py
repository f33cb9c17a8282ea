"""Environment steps per second of the vectorized simulator (openb default trace, 1,213 nodes).

    python benchmarks/env_steps.py --data "$OPENB" [--seconds 20] [--model PATH]

Three figures, each a decision = one pod placed by a policy:

- **trainer rollout** (``VectorCore`` + the numpy policy, exactly what ``rlsched train`` runs between
  updates): features for the grouped candidates, network, sampling, placement, reward;
- **gym env, random valid action** (``SchedulingEnv``: the fixed-shape observation over all nodes);
- **gymnasium SyncVectorEnv** of 4 ``SchedulingEnv`` (what an outside RL library would use).

Single process, single thread; episodes end just after 100 % arrival (``end_at=1.005``), as in training.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from rlsched.policy.env import EnvConfig, SchedulingCore, SchedulingEnv, VectorCore  # noqa: E402
from rlsched.policy.features import FeatureEncoder  # noqa: E402
from rlsched.policy.learned import DEFAULT_MODEL, load_learned_scorer  # noqa: E402
from rlsched.policy.network import choose_node  # noqa: E402
from rlsched.policy.trace import load_nodes, load_pods, openb_default  # noqa: E402
from rlsched.policy.typical import typical_pods  # noqa: E402


def trainer_rollout(nodes, pods, typical, model, num_envs: int, seconds: float) -> tuple[float, int]:
    config = EnvConfig(end_at=1.005)
    cores = [
        SchedulingCore(nodes, pods, typical, config, FeatureEncoder(typical, model.encoder.cpu_weight))
        for _ in range(num_envs)
    ]
    vec = VectorCore(cores, seed0=5000)
    net, rank_scale = model.network, model.decision.rank_scale
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for e, core in enumerate(vec.cores):
            cand = core.candidates
            s = net.scores(cand.features, cand.prior)
            pos = choose_node(
                s[cand.group] - rank_scale * core.rank_frac[cand.nodes], cand.nodes, core.tiebreak, "sample"
            )
            _, done = core.step_node(int(cand.nodes[pos]))
            vec.after_step(e, done)
            steps += 1
    return steps / (time.perf_counter() - start), steps


def gym_single(nodes, pods, typical, seconds: float) -> tuple[float, int]:
    env = SchedulingEnv(nodes, pods, typical, EnvConfig(end_at=1.005))
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=1)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        action = rng.choice(np.flatnonzero(obs["action_mask"]))
        obs, _, done, _, _ = env.step(action)
        if done:
            obs, _ = env.reset()
        steps += 1
    return steps / (time.perf_counter() - start), steps


def gym_vector(nodes, pods, typical, num_envs: int, seconds: float) -> tuple[float, int]:
    envs = gym.vector.SyncVectorEnv(
        [lambda: SchedulingEnv(nodes, pods, typical, EnvConfig(end_at=1.005)) for _ in range(num_envs)]
    )
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=1)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions = np.array([rng.choice(np.flatnonzero(m)) if m.any() else 0 for m in obs["action_mask"]])
        obs, _, _, _, _ = envs.step(actions)
        steps += num_envs
    envs.close()
    return steps / (time.perf_counter() - start), steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder with the openb CSV files (default: $RLSCHED_OPENB_DIR)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time per figure")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    try:
        data = Path(openb_default(args.data, "--data"))
    except ValueError as exc:
        parser.error(str(exc))
    nodes = load_nodes(data / "openb_node_list_gpu_node.csv")
    pods = load_pods(data / "openb_pod_list_default.csv")
    typical = typical_pods(pods)
    model = load_learned_scorer(args.model, typical)
    trainer_rollout(nodes, pods, typical, model, 1, 2.0)  # warm numba's caches
    rows = []
    for name, fn in [
        ("trainer rollout, 1 env", lambda: trainer_rollout(nodes, pods, typical, model, 1, args.seconds)),
        ("trainer rollout, 4 envs", lambda: trainer_rollout(nodes, pods, typical, model, 4, args.seconds)),
        ("gym SchedulingEnv, random valid action", lambda: gym_single(nodes, pods, typical, args.seconds)),
        ("gym SyncVectorEnv x4, random valid action", lambda: gym_vector(nodes, pods, typical, 4, args.seconds)),
    ]:
        rate, steps = fn()
        rows.append({"what": name, "steps_per_s": round(rate, 1), "steps": steps})
        print(f"{name:45s} {rate:8.0f} steps/s  ({steps} steps)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"trace": "default", "nodes": len(nodes), "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
