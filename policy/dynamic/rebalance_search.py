"""Learn the rebalancer's chooser in the living cluster: a cross-entropy search over its weights.

The chooser (:func:`rlsched.policy.rebalance.plan_moves`) scores every move it can make by a linear
function of what the move does: stranded GPU removed, CPU load taken off a hot node (weighted again
when the pod is latency-sensitive), whether the pod is latency-sensitive, how much GPU it holds, how
loaded its destination becomes, minus the price of a restart. The hand-set heuristic uses two of
those terms with weight 1 and a restart price of 100 milli; the learned chooser is the same
function with weights found here.

Why a search over whole runs and not per-move credit: a move's effect on stranding and on hot-node
time shows over the following hour, mixed with every arrival and departure after it. The search
scores each candidate by whole living-cluster runs, with **common random numbers** (every candidate
of a generation plays the same fresh workload seeds, so their differences are theirs alone), and
moves a Gaussian over the weights toward the best (the cross-entropy method: Rubinstein & Kroese,
*The Cross-Entropy Method*, 2004; its use for policy search: Szita & Lőrincz, Neural Computation 18,
2006).

**The reward** of a run is ``100 × objective − migration_penalty × (migrations per 100 pod-hours)``:
the product's objective (:func:`rlsched.policy.dynamic.objective.objective_of`, its default weights
unless ``objective_from`` names a SchedulingPolicy) with the migration cost in it. The default
penalty, 0.1, is an assumption: one migration per 100 pod-hours must win at least 0.1 objective points,
a fifth of what the hand-set heuristic wins per migration on openb (docs/rebalancer.md).

The exported weights are the best *validated* ones on held-out seeds, the hand-set heuristic's
included: if nothing the search finds beats the heuristic there, the file holds the heuristic's
weights and says so (``training.beatHeuristic``).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..cluster import NodeSpec, PodSpec
from ..rebalance import RebalanceSettings
from ..rebalance_weights import WEIGHTS, settings_from_weights, weights_of, write_weights_file
from ..scorers import make_scorer
from ..trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_file
from ..typical import TypicalPods, typical_pods
from .arrivals import ArrivalSettings
from .evaluation import priced_nodes
from .objective import objective_of
from .objective_spec import Objective, read_objective
from .rebalancing import RebalancerSettings, run_rebalanced
from .simulator import DynamicSettings

SEARCHED: dict[str, float] = {
    "fragmentation": 1.0,
    "hot": 1.0,
    "latencySensitiveHot": 1.0,
    "latencySensitive": 0.5,
    "podGpu": 0.05,
    "destinationLoad": 1.0,
    "migrationCost": 200.0,
}
"""The weights searched, each with the scale one unit of the search's Gaussian stands for."""


@dataclass
class SearchSettings:
    """How ``rlsched train-rebalancer`` searches (every field is a flag)."""

    nodes: str = openb_file(OPENB_NODES)
    """Node list (openb CSV or generic YAML/JSON; by default the openb node list in ``$RLSCHED_OPENB_DIR``);
    nodes without prices get the published price table's."""
    pods: str = openb_file(OPENB_PODS)
    """Pod list whose arrivals, lifetimes and QoS the living cluster replays (by default the openb default
    trace in ``$RLSCHED_OPENB_DIR``)."""
    policy: str = "fgd"
    """Placement policy the evicted pods are placed by (as in ``rlsched evaluate``)."""
    seed: int = 1
    """Seed of the search's own random numbers."""
    generations: int = 12
    """Generations of the search."""
    population: int = 10
    """Candidates per generation."""
    elites: int = 4
    """Best candidates the next Gaussian is fitted to."""
    seeds_per_candidate: int = 4
    """Workload seeds every candidate of a generation plays (the same ones: common random numbers)."""
    train_seed0: int = 20000
    """First training workload seed (generation g plays seeds train_seed0 + g·seeds_per_candidate …)."""
    val_seeds: tuple[int, ...] = (100, 101, 102, 103)
    """Held-out workload seeds that choose the exported weights (never 42–51, the evaluation seeds)."""
    eval_every: int = 3
    """Validate the search's mean every this many generations (and after the last)."""
    init_std: float = 0.5
    """Initial standard deviation of every weight, in units of its scale (``SEARCHED``)."""
    smoothing: float = 0.7
    """Weight of the elites in each update of mean and deviation (the rest keeps the old values)."""
    min_std: float = 0.03
    """Floor of every deviation (keeps the search from collapsing on noise)."""
    load: float = 0.9
    """Offered GPU load of the living cluster."""
    window_s: float = 1800.0
    """Measured seconds of each training run."""
    migration_penalty: float = 0.1
    """Objective points (×100) charged per migration per 100 pod-hours (see the module docstring)."""
    objective_from: str = ""
    """A SchedulingPolicy whose spec.objective weighs the runs (default: the objective's defaults)."""
    workers: int = 2
    """Processes that play the runs."""
    max_minutes: float = 30.0
    """Stop after this many minutes (0: no limit); the last validation runs regardless."""
    out: str = "runs/rebalance/learned-weights.json"
    """Where the weights file is written."""
    hand: dict[str, float] = field(default_factory=lambda: weights_of(RebalanceSettings()))
    """The heuristic's weights: the search's start and its yardstick."""


@dataclass
class Best:
    """The best validated weights so far."""

    weights: dict[str, float]
    val: float
    generation: int
    heuristic: bool
    """Whether these are the heuristic's own weights (nothing found beat them)."""


_FILES = ("nodes", "pods", "objective_from", "out")
"""Settings that are paths: the weights file records their file names only (no folder of the machine)."""

_WORKER: dict[str, Any] = {}


def _init(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], typical: TypicalPods, cfg: dict[str, Any]) -> None:
    _WORKER.update(nodes=nodes, pods=pods, typical=typical, **cfg)


def play(job: tuple[dict[str, float], int]) -> dict[str, float]:
    """One living-cluster run of the chooser with ``weights`` on workload ``seed``: its reward and measures."""
    weights, seed = job
    w = _WORKER
    plan = settings_from_weights(weights)
    result, _ = run_rebalanced(
        w["nodes"],
        w["pods"],
        make_scorer(w["policy"], w["typical"]),
        seed,
        w["typical"],
        "heuristic-usage",  # the planner that measured per-pod use; the weights are the candidate's
        w["dynamic"],
        RebalancerSettings(plan=plan),
    )
    summary = result.summary()
    objective = objective_of(summary, w["objective"])
    migrations = result.migrations_per_100_pod_hours
    return {
        "reward": 100.0 * objective - w["penalty"] * migrations,
        "objective": objective,
        "stranded_gpu_pct": float(summary["stranded_gpu_pct"]),
        "sla_hot_node_pct": float(summary["sla_hot_node_pct"]),
        "migrations_per_100_pod_h": migrations,
    }


def _project(x: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """Search coordinates → valid weights (bounds of ``WEIGHTS``; hot + latencySensitiveHot ≥ 0)."""
    out = {}
    for v, name in zip(x, names, strict=True):
        _, _, low, high, _ = WEIGHTS[name]
        out[name] = float(np.clip(v * SEARCHED[name], low, high))
    if "latencySensitiveHot" in out:
        out["latencySensitiveHot"] = max(out["latencySensitiveHot"], -out.get("hot", 1.0))
    return out


def search(cfg: SearchSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the search; write the weights file (``cfg.out``) and a ``history`` next to it; return the file's body."""
    started = time.monotonic()
    rng = np.random.default_rng(cfg.seed)
    nodes = priced_nodes(load_nodes(cfg.nodes))
    pods = load_pods(cfg.pods)
    typical = typical_pods(pods)
    spec = read_objective(cfg.objective_from) if cfg.objective_from else Objective()
    worker_cfg = {
        "policy": cfg.policy,
        "dynamic": DynamicSettings(arrivals=ArrivalSettings(load=cfg.load, window_s=cfg.window_s), sla=spec.sla),
        "objective": spec.weights,
        "penalty": cfg.migration_penalty,
    }
    names = list(SEARCHED)
    hand = {**weights_of(RebalanceSettings()), **cfg.hand}
    mean = np.array([hand[n] / SEARCHED[n] for n in names])
    std = np.full(len(names), cfg.init_std)
    history: list[dict[str, Any]] = []

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(cfg.workers, initializer=_init, initargs=(nodes, pods, typical, worker_cfg)) as pool:

        def validate(weights: dict[str, float]) -> tuple[float, list[dict[str, float]]]:
            runs = pool.map(play, [({**hand, **weights}, s) for s in cfg.val_seeds], chunksize=1)
            return float(np.mean([r["reward"] for r in runs])), runs

        hand_val, hand_runs = validate(hand)
        best = Best(dict(hand), hand_val, 0, True)
        log(f"heuristic on validation seeds {list(cfg.val_seeds)}: reward {hand_val:.4f}")
        for g in range(1, cfg.generations + 1):
            seeds = [cfg.train_seed0 + (g - 1) * cfg.seeds_per_candidate + k for k in range(cfg.seeds_per_candidate)]
            xs = mean + std * rng.standard_normal((cfg.population, len(names)))
            cands = [_project(x, names) for x in xs]
            jobs = [({**hand, **c}, s) for c in cands for s in seeds]
            runs = pool.map(play, jobs, chunksize=1)
            rewards = np.array(
                [np.mean([r["reward"] for r in runs[i * len(seeds) : (i + 1) * len(seeds)]]) for i in range(len(cands))]
            )
            elite = np.argsort(-rewards)[: cfg.elites]
            ex = np.array([[cands[i][n] / SEARCHED[n] for n in names] for i in elite])
            mean = cfg.smoothing * ex.mean(axis=0) + (1 - cfg.smoothing) * mean
            std = np.maximum(cfg.smoothing * ex.std(axis=0) + (1 - cfg.smoothing) * std, cfg.min_std)
            row: dict[str, Any] = {
                "generation": g,
                "seeds": seeds,
                "reward_best": float(rewards.max()),
                "reward_median": float(np.median(rewards)),
                "mean": _project(mean, names),
                "std": {n: float(s * SEARCHED[n]) for n, s in zip(names, std, strict=True)},
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            over = cfg.max_minutes > 0 and time.monotonic() - started > 60 * cfg.max_minutes
            if g % max(cfg.eval_every, 1) == 0 or g == cfg.generations or over:
                val, _ = validate(row["mean"])
                row["val_reward"] = val
                if val > best.val:
                    best = Best({**hand, **row["mean"]}, val, g, False)
            history.append(row)
            log(
                f"generation {g}: best {row['reward_best']:.4f}, median {row['reward_median']:.4f}"
                + (f", validation {row['val_reward']:.4f} (heuristic {hand_val:.4f})" if "val_reward" in row else "")
                + f", {row['elapsed_s']:.0f}s"
            )
            if over:
                log(f"stopping: {cfg.max_minutes} minutes")
                break

    provenance = {
        "method": "cross-entropy search over whole living-cluster runs, common random numbers per generation",
        "settings": {
            k: (list(v) if isinstance(v, tuple) else Path(v).name if k in _FILES and v else v)
            for k, v in asdict(cfg).items()
        },
        "heuristicValidationReward": hand_val,
        "validationReward": best.val,
        "chosenAtGeneration": best.generation,
        "beatHeuristic": not best.heuristic,
        "seconds": round(time.monotonic() - started, 1),
    }
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_weights_file(out, best.weights, provenance)
    out.with_name(out.stem + "-history.json").write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
    log(
        f"wrote {out}: {'learned weights' if provenance['beatHeuristic'] else 'the heuristic (nothing beat it)'}, "
        f"validation {best.val:.4f} vs heuristic {hand_val:.4f}"
    )
    return {"weights": best.weights, "training": provenance}
