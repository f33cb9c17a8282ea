#!/usr/bin/env python3
"""Episode-level search on the score head: evolution strategies with antithetic pairs and common random numbers.

Per-decision credit finds nothing to learn (benchmarks/ppo_diagnosis.py); this probes the other end:
does any small change of the network's output layer (``w_out``, 32 weights) change whole episodes for
the better? Each iteration draws ``--pairs`` directions ``u``, plays the model with ``w_out ± σ·u`` on
the same fresh training seed (common random numbers: the difference is the perturbation's alone), and
takes an Adam step along ``Σ (F₊ − F₋)·u`` (Salimans et al., 2017), F = −unallocated GPU %. Every
``--eval-every`` iterations the head is validated on held-out seeds.

``--rank-sigma S`` adds the decision rule's tie-break weight (``decision.rankScale``, 80 in the bundled
model) to the searched parameters, perturbed by ``S`` (clipped at 0): the one hand-set number of the
rule that the network cannot undo, since no feature tells it a node's tie-break rank. ``--export``
writes the result as a servable model (the start model with the new head and rank scale).

    python benchmarks/es_head_probe.py --iterations 25 --pairs 6 --sigma 0.5 --lr 0.1 --workers 2
    python benchmarks/es_head_probe.py --nodes variants/eight-cards-g2.json --iterations 20 --pairs 4 \
        --rank-sigma 20 --export es-eight-cards-g2.npz --json es-eight-cards-g2.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from typing import Any

import numpy as np

from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingCore
from rlsched.policy.export import read_model, save_model
from rlsched.policy.features import FeatureEncoder
from rlsched.policy.learned import DEFAULT_MODEL
from rlsched.policy.network import PolicyNetwork
from rlsched.policy.ppo.vine import play_out
from rlsched.policy.trace import load_nodes, load_pods
from rlsched.policy.typical import typical_pods

_WORKER: dict[str, Any] = {}


def _init(nodes: str, pods_path: str, model: str) -> None:
    pods = load_pods(pods_path)
    typical = typical_pods(pods)
    params, manifest, _ = read_model(model)
    config = EnvConfig(end_at=1.005, reward=RewardConfig(1.0, 0.0))
    cpu_weight = float(manifest["features"]["fgdCpuWeight"])
    _WORKER.update(
        core=SchedulingCore(load_nodes(nodes), pods, typical, config, FeatureEncoder(typical, cpu_weight)),
        params=params,
        prior_scale=float(manifest["network"]["priorScale"]),
        rank=float(manifest["decision"]["rankScale"]),
    )


def episode(job: tuple[np.ndarray, float | None, int]) -> float:
    """Unallocated GPU % at 100 % arrival of the model with score head ``w_out`` (and rank scale, None:
    the model's; already clipped at 0 by the caller's ``split``) on workload ``seed`` (greedy)."""
    head, rank, seed = job
    net = PolicyNetwork({**_WORKER["params"], "w_out": head.astype(np.float32)}, prior_scale=_WORKER["prior_scale"])
    core = _WORKER["core"]
    core.reset(seed)
    play_out(net, core, _WORKER["rank"] if rank is None else rank, "greedy")
    return float(core.unallocated_at_100())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="../shared/data/openb/openb_node_list_gpu_node.csv")
    p.add_argument("--pods", default="../shared/data/openb/openb_pod_list_default.csv")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--iterations", type=int, default=25)
    p.add_argument("--pairs", type=int, default=6, help="antithetic pairs per iteration")
    p.add_argument("--sigma", type=float, default=0.5, help="perturbation scale of each weight")
    p.add_argument("--lr", type=float, default=0.1, help="Adam step size")
    p.add_argument("--train-seed0", type=int, default=20000)
    p.add_argument("--seeds-per-pair", type=int, default=1, help="fresh training seeds each perturbation plays")
    p.add_argument("--val-seeds", type=int, nargs="+", default=[100, 101, 102])
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="write the history here")
    p.add_argument(
        "--rank-sigma",
        type=float,
        default=0.0,
        help="also search the decision rule's rank scale with this perturbation (0: keep the model's)",
    )
    p.add_argument("--rank-lr", type=float, default=5.0, help="Adam step size of the rank scale")
    p.add_argument("--export", help="write the searched model here (.npz, servable)")
    args = p.parse_args(argv)

    params, manifest, _ = read_model(args.model)
    head_shape = params["w_out"].shape
    search_rank = args.rank_sigma > 0
    # θ = the head's weights, then (with --rank-sigma) the rank scale; each with its own σ and step
    theta = params["w_out"].astype(np.float64).ravel()
    sigma = np.full(theta.size, args.sigma)
    lr = np.full(theta.size, args.lr)
    if search_rank:
        theta = np.append(theta, float(manifest["decision"]["rankScale"]))
        sigma, lr = np.append(sigma, args.rank_sigma), np.append(lr, args.rank_lr)
    n_head = params["w_out"].size

    def split(t: np.ndarray) -> tuple[np.ndarray, float | None]:
        return t[:n_head].reshape(head_shape), (max(0.0, float(t[n_head])) if search_rank else None)

    m, v = np.zeros_like(theta), np.zeros_like(theta)
    history: list[dict[str, Any]] = []
    t0 = time.time()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(args.workers, initializer=_init, initargs=(args.nodes, args.pods, args.model)) as pool:

        def validate(t: np.ndarray) -> float:
            return float(np.mean(pool.map(episode, [(*split(t), s) for s in args.val_seeds])))

        def describe(t: np.ndarray) -> dict[str, float]:
            head, rank = split(t)
            return {"head_l1": float(np.abs(head).sum()), **({"rank_scale": rank} if rank is not None else {})}

        history.append({"iteration": 0, "val": validate(theta), **describe(theta)})
        print(json.dumps(history[-1]), flush=True)
        for it in range(1, args.iterations + 1):
            u = np.random.default_rng([7, it]).standard_normal((args.pairs, theta.size))
            k = args.seeds_per_pair
            seeds = [args.train_seed0 + (it - 1) * k + j + 1 for j in range(k)]
            jobs = [(*split(theta + sign * sigma * d), seed) for sign in (1, -1) for d in u for seed in seeds]
            fit = -np.array(pool.map(episode, jobs)).reshape(2 * args.pairs, k).mean(axis=1)
            diff = fit[: args.pairs] - fit[args.pairs :]
            g = (diff[:, None] * u).sum(0) / (2 * args.pairs * sigma)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            theta = theta + lr * (m / (1 - 0.9**it)) / (np.sqrt(v / (1 - 0.999**it)) + 1e-8)
            row = {
                "iteration": it,
                "pair_diff_abs_mean": float(np.abs(diff).mean()),
                "fitness_mean": float(fit.mean()),
                "grad_norm": float(np.linalg.norm(g)),
                **describe(theta),
                "seconds": time.time() - t0,
            }
            if it % args.eval_every == 0 or it == args.iterations:
                row["val"] = validate(theta)
            history.append(row)
            print(json.dumps(row), flush=True)
    head, rank = split(theta)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"args": vars(args), "history": history, "head": head.ravel().tolist(), "rankScale": rank}, f, indent=1
            )
    if args.export:
        exported = {**manifest, "decision": {**manifest["decision"]}}
        if rank is not None:
            exported["decision"]["rankScale"] = rank
        exported["training"] = {**(manifest.get("training") or {}), "esHeadProbe": {"args": vars(args)}}
        save_model(args.export, {**params, "w_out": head.astype(np.float32)}, exported)
        print(f"wrote {args.export}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
