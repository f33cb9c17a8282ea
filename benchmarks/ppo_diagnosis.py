#!/usr/bin/env python3
"""Why per-decision PPO cannot move the policy, measured: the signal one decision leaves in a 10,000-decision episode.

For a model (default: the bundled one) on workload seeds that are neither evaluation (42–51) nor
validation (100–109) seeds, this plays each seed with the model as served and, at states spread over
the arrival window, tries the model's ``--actions`` likeliest groups in copies of the simulation that
share the future (common random numbers, :mod:`rlsched.policy.ppo.vine`). It reports:

- **the effect of one decision**: how often the tried actions lead to different returns, and by how much
  (the true advantage, in % of GPU capacity), against the spread of whole episodes across seeds;
- **what GAE sees**: the critic's one-step advantage ``r + V(s'_a) − V(s)`` of the same actions, and its
  correlation with the true advantage (GAE's advantage of a decision hundreds of steps before the
  first failure is this TD term plus discounted later ones, which do not depend on the action);
- **the logit scale**: the prior's logit gap between the tried actions against the network's output
  spread, and the most the output layer can move two nodes apart (2·Σ|w_out|, as ``h2`` ∈ [−1, 1]);
- **whether the per-decision signal is learnable** (``--fit``, needs torch): the network is fitted to
  the branch outcomes of 80 % of the seeds (the policy-improvement objective over the tried actions)
  and judged on the other 20 %: how often it orders two actions as their outcomes do, against the
  bundled model and its prior.

    python benchmarks/ppo_diagnosis.py --nodes "$OPENB"/openb_node_list_gpu_node.csv \\
        --pods "$OPENB"/openb_pod_list_default.csv --seeds 6000-6019 --points 16 --actions 3 --window 0.6 0.96 \\
        --workers 2 --fit --json docs/ppo-diagnosis.json

Playing is the slow part (about 30 s per seed and core): ``--max-minutes`` stops it and keeps the seeds
played, ``--save-points FILE`` keeps the branched states, and ``--from-points FILE`` reads them back to
refit (``--fit-epochs``) without playing again.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingCore
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.features import FeatureEncoder
from rlsched.policy.learned import DEFAULT_MODEL, load_learned_scorer
from rlsched.policy.ppo.vine import BranchPoint, advantages, branch_points, collect_trunk
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_default
from rlsched.policy.typical import typical_pods


def collect_seed(job: dict[str, Any]) -> tuple[int, list[BranchPoint], float, float]:
    """Play one workload seed and branch (a worker's job): (seed, points, unallocated %, seconds)."""
    t0 = time.time()
    pods = load_pods(job["pods"])
    typical = typical_pods(pods)
    scorer = load_learned_scorer(job["model"], typical)
    core = SchedulingCore(
        load_nodes(job["nodes"]),
        pods,
        typical,
        EnvConfig(end_at=1.005, reward=RewardConfig(1.0, 0.0)),
        FeatureEncoder(typical, scorer.encoder.cpu_weight),
    )
    seed = job["seed"]
    points = branch_points(np.random.default_rng(seed), tuple(job["window"]), job["points"])
    pts, u = collect_trunk(scorer.network, core, seed, points, job["actions"], scorer.decision.rank_scale, job["mode"])
    return seed, pts, u, time.time() - t0


def signal_figures(points: list[BranchPoint], unalloc: list[float], model: str) -> dict[str, float]:
    """The effect of one decision, what the critic makes of it, and the logit scale."""
    net = load_learned_scorer(model).network
    adv = np.concatenate([advantages(pt)[1] for pt in points])
    moving = np.array([np.ptp(pt.returns) > 0 for pt in points])
    td = []
    for pt in points:
        d = pt.first_rewards + pt.next_values - pt.value
        w, _ = advantages(pt)
        td.append(d - float(w @ d))
    td_all = np.concatenate(td)
    nz = adv != 0
    best_true = [int(np.argmax(pt.returns)) for pt, m in zip(points, moving, strict=True) if m]
    best_td = [int(np.argmax(pt.first_rewards + pt.next_values)) for pt, m in zip(points, moving, strict=True) if m]
    prior_gap = [float(np.ptp(net.prior_scale * pt.prior[pt.actions])) for pt in points]
    net_gap = [float(np.ptp(net.scores(pt.x[pt.actions], np.zeros(len(pt.actions))))) for pt in points]
    corr = float(np.corrcoef(adv, td_all)[0, 1]) if adv.std() > 0 and td_all.std() > 0 else float("nan")
    return {
        "states": len(points),
        "episode_unallocated_mean": float(np.mean(unalloc)),
        "episode_unallocated_std_across_seeds": float(np.std(unalloc, ddof=1)) if len(unalloc) > 1 else float("nan"),
        "states_where_the_action_matters": float(moving.mean()),
        "true_advantage_abs_median_nonzero": float(np.median(np.abs(adv[nz]))) if nz.any() else 0.0,
        "true_advantage_abs_p90_nonzero": float(np.percentile(np.abs(adv[nz]), 90)) if nz.any() else 0.0,
        "critic_td_advantage_abs_median": float(np.median(np.abs(td_all))),
        "corr_true_vs_critic_td": corr,
        "critic_picks_the_best_action": float(np.mean(np.array(best_true) == np.array(best_td))) if best_true else 0.0,
        "prior_logit_gap_median": float(np.median(prior_gap)),
        "network_logit_gap_median": float(np.median(net_gap)),
        "network_max_logit_move": float(2 * np.abs(net.p["w_out"]).sum()),
    }


def learnability(by_seed: dict[int, list[BranchPoint]], model: str, epochs: int) -> dict[str, float]:
    """Fit the network to the branch outcomes of 80 % of the seeds; pairwise ordering accuracy on the rest."""
    import torch

    from rlsched.policy.export import read_model
    from rlsched.policy.features import CLUSTER_FEATURES, FEATURES
    from rlsched.policy.ppo.agent import Agent
    from rlsched.policy.ppo.vine import BranchBatch

    seeds = sorted(by_seed)
    held = set(seeds[::5])
    train = [p for s in seeds if s not in held for p in by_seed[s]]
    val = [p for s in held for p in by_seed[s]]
    params, manifest, _ = read_model(model)

    def agent(zero_head: bool = False) -> Agent:
        net = manifest["network"]
        a = Agent(
            len(FEATURES),
            len(CLUSTER_FEATURES),
            tuple(net["hidden"]),
            int(net["valueHidden"]),
            float(net["priorScale"]),
        )
        a.load_arrays(params)
        if zero_head:
            with torch.no_grad():
                a.out.weight.zero_()
                a.out.bias.zero_()
        return a

    def tried_logits(a: Agent, pts: list[BranchPoint]) -> list[torch.Tensor]:
        b = BranchBatch(pts)
        rb = b.ragged(np.array([np.flatnonzero(b.point_of == i)[0] for i in range(len(pts))]))
        scores, _, _ = a(rb)
        z = scores + rb.offset
        return [z[int(rb.row_start[i]) + torch.from_numpy(p.actions)] for i, p in enumerate(pts)]

    def accuracy(a: Agent, pts: list[BranchPoint]) -> float:
        with torch.no_grad():
            logits = tried_logits(a, pts)
        agree = pairs = 0
        for z, p in zip(logits, pts, strict=True):
            r = p.returns
            for i in range(len(r)):
                for j in range(i + 1, len(r)):
                    if r[i] != r[j]:
                        pairs += 1
                        agree += int(bool(z[i] > z[j]) == bool(r[i] > r[j]))
        return agree / max(pairs, 1)

    fitted = agent()
    moving = [p for p in train if np.ptp(p.returns) > 0]
    scale = float(np.std(np.concatenate([p.returns - p.returns.mean() for p in moving]))) if moving else 1.0
    head = list(fitted.out.parameters())
    rest = [p for n, p in fitted.named_parameters() if n.startswith(("l1.", "l2."))]
    opt = torch.optim.Adam([{"params": rest, "lr": 1e-3}, {"params": head, "lr": 1e-2}])
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(len(moving))
        for s in range(0, len(order), 64):
            mb = [moving[i] for i in order[s : s + 64]]
            loss = torch.zeros(())
            for z, p in zip(tried_logits(fitted, mb), mb, strict=True):
                a = torch.from_numpy(((p.returns - p.returns.mean()) / scale).astype(np.float32))
                loss = loss - (torch.softmax(z, 0) * a).sum()
            opt.zero_grad()
            (loss / len(mb)).backward()
            opt.step()
    return {
        "train_states": len(train),
        "heldout_states": len(val),
        "heldout_pairs": sum(
            int(r[i] != r[j]) for r in (p.returns for p in val) for i in range(len(r)) for j in range(i + 1, len(r))
        ),
        "heldout_pairs_accuracy_bundled": accuracy(agent(), val),
        "heldout_pairs_accuracy_prior_only": accuracy(agent(zero_head=True), val),
        "heldout_pairs_accuracy_fitted": accuracy(fitted, val),
        "train_pairs_accuracy_bundled": accuracy(agent(), train),
        "train_pairs_accuracy_fitted": accuracy(fitted, train),
        "fit_epochs": epochs,
    }


def collect(args: argparse.Namespace) -> tuple[dict[int, list[BranchPoint]], list[float]]:
    """Play every seed and branch, in ``args.workers`` processes: (states by seed, each episode's unallocated %)."""
    jobs = [
        {
            "seed": s,
            "nodes": args.nodes,
            "pods": args.pods,
            "model": args.model,
            "window": args.window,
            "points": args.points,
            "actions": args.actions,
            "mode": args.mode,
        }
        for s in parse_seeds(args.seeds)
    ]
    by_seed: dict[int, list[BranchPoint]] = {}
    unalloc: list[float] = []
    deadline = time.time() + 60 * args.max_minutes if args.max_minutes > 0 else None
    with multiprocessing.get_context("fork").Pool(max(1, args.workers)) as pool:
        results = pool.imap_unordered(collect_seed, jobs)
        while True:
            try:
                seed, pts, u, secs = results.next(None if deadline is None else max(0.0, deadline - time.time()))
            except StopIteration:
                break
            except multiprocessing.TimeoutError:
                print(f"--max-minutes reached: {len(by_seed)} of {len(jobs)} seeds played", file=sys.stderr, flush=True)
                break
            by_seed[seed] = pts
            unalloc.append(u)
            print(f"seed {seed}: unallocated {u:.3f} %, {len(pts)} states, {secs:.0f} s", file=sys.stderr, flush=True)
    return by_seed, unalloc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", help="node list (default: the openb node list in $RLSCHED_OPENB_DIR)")
    p.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--seeds", default="6000-6019", help="workload seeds (default: %(default)s)")
    p.add_argument("--points", type=int, default=16, help="branch states per seed (default: %(default)s)")
    p.add_argument("--actions", type=int, default=3, help="actions tried per state (default: %(default)s)")
    p.add_argument("--window", type=float, nargs=2, default=(0.6, 0.96), help="arrival window (default: %(default)s)")
    p.add_argument(
        "--mode", choices=("greedy", "sample"), default="greedy", help="how the model plays (default: %(default)s)"
    )
    p.add_argument("--workers", type=int, default=1, help="processes (default: %(default)s)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="stop playing seeds after this long, keeping those done (0: none)",
    )
    p.add_argument("--fit", action="store_true", help="also test whether the per-decision signal is learnable (torch)")
    p.add_argument("--fit-epochs", type=int, default=30, help="epochs of the --fit check (default: %(default)s)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument(
        "--save-points", help="also pickle the branch states and the episodes' results here (for --from-points)"
    )
    p.add_argument(
        "--from-points",
        help="read the states of an earlier --save-points instead of playing (--nodes, --pods, --seeds and the "
        "play settings are then that run's; --model must be the model that played them). A pickle: read only "
        "files you wrote",
    )
    args = p.parse_args(argv)
    try:
        if not args.from_points:  # saved states need no trace
            args.nodes = openb_default(args.nodes, "--nodes", OPENB_NODES)
            args.pods = openb_default(args.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        p.error(str(exc))

    t0 = time.time()
    if args.from_points:
        with open(args.from_points, "rb") as f:
            saved = pickle.load(f)
        by_seed, unalloc = saved["by_seed"], saved["unalloc"]
        for key in ("seeds", "mode", "actions", "window"):
            setattr(args, key, saved["args"][key])
        if Path(saved["args"]["model"]).name != Path(args.model).name:
            print(f"warning: the states were played by {saved['args']['model']}, not --model", file=sys.stderr)
    else:
        by_seed, unalloc = collect(args)
    if not any(by_seed.values()):
        print(
            f"ppo_diagnosis: no branched states to measure ({len(by_seed)} seeds played"
            + (f" before --max-minutes {args.max_minutes:g} ran out" if args.max_minutes > 0 else "")
            + "): allow more minutes, or a window the episodes reach",
            file=sys.stderr,
        )
        return 1
    if args.save_points:
        with open(args.save_points, "wb") as f:
            pickle.dump({"by_seed": by_seed, "unalloc": unalloc, "args": vars(args)}, f, pickle.HIGHEST_PROTOCOL)
    points = [pt for s in sorted(by_seed) for pt in by_seed[s]]
    figures: dict[str, Any] = {
        "model": Path(args.model).name,
        "seeds": f"{args.seeds} ({len(by_seed)} seeds played)",
        "mode": args.mode,
        "actions_per_state": args.actions,
        "window": list(args.window),
        **signal_figures(points, unalloc, args.model),
    }
    if args.fit:
        figures.update(learnability(by_seed, args.model, args.fit_epochs))
    figures["seconds"] = time.time() - t0
    for k, v in figures.items():
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
