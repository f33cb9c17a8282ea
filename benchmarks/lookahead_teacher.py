#!/usr/bin/env python3
"""How much could a perfect judge of single decisions gain? A clairvoyant one-step lookahead teacher.

On one workload seed, the model (prior only by default: its network zeroed) plays the episode; inside
an arrival window, every decision is instead taken by a *teacher* that tries the model's ``--actions``
likeliest groups in copies of the simulation, plays each copy to the end with the model (common random
numbers: the same arrivals, the same random stream — the teacher knows the future), and keeps the
best. Outside the window the model decides. The gain of the teacher over the model on the same seed
bounds what learning per-decision corrections from such labels could give in that window.

    python benchmarks/lookahead_teacher.py --nodes "$OPENB"/openb_node_list_gpu_node.csv \\
        --pods "$OPENB"/openb_pod_list_default.csv --seed 5000 --window 0.90 0.965 --actions 3
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time

import numpy as np

from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingCore
from rlsched.policy.features import FeatureEncoder
from rlsched.policy.learned import DEFAULT_MODEL, load_learned_scorer
from rlsched.policy.network import PolicyNetwork, group_offsets, log_softmax
from rlsched.policy.ppo.vine import group_node, play_out, policy_step
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_default
from rlsched.policy.typical import typical_pods


def teach(
    net: PolicyNetwork, core: SchedulingCore, rank: float, mode: str, actions: int
) -> tuple[int, int, np.ndarray]:
    """The teacher's decision at ``core``'s pending pod: (the best group, the model's own pick, the
    return of each tried group). The model's pick is drawn first (in ``sample`` mode it takes one draw
    from the random stream, as the model's own play does at every decision); the copies are made
    after it, so each copy and the trajectory then played share every later draw: the return judged
    for the group kept is the return ``core`` then gets."""
    cand = core.candidates
    s = net.scores(cand.features, cand.prior)
    lp = log_softmax(s + group_offsets(cand.group, core.rank_frac[cand.nodes], rank, cand.num_groups))
    tried = np.argsort(-lp, kind="stable")[:actions]
    _, own = policy_step(net, core, rank, mode)
    snapshot = pickle.dumps(core)
    returns = []
    for g in tried:
        branch = pickle.loads(snapshot)
        reward, _ = branch.step_node(group_node(branch, int(g)))
        returns.append(reward + play_out(net, branch, rank, mode))
    return int(tried[int(np.argmax(returns))]), own, np.array(returns)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", help="node list (default: the openb node list in $RLSCHED_OPENB_DIR)")
    p.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--with-network", action="store_true", help="use the model as trained (default: its prior only)")
    p.add_argument("--seed", type=int, default=5000)
    p.add_argument("--window", type=float, nargs=2, default=(0.90, 0.965))
    p.add_argument("--actions", type=int, default=3)
    p.add_argument(
        "--mode", choices=("greedy", "sample"), default="sample", help="how the model plays (default: %(default)s)"
    )
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    try:
        args.nodes = openb_default(args.nodes, "--nodes", OPENB_NODES)
        args.pods = openb_default(args.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        p.error(str(exc))

    pods = load_pods(args.pods)
    typical = typical_pods(pods)
    scorer = load_learned_scorer(args.model, typical, prior_only=not args.with_network)
    net, rank = scorer.network, scorer.decision.rank_scale

    def new_core() -> SchedulingCore:
        config = EnvConfig(end_at=1.005, reward=RewardConfig(1.0, 0.0))
        return SchedulingCore(
            load_nodes(args.nodes), pods, typical, config, FeatureEncoder(typical, scorer.encoder.cpu_weight)
        )

    t0 = time.time()
    model = new_core()
    model.reset(args.seed)
    play_out(net, model, rank, args.mode)
    core = new_core()
    core.reset(args.seed)
    lo, hi = args.window
    decided = changed = 0
    while not core.done:
        cand = core.candidates
        if lo * core.capacity <= core.arrived <= hi * core.capacity and cand.num_groups > 1:
            best, own, _ = teach(net, core, rank, args.mode, args.actions)
            decided += 1
            changed += int(best != own)
            core.step_node(group_node(core, best))
            continue
        node, _ = policy_step(net, core, rank, args.mode)
        core.step_node(node)
    figures = {
        "seed": args.seed,
        "window": list(args.window),
        "actions": args.actions,
        "mode": args.mode,
        "network": args.with_network,
        "model_unallocated": model.unallocated_at_100(),
        "teacher_unallocated": core.unallocated_at_100(),
        "teacher_decisions": decided,
        "teacher_changed": changed,
        "seconds": time.time() - t0,
    }
    figures["gain"] = figures["model_unallocated"] - figures["teacher_unallocated"]
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
