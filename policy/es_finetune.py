"""Fine-tune a model for a cluster by evolution strategies on whole episodes (``rlsched train --method es``).

Why not PPO: per-decision credit does not move the policy on these ~10,000-decision episodes (the
diagnosis in docs/ppo.md), and the decision rule's tie-break weight (``decision.rankScale``) is a
hand-set number that no feature lets the network undo. On a cluster where that weight is wrong
(docs/ppo.md, ``eight-cards-g2``), the fix has to move the rule as well as the network.

What is searched: the score head (``w_out``, the network's last layer; with ``es_layers``, hidden layers
too) and, with ``es_rank_sigma > 0``, the rank weight — the rest of the start model (prior, features,
value and special heads) is kept. Each iteration draws ``es_pairs`` directions ``u`` and plays the model
at ``θ ± σ·u`` on the same fresh training workload seed (antithetic pairs with common random numbers: a
pair's difference is its perturbation's alone), then takes an Adam step along ``Σ (F₊ − F₋)·u /
(2·pairs·σ)`` with F the negative unallocated GPU % at 100 % arrival (Salimans et al. 2017, arXiv
1703.03864). Every ``es_eval_every`` iterations and at the end, θ is validated on the held-out
``val_seeds``; the best validated θ is the candidate. The best of many validations on a few seeds is
biased low (it picks lucky noise), so before export the candidate and the start model play
``es_confirm_seeds`` further held-out seeds, paired: the candidate is exported only if its mean there is
lower and it is better on more of them than it is worse (one lucky seed can carry a mean of ten), else
the start model is. A run never exports a model that did worse than its start on the seeds that chose it.

No torch: the episodes are numpy inference in the FGD-protocol simulator, ``workers`` processes wide.
"""

from __future__ import annotations

import json
import multiprocessing
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .cluster import ClusterState
from .env import EnvConfig, RewardConfig, SchedulingCore
from .evaluate import default_jobs
from .export import file_digest, read_model, save_model, trained_with_load, trained_with_qos
from .features import FeatureEncoder
from .learned import DEFAULT_MODEL
from .network import PolicyNetwork
from .playout import play_out
from .ppo.config import Args, TrainResult
from .published import trace_name
from .trace import load_nodes, load_pods
from .typical import typical_pods
from .workload import check_inflatable

Progress = Callable[[dict[str, Any]], None]


SEARCHABLE = ("w1", "b1", "w2", "b2", "w_out")
"""The policy path's parameters (``b_out`` moves every node's logit alike, so it is never searched)."""


@dataclass(frozen=True)
class SearchSpace:
    """θ = the searched parameters, flattened in ``layers`` order, then (when searched) the rank weight,
    with a σ and a step size each."""

    layers: tuple[tuple[str, tuple[int, ...]], ...]
    """(name, shape) of each searched parameter."""
    search_rank: bool

    @classmethod
    def of(cls, params: dict[str, np.ndarray], names: tuple[str, ...], search_rank: bool) -> SearchSpace:
        unknown = sorted(set(names) - set(SEARCHABLE))
        if unknown or not names:
            raise ValueError(
                f"--es-layers takes one or more of {' '.join(SEARCHABLE)}, got {' '.join(names) or 'none'}"
            )
        ordered = [n for n in SEARCHABLE if n in names]
        return cls(tuple((n, tuple(params[n].shape)) for n in ordered), search_rank)

    @property
    def n_layers(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.layers)

    def start(self, params: dict[str, np.ndarray], rank_scale: float) -> np.ndarray:
        theta = np.concatenate([params[n].astype(np.float64).ravel() for n, _ in self.layers])
        return np.append(theta, rank_scale) if self.search_rank else theta

    def scales(self, args: Args) -> tuple[np.ndarray, np.ndarray]:
        sigma = np.concatenate(
            [
                np.full(int(np.prod(shape)), args.es_sigma if n == "w_out" else args.es_hidden_sigma)
                for n, shape in self.layers
            ]
        )
        lr = sigma * (args.es_lr / args.es_sigma)
        if self.search_rank:
            sigma, lr = np.append(sigma, args.es_rank_sigma), np.append(lr, args.es_rank_lr)
        return sigma, lr

    def split(self, theta: np.ndarray, model_rank: float) -> tuple[dict[str, np.ndarray], float]:
        """(searched parameters by name, float32, rank weight): a searched rank weight is clipped at 0 (a
        negative one would spread pods in reverse tie-break order, which no rule intends)."""
        out, at = {}, 0
        for name, shape in self.layers:
            size = int(np.prod(shape))
            out[name] = theta[at : at + size].reshape(shape).astype(np.float32)
            at += size
        return out, (max(0.0, float(theta[self.n_layers])) if self.search_rank else model_rank)


class AntitheticAdam:
    """The ES step: the gradient estimate of antithetic pairs, then Adam (β 0.9 / 0.999) per coordinate."""

    def __init__(self, sigma: np.ndarray, lr: np.ndarray):
        self.sigma, self.lr = sigma, lr
        self.m, self.v = np.zeros_like(sigma), np.zeros_like(sigma)
        self.t = 0

    def gradient(self, u: np.ndarray, plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
        """``Σ_i (F(θ + σ·u_i) − F(θ − σ·u_i))·u_i / (2·pairs·σ)``, an estimate of ∇F (F: fitness, higher better)."""
        g: np.ndarray = ((plus - minus)[:, None] * u).sum(0) / (2 * len(u) * self.sigma)
        return g

    def step(self, theta: np.ndarray, g: np.ndarray) -> np.ndarray:
        """θ moved uphill along ``g``."""
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * g
        self.v = 0.999 * self.v + 0.001 * g * g
        m_hat, v_hat = self.m / (1 - 0.9**self.t), self.v / (1 - 0.999**self.t)
        return theta + self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


# -- the simulators, built in the parent and inherited by the forked workers ------------------------------

_WORKER: dict[str, Any] = {}


def _load_simulators(nodes: str, traces: tuple[str, ...], model: str, target: float, end_at: float) -> None:
    """One simulator per training trace, in this process (raises ValueError for an unreadable node list,
    pod list or model — before any worker starts)."""
    params, manifest, _ = read_model(model)
    cpu_weight = float(manifest["features"]["fgdCpuWeight"])
    config = EnvConfig(target=target, end_at=end_at, reward=RewardConfig(1.0, 0.0))
    node_specs = load_nodes(nodes)
    cores = []
    capacity = ClusterState(node_specs).gpu_milli_capacity
    for path in traces:
        pods = load_pods(path)
        try:
            check_inflatable(pods, capacity, target)  # here, not as a worker's traceback
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        typical = typical_pods(pods)
        encoder = FeatureEncoder(typical, cpu_weight, use_qos=trained_with_qos(manifest))
        cores.append(SchedulingCore(node_specs, pods, typical, config, encoder))
    _WORKER.update(
        cores=cores,
        params=params,
        prior_scale=float(manifest["network"]["priorScale"]),
        mode=str(manifest["decision"]["mode"]),
    )


def play_episode(job: tuple[dict[str, np.ndarray], float, int, int]) -> float:
    """Unallocated GPU % at 100 % arrival with the searched parameters ``searched`` and rank weight
    ``rank`` on workload ``seed`` of training trace ``trace``, decided as the model serves (its decision
    mode)."""
    searched, rank, trace, seed = job
    net = PolicyNetwork({**_WORKER["params"], **searched}, prior_scale=_WORKER["prior_scale"])
    core = _WORKER["cores"][trace]
    core.reset(seed)
    play_out(net, core, rank, _WORKER["mode"])
    value = core.unallocated_at_100()
    if value is None:  # pragma: no cover - an episode always measures pods before it ends
        raise RuntimeError(f"workload seed {seed} measured no pod before its end")
    return float(value)


# -- the search ---------------------------------------------------------------------------------------


def confirmation_seeds(args: Args) -> list[int]:
    """The ``es_confirm_seeds`` seeds right after the validation seeds (103–112 by default)."""
    return [max(args.val_seeds) + 1 + i for i in range(args.es_confirm_seeds)]


def confirm(seeds: list[int], start: list[float], candidate: list[float], iteration: int) -> dict[str, Any]:
    """The paired comparison that decides the export: the candidate (best validated, from ``iteration``)
    is exported only if its mean unallocated % over ``seeds`` is below the start model's and it is
    better on more seeds than it is worse."""
    diff = np.asarray(candidate) - np.asarray(start)
    better, worse = int((diff < 0).sum()), int((diff > 0).sum())
    return {
        "seeds": seeds,
        "candidateIteration": iteration,
        "start": [round(x, 4) for x in start],
        "candidate": [round(x, 4) for x in candidate],
        "meanDifference": round(float(diff.mean()), 4),
        "candidateBetterOn": better,
        "candidateWorseOn": worse,
        "exported": bool(diff.mean() < 0 and better > worse),
    }


def _budget_left(args: Args, elapsed_s: float, per_iteration_s: float, validation_s: float) -> bool:
    """Whether another iteration, and the validation after it, fit ``max_minutes`` (judged by the mean
    iteration so far and the first validation)."""
    return not args.max_minutes or elapsed_s + per_iteration_s + validation_s <= args.max_minutes * 60


def finetune(args: Args, progress: Progress | None = None) -> TrainResult:
    """Search the start model's ``es_layers`` (and rank weight) on ``args.traces`` over ``args.nodes``;
    export the best validated model to ``<out_dir>/<exp_name>-s<seed>/best.npz``."""
    if args.mode != "fgd":
        raise ValueError("--method es fine-tunes on the FGD protocol only (--mode fgd)")
    if not args.max_minutes and not args.max_iterations:
        raise ValueError("--method es needs --max-minutes or --max-iterations")
    if (
        min(args.es_pairs, args.es_seeds_per_pair, args.es_eval_every) < 1
        or args.es_sigma <= 0
        or args.es_hidden_sigma <= 0
        or args.es_rank_sigma < 0
        or args.es_confirm_seeds < 0
    ):
        raise ValueError(
            "--es-pairs, --es-seeds-per-pair and --es-eval-every must be ≥ 1, --es-sigma and --es-hidden-sigma "
            "> 0, --es-rank-sigma and --es-confirm-seeds ≥ 0"
        )
    start_model = args.init_model or str(DEFAULT_MODEL)
    params, manifest, _ = read_model(start_model)
    if trained_with_load(manifest):
        raise ValueError(
            f"{start_model} was trained in the living cluster (node load live); --method es fine-tunes on the "
            "FGD protocol, without load: use --method ppo --mode dynamic"
        )
    model_rank = float(manifest["decision"]["rankScale"])
    space = SearchSpace.of(params, tuple(args.es_layers), args.es_rank_sigma > 0)
    theta0 = space.start(params, model_rank)
    theta = theta0.copy()
    sigma, lr = space.scales(args)
    adam = AntitheticAdam(sigma, lr)
    _load_simulators(args.nodes, tuple(args.traces), start_model, args.target, args.end_at)
    run_dir = Path(args.out_dir) / f"{args.exp_name}-s{args.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "args.json").write_text(json.dumps(asdict(args), indent=1))
    confirm_seeds = confirmation_seeds(args)
    history: list[dict[str, Any]] = []
    best: tuple[float, int, np.ndarray] | None = None
    episodes = 0
    t0 = time.monotonic()

    def report(row: dict[str, Any]) -> None:
        history.append(row)
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        if progress is not None:
            progress(row)

    # no more processes than the largest batch of episodes played at once
    largest_batch = max(2 * args.es_pairs * args.es_seeds_per_pair, len(args.val_seeds), len(confirm_seeds), 1)
    processes = min(args.workers or default_jobs(), largest_batch)
    with multiprocessing.get_context("fork").Pool(processes) as pool:

        def play(t: np.ndarray, seeds: list[int] | tuple[int, ...]) -> list[float]:
            """θ on workload seeds of the first trace (validation and confirmation)."""
            nonlocal episodes
            searched, rank = space.split(t, model_rank)
            results: list[float] = pool.map(play_episode, [(searched, rank, 0, s) for s in seeds])
            episodes += len(results)
            return results

        def validate(t: np.ndarray) -> float:
            return float(np.mean(play(t, args.val_seeds)))

        def describe(t: np.ndarray) -> dict[str, float]:
            searched, rank = space.split(t, model_rank)
            moved = {f"{name}_moved": float(np.abs(searched[name] - params[name]).mean()) for name, _ in space.layers}
            return {"head_l1": float(np.abs(searched.get("w_out", params["w_out"])).sum()), "rank_scale": rank, **moved}

        val = validate(theta)
        validation_s = time.monotonic() - t0
        # the last validation and the confirmation (two models on the confirmation seeds) must fit too
        reserve_s = validation_s * (1 + 2 * len(confirm_seeds) / len(args.val_seeds))
        best = (val, 0, theta0)
        report({"iteration": 0, "val": val, **describe(theta), "seconds": round(time.monotonic() - t0, 1)})
        it, validated_at, last_val = 0, 0, val
        while not args.max_iterations or it < args.max_iterations:
            elapsed = time.monotonic() - t0
            # before the first iteration, its cost is estimated from the validation's: episodes alike
            episodes_per_iteration = 2 * args.es_pairs * args.es_seeds_per_pair
            per_iteration = (
                (elapsed - validation_s) / it
                if it
                else validation_s * episodes_per_iteration / max(len(args.val_seeds), 1)
            )
            if not _budget_left(args, elapsed, per_iteration, reserve_s):
                break
            it += 1
            u = np.random.default_rng([args.seed, it]).standard_normal((args.es_pairs, theta.size))
            k = args.es_seeds_per_pair
            seeds = [args.train_seed0 + (it - 1) * k + j + 1 for j in range(k)]
            trace = (it - 1) % len(args.traces)
            jobs = [
                (*space.split(theta + sign * sigma * d, model_rank), trace, seed)
                for sign in (1, -1)
                for d in u
                for seed in seeds
            ]
            fitness = -np.asarray(pool.map(play_episode, jobs)).reshape(2 * args.es_pairs, k).mean(axis=1)
            episodes += len(jobs)
            plus, minus = fitness[: args.es_pairs], fitness[args.es_pairs :]
            diff = plus - minus
            g = adam.gradient(u, plus, minus)
            theta = adam.step(theta, g)
            row: dict[str, Any] = {
                "iteration": it,
                "train_seeds": seeds,
                "fitness_mean": float(fitness.mean()),
                "pair_diff_abs_mean": float(np.abs(diff).mean()),
                "grad_norm": float(np.linalg.norm(g)),
                **describe(theta),
            }
            if it % args.es_eval_every == 0:
                row["val"] = validate(theta)
                validated_at, last_val = it, row["val"]
                if row["val"] < best[0]:
                    best = (row["val"], it, theta.copy())
            row["seconds"] = round(time.monotonic() - t0, 1)
            report(row)
        final_val = last_val if validated_at == it else validate(theta)
        if validated_at != it:
            if final_val < best[0]:
                best = (final_val, it, theta.copy())
            report({"iteration": it, "val": final_val, **describe(theta), "seconds": round(time.monotonic() - t0, 1)})
        confirmation: dict[str, Any] | None = None
        if best[1] != 0 and confirm_seeds:
            confirmation = confirm(confirm_seeds, play(theta0, confirm_seeds), play(best[2], confirm_seeds), best[1])
            if not confirmation["exported"]:
                best = (val, 0, theta0)
            report({"iteration": it, "confirmation": confirmation, "seconds": round(time.monotonic() - t0, 1)})

    best_val, best_it, best_theta = best
    searched, rank = space.split(best_theta, model_rank)
    pods = load_pods(args.traces[0])
    exported = {
        **manifest,
        "version": args.model_version or f"{args.exp_name}-s{args.seed}-es{best_it}",
        "decision": {**manifest["decision"], "rankScale": rank},
        "typicalPods": typical_pods(pods).to_json(),
        "training": {
            "method": "es",
            "command": " ".join(shlex.quote(x) for x in sys.argv),
            "args": asdict(args),
            "init": {
                "path": start_model,
                "sha256": file_digest(start_model),
                "version": manifest.get("version"),
                "rankScale": model_rank,
            },
            "nodes": args.nodes,
            "traces": [trace_name(t) or t for t in args.traces],
            "trainSeeds": f"{args.train_seed0 + 1}..{args.train_seed0 + it * args.es_seeds_per_pair}",
            "valSeeds": list(args.val_seeds),
            "valUnallocated": best_val,
            "bestIteration": best_it,
            "iterations": it,
            "confirmation": confirmation,
        },
    }
    path = run_dir / "best.npz"
    save_model(path, {**params, **searched}, exported)
    path.with_suffix(".json").write_text(json.dumps(exported, indent=1, sort_keys=True) + "\n")
    return TrainResult(str(path), best_val, final_val, episodes, time.monotonic() - t0, str(run_dir), history)
