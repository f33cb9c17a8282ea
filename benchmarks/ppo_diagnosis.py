#!/usr/bin/env python3
"""Why GAE-PPO cannot move the policy, measured: the signal one decision leaves in a 10,000-decision episode.

For a model (default: the bundled one) on workload seeds that are neither evaluation (42–51) nor
validation (100–109) seeds, this plays each seed with the model as served and, at states spread over
the arrival window, tries the model's ``--actions`` likeliest groups in copies of the simulation that
share the future (common random numbers, :mod:`rlsched.policy.ppo.vine`). It reports:

- **the effect of one decision**: how often the tried actions lead to different returns, and by how much
  (the true advantage, in % of GPU capacity);
- **the noise it must be found in**: the spread of whole-episode returns across workload seeds (what a
  Monte Carlo return adds to every decision's advantage), hence a per-decision signal-to-noise ratio;
- **what GAE sees**: the critic's one-step advantage ``r + V(s'_a) − V(s)`` of the same actions, and its
  correlation with the true advantage (GAE's advantage of a decision hundreds of steps before the
  first failure is this TD term plus discounted later ones, which do not depend on the action);
- **the logit scale**: the prior's logit gap between the tried actions against the network's output
  spread, and the most the output layer can move two nodes apart (2·Σ|w_out|, as ``h2`` ∈ [−1, 1]).

    python benchmarks/ppo_diagnosis.py --seeds 5000-5003 --points 30 --json docs/ppo-diagnosis.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingCore
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.features import FeatureEncoder
from rlsched.policy.learned import DEFAULT_MODEL, load_learned_scorer
from rlsched.policy.ppo.vine import advantages, branch_points, collect_trunk
from rlsched.policy.trace import load_nodes, load_pods
from rlsched.policy.typical import typical_pods


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="../shared/data/openb/openb_node_list_gpu_node.csv")
    p.add_argument("--pods", default="../shared/data/openb/openb_pod_list_default.csv")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--seeds", default="5000-5003", help="workload seeds (default: %(default)s)")
    p.add_argument("--points", type=int, default=30, help="branch states per seed (default: %(default)s)")
    p.add_argument("--actions", type=int, default=4, help="actions tried per state (default: %(default)s)")
    p.add_argument("--window", type=float, nargs=2, default=(0.85, 0.99), help="arrival window (default: %(default)s)")
    p.add_argument(
        "--mode", choices=("greedy", "sample"), default="greedy", help="how the model plays (default: %(default)s)"
    )
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)

    pods = load_pods(args.pods)
    typical = typical_pods(pods)
    scorer = load_learned_scorer(args.model, typical)
    net, rank_scale = scorer.network, scorer.decision.rank_scale
    core = SchedulingCore(
        load_nodes(args.nodes),
        pods,
        typical,
        EnvConfig(end_at=1.005, reward=RewardConfig(1.0, 0.0)),
        FeatureEncoder(typical, scorer.encoder.cpu_weight),
    )
    t0 = time.time()
    points, unalloc = [], []
    for seed in parse_seeds(args.seeds):
        rng = np.random.default_rng(seed)
        pts, u = collect_trunk(
            net, core, seed, branch_points(rng, tuple(args.window), args.points), args.actions, rank_scale, args.mode
        )
        points += pts
        unalloc.append(u)
        print(
            f"seed {seed}: unallocated {u:.3f} %, {len(pts)} states, {time.time() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    adv = np.concatenate([advantages(pt)[1] for pt in points])
    spread = np.array([np.ptp(pt.returns) for pt in points])
    td = []
    for pt in points:
        d = pt.first_rewards + pt.next_values - pt.value
        w, _ = advantages(pt)
        td.append(d - float(w @ d))
    td = np.concatenate(td)
    nz = np.abs(adv) > 0
    corr = float(np.corrcoef(adv, td)[0, 1]) if adv.std() > 0 and td.std() > 0 else float("nan")
    best_true = [int(np.argmax(pt.returns)) for pt in points if np.ptp(pt.returns) > 0]
    best_td = [int(np.argmax(pt.first_rewards + pt.next_values)) for pt in points if np.ptp(pt.returns) > 0]
    prior_gap, net_gap = [], []
    for pt in points:
        rows = pt.actions
        prior_gap.append(float(np.ptp(net.prior_scale * pt.prior[rows])))
        out = net.scores(pt.x[rows], np.zeros(len(rows)))
        net_gap.append(float(np.ptp(out)))
    w_out = np.abs(net.p["w_out"]).sum()
    episode_std = float(np.std(unalloc, ddof=1)) if len(unalloc) > 1 else float("nan")
    figures = {
        "model": Path(args.model).name,
        "seeds": args.seeds,
        "mode": args.mode,
        "states": len(points),
        "actions_per_state": args.actions,
        "window": list(args.window),
        "episode_unallocated_mean": float(np.mean(unalloc)),
        "episode_return_std_across_seeds": episode_std,
        "states_where_the_action_matters": float((spread > 0).mean()),
        "true_advantage_abs_median_nonzero": float(np.median(np.abs(adv[nz]))) if nz.any() else 0.0,
        "true_advantage_abs_p90_nonzero": float(np.percentile(np.abs(adv[nz]), 90)) if nz.any() else 0.0,
        "snr_one_decision_vs_episode_noise": (float(np.median(np.abs(adv[nz]))) / episode_std) if nz.any() else 0.0,
        "critic_td_advantage_abs_median": float(np.median(np.abs(td))),
        "corr_true_vs_critic_td": corr,
        "critic_picks_the_best_action": float(np.mean(np.array(best_true) == np.array(best_td)))
        if best_true
        else float("nan"),
        "chance_of_picking_the_best": 1.0 / args.actions,
        "prior_logit_gap_median": float(np.median(prior_gap)),
        "network_logit_gap_median": float(np.median(net_gap)),
        "network_max_logit_move": float(2 * w_out),
        "seconds": time.time() - t0,
    }
    for k, v in figures.items():
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
