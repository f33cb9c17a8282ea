"""Learn the delay head in the living cluster: a cross-entropy search over its weights.

The delay head (:mod:`rlsched.policy.delay_head`) decides per pod whether to hold it back
``hold_s`` seconds. A hold's effect is on *other* pods: while a large pod waits, smaller ones take
the room and start sooner, and whether that pays shows only in the queue over the next minutes. PPO
with a per-decision reward charged each hold its own wait and never saw the gain (docs/dynamic.md:
the delay-trained model held erratically and lost to the model without delay). So the head is
scored, like the rebalancer's chooser (:mod:`.rebalance_search`), by whole living-cluster runs with
common random numbers: every candidate of a generation plays the same fresh workload seeds at every
training load, and a Gaussian over the weights moves toward the best (the cross-entropy method:
Rubinstein & Kroese, *The Cross-Entropy Method*, 2004; Szita & Lőrincz, Neural Computation 18, 2006).

**Loads.** Each candidate plays every load in ``loads`` (default 0.8, 0.9 and 1.0). Below 1.0 hardly any
pod waits and every hold is lost time; at 1.0 pods queue for minutes. A head that is scored on all of them
has to learn when to hold, not only whom.

**Inputs' scale.** Before the search, the placement policy plays one run per load without holds;
the mean and standard deviation of every input over its decisions are the head's ``center`` and
``scale`` (a constant input gets scale 1).

**The reward** of a run is ``100 × objective`` (the product's objective, its default weights
unless ``objective_from`` names a SchedulingPolicy). Candidates are ranked within each (load, seed)
pair and the ranks averaged (:func:`shaped_fitness`), so that the small, consistent loss of holding
below full load counts beside the large gain at full load. The search starts from the head that
never holds; the exported head is the best *validated* one on held-out seeds: the largest mean gain
over never holding among those that are worse at no load (:func:`validation_gain`). When none
qualifies, the file carries the never-holding head and says so (``training.beatNever``).

**Continuing.** When the start model already has a delay head, the search starts from it (its input
scales kept) instead of from never holding, and the start head is validated like any candidate.

**The placement under the search** is ``policy`` (default FGD: a run takes seconds, a run of the
learned network about 40 s on two cores). The head's inputs do not depend on who places, and the
exported file is the start model (``start_model``) with the head added: docs/dynamic.md evaluates
it under both placements.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from ..delay_head import DELAY_INPUTS, DelayHead, delay_inputs
from ..export import read_model, save_model
from ..scorers import NodeScores, Scorer, TieBreak, make_scorer
from ..trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_file
from ..typical import TypicalPods, typical_pods
from .arrivals import ArrivalSettings
from .evaluation import priced_nodes
from .objective import objective_of
from .objective_spec import Objective, read_objective
from .simulator import DynamicSettings, run_dynamic

DEFAULT_START_MODEL = Path(__file__).resolve().parent.parent / "models" / "ppo-openb-dynamic.npz"
"""The bundled living-cluster model (``policy/models/``, beside :data:`rlsched.policy.learned.DEFAULT_MODEL`)."""


class NoWaitError(ValueError):
    """The probe runs saw no decision the head could hold: its inputs have no center or spread to
    standardize by (their mean over no rows would be NaN, and the search would fail later, obscurely)."""


class WithDelayHead:
    """``base``'s placement with ``head``'s hold verdict (a scorer as the living cluster calls it)."""

    def __init__(self, base: Scorer, head: DelayHead | None, record: list[np.ndarray] | None = None):
        self.base, self.head, self.record = base, head, record
        self.name = base.name

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        return self.base.score(state, req, nodes)

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        return self.base.choose(scores, nodes, tiebreak)

    def cards(self, *args: Any) -> tuple[int, ...]:
        return self.base.cards(*args)

    def verdict(
        self, state: ClusterState, req: PodRequest, nodes: np.ndarray, scores: NodeScores | None
    ) -> tuple[str, str, float] | None:
        if self.record is not None:
            self.record.append(delay_inputs(state, req))
        if self.head is None or len(nodes) == 0 or not self.head.holds(state, req):
            return None
        return ("delay", "the delay head holds it", self.head.hold_s)


@dataclass
class DelaySearchSettings:
    """How ``rlsched train-delay`` searches (every field is a flag)."""

    nodes: str = openb_file(OPENB_NODES)
    """Node list (openb CSV or generic YAML/JSON; by default the openb node list in ``$RLSCHED_OPENB_DIR``);
    nodes without prices get the published price table's."""
    pods: str = openb_file(OPENB_PODS)
    """Pod list whose arrivals, lifetimes and QoS the living cluster replays (by default the openb default
    trace in ``$RLSCHED_OPENB_DIR``)."""
    start_model: str = str(DEFAULT_START_MODEL)
    """The model the head is added to (its placement network is kept as it is; by default the bundled
    ppo-openb-dynamic.npz, found next to the installed package wherever the command runs)."""
    policy: str = "fgd"
    """Placement policy under the head during the search (as in ``rlsched evaluate``)."""
    seed: int = 1
    """Seed of the search's own random numbers."""
    generations: int = 15
    """Generations of the search."""
    population: int = 10
    """Candidates per generation."""
    elites: int = 4
    """Best candidates the next Gaussian is fitted to."""
    seeds_per_load: int = 2
    """Workload seeds every candidate plays at each load (the same ones: common random numbers)."""
    loads: tuple[float, ...] = (0.8, 0.9, 1.0)
    """Offered GPU loads every candidate plays."""
    train_seed0: int = 30000
    """First training workload seed (generation g plays seeds train_seed0 + g·seeds_per_load …)."""
    val_seeds: tuple[int, ...] = (100, 101, 102, 103)
    """Held-out workload seeds (at every load) that choose the exported head (never 42–51, the evaluation seeds)."""
    eval_every: int = 3
    """Validate the search's mean every this many generations (and after the last)."""
    init_std: float = 1.0
    """Initial standard deviation of every weight (inputs are standardized)."""
    smoothing: float = 0.7
    """Weight of the elites in each update of mean and deviation (the rest keeps the old values)."""
    min_std: float = 0.05
    """Floor of every deviation (keeps the search from collapsing on noise)."""
    fitness: str = "ranked"
    """``ranked``: candidates ranked within each (load, seed) and a validated head must be worse at no
    load (see the module docstring); ``mean``: the plain mean reward over all runs, for both (how the
    bundled head's first search ran)."""
    hold_s: float = 60.0
    """How long a hold lasts."""
    window_s: float = 3600.0
    """Measured seconds of each run."""
    objective_from: str = ""
    """A SchedulingPolicy whose spec.objective weighs the runs (default: the objective's defaults)."""
    workers: int = 2
    """Processes that play the runs."""
    max_minutes: float = 30.0
    """Stop after this many minutes (0: no limit); the last validation runs regardless."""
    out: str = "runs/delay/ppo-openb-dynamic-delay.npz"
    """Where the model file (the start model plus the head) is written."""


_FILES = ("nodes", "pods", "start_model", "objective_from", "out")
"""Settings that are paths: the model file records their file names only (no folder of the machine)."""

_WORKER: dict[str, Any] = {}


def _init(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], typical: TypicalPods, cfg: dict[str, Any]) -> None:
    _WORKER.update(nodes=nodes, pods=pods, typical=typical, **cfg)


def _settings(load: float) -> DynamicSettings:
    w = _WORKER
    return DynamicSettings(arrivals=ArrivalSettings(load=load, window_s=w["window_s"]), sla=w["sla"])


def probe(job: tuple[float, int]) -> np.ndarray:
    """The head's inputs at every decision of one run without holds: float64[decisions, inputs]."""
    load, seed = job
    w = _WORKER
    rows: list[np.ndarray] = []
    scorer = WithDelayHead(make_scorer(w["policy"], w["typical"]), None, rows)
    run_dynamic(w["nodes"], w["pods"], scorer, seed, w["typical"], _settings(load))  # type: ignore[arg-type]
    return np.array(rows).reshape(-1, len(DELAY_INPUTS))


def play(job: tuple[DelayHead, float, int]) -> dict[str, float]:
    """One living-cluster run with ``head`` at ``load`` on workload ``seed``: its reward and measures."""
    head, load, seed = job
    w = _WORKER
    scorer = WithDelayHead(make_scorer(w["policy"], w["typical"]), head)
    result = run_dynamic(w["nodes"], w["pods"], scorer, seed, w["typical"], _settings(load))  # type: ignore[arg-type]
    summary = result.summary()
    objective = objective_of(summary, w["objective"])
    return {
        "reward": 100.0 * objective,
        "objective": objective,
        "holds": float(result.holds),
        "wait_mean_s": float(summary["wait_mean_s"]),
        "stranded_gpu_pct": float(summary["stranded_gpu_pct"]),
    }


def shaped_fitness(rewards: np.ndarray) -> np.ndarray:
    """float[candidates]: each candidate's centered rank (−0.5 … +0.5) within every (load, seed) column
    of ``rewards`` [candidate, column], averaged over the columns.

    Ranking per column is fitness shaping (Wierstra et al., JMLR 15, 2014; Salimans et al. 2017): at full load
    the candidates' rewards differ by points, below it by hundredths, and a plain mean would let the
    loud load decide alone. Per column, a consistent small loss where holds do not pay counts as much as
    a gain where they do. Ties share their rank."""
    n = rewards.shape[0]
    if n < 2:
        return np.zeros(n)
    order = rewards.argsort(axis=0, kind="stable").argsort(axis=0).astype(np.float64)
    for j in range(rewards.shape[1]):  # equal rewards get the mean of their ranks
        column = rewards[:, j]
        for value in np.unique(column):
            same = column == value
            order[same, j] = order[same, j].mean()
    return np.asarray((order / (n - 1) - 0.5).mean(axis=1))


def validation_gain(val: dict[float, float], never: dict[float, float], guard: bool = True) -> float | None:
    """Mean over loads of the reward gained over never holding; with ``guard``, None when some load is
    worse (a head must not cost anything where holds do not pay, however much it wins elsewhere)."""
    gains = [val[load] - never[load] for load in never]
    if guard and min(gains) < 0:
        return None
    return float(np.mean(gains))


def _fmt(by_load: dict[float, float]) -> str:
    return ", ".join(f"{load:g}: {v:.4f}" for load, v in by_load.items())


def _head(x: np.ndarray, center: np.ndarray, scale: np.ndarray, hold_s: float) -> DelayHead:
    return DelayHead(center, scale, x[:-1], float(x[-1]), hold_s)


def search(cfg: DelaySearchSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the search; write the model file (``cfg.out``), its manifest as JSON and a ``history`` next to
    it; return the head's manifest entry."""
    started = time.monotonic()
    rng = np.random.default_rng(cfg.seed)
    params, manifest, _ = read_model(cfg.start_model)
    nodes = priced_nodes(load_nodes(cfg.nodes))
    pods = load_pods(cfg.pods)
    typical = typical_pods(pods)
    spec = read_objective(cfg.objective_from) if cfg.objective_from else Objective()
    worker_cfg = {"policy": cfg.policy, "window_s": cfg.window_s, "sla": spec.sla, "objective": spec.weights}
    loads = tuple(float(x) for x in cfg.loads)
    history: list[dict[str, Any]] = []

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(cfg.workers, initializer=_init, initargs=(nodes, pods, typical, worker_cfg)) as pool:
        start = DelayHead.from_model(params, manifest)
        if start is not None:
            center, scale = start.center, start.scale
            log("starting from the start model's delay head (its input scales kept)")
        else:
            seen = np.concatenate(pool.map(probe, [(load, cfg.train_seed0 - 1) for load in loads], chunksize=1))
            if not len(seen):  # the mean of no rows is NaN, and a NaN center fails only later, deep in the head
                raise NoWaitError(
                    f"no pod waited at loads {', '.join(f'{x:g}' for x in loads)}: the probe runs made no "
                    "decision the head could hold in the measured window; raise --loads (or --window-s)"
                )
            center = seen.mean(axis=0)
            spread = seen.std(axis=0)
            scale = np.where(spread > 1e-6, spread, 1.0)
            log(
                f"inputs over {len(seen)} decisions: "
                f"center {np.round(center, 4).tolist()}, scale {np.round(scale, 4).tolist()}"
            )
        never = DelayHead.never(center, scale, cfg.hold_s)
        first = start if start is not None else never
        mean = np.concatenate([first.weights, [first.bias]])
        std = np.full(len(mean), cfg.init_std)

        def validate(head: DelayHead) -> dict[float, float]:
            """Mean reward per load over the validation seeds."""
            runs = pool.map(play, [(head, load, s) for load in loads for s in cfg.val_seeds], chunksize=1)
            k = len(cfg.val_seeds)
            return {
                load: float(np.mean([r["reward"] for r in runs[j * k : (j + 1) * k]])) for j, load in enumerate(loads)
            }

        never_val = validate(never)
        best_x, best_val, best_gain, best_gen = np.concatenate([never.weights, [never.bias]]), never_val, 0.0, 0
        log(f"never holding, on validation seeds {list(cfg.val_seeds)}: reward by load {_fmt(never_val)}")
        if start is not None:
            start_val = validate(start)
            start_gain = validation_gain(start_val, never_val, guard=cfg.fitness == "ranked")
            log(
                f"the start head: {_fmt(start_val)}, "
                + ("worse than never at some load" if start_gain is None else f"gain {start_gain:+.4f}")
            )
            if start_gain is not None and start_gain > best_gain:
                best_x, best_val, best_gain = mean.copy(), start_val, start_gain
        for g in range(1, cfg.generations + 1):
            seeds = [cfg.train_seed0 + (g - 1) * cfg.seeds_per_load + k for k in range(cfg.seeds_per_load)]
            xs = mean + std * rng.standard_normal((cfg.population, len(mean)))
            jobs = [(_head(x, center, scale, cfg.hold_s), load, s) for x in xs for load in loads for s in seeds]
            runs = pool.map(play, jobs, chunksize=1)
            rewards = np.array([r["reward"] for r in runs]).reshape(len(xs), -1)  # [candidate, (load, seed)]
            holds = np.array([r["holds"] for r in runs]).reshape(len(xs), -1).mean(axis=1)
            fitness = shaped_fitness(rewards) if cfg.fitness == "ranked" else rewards.mean(axis=1)
            elite = np.argsort(-fitness)[: cfg.elites]
            mean = cfg.smoothing * xs[elite].mean(axis=0) + (1 - cfg.smoothing) * mean
            std = np.maximum(cfg.smoothing * xs[elite].std(axis=0) + (1 - cfg.smoothing) * std, cfg.min_std)
            row: dict[str, Any] = {
                "generation": g,
                "seeds": seeds,
                "fitness_best": float(fitness.max()),
                "reward_of_best": float(rewards[elite[0]].mean()),
                "reward_median": float(np.median(rewards.mean(axis=1))),
                "holds_of_best": float(holds[elite[0]]),
                "mean": mean.tolist(),
                "std": std.tolist(),
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            over = cfg.max_minutes > 0 and time.monotonic() - started > 60 * cfg.max_minutes
            if g % max(cfg.eval_every, 1) == 0 or g == cfg.generations or over:
                val = validate(_head(mean, center, scale, cfg.hold_s))
                gain = validation_gain(val, never_val, guard=cfg.fitness == "ranked")
                row["val_reward"] = {str(k): v for k, v in val.items()}
                row["val_gain"] = gain
                if gain is not None and gain > best_gain:
                    best_x, best_val, best_gain, best_gen = mean.copy(), val, gain, g
            history.append(row)
            log(
                f"generation {g}: best fitness {row['fitness_best']:+.3f} (reward {row['reward_of_best']:.4f}, "
                f"{row['holds_of_best']:.0f} holds), median reward {row['reward_median']:.4f}"
                + (
                    f", validation {_fmt(val)} (never {_fmt(never_val)}): "
                    + ("worse at some load" if row["val_gain"] is None else f"gain {row['val_gain']:+.4f}")
                    if "val_reward" in row
                    else ""
                )
                + f", {row['elapsed_s']:.0f}s"
            )
            if over:
                log(f"stopping: {cfg.max_minutes} minutes")
                break

    head = _head(best_x, center, scale, cfg.hold_s)
    training = {
        "method": "cross-entropy search over whole living-cluster runs, common random numbers per generation, "
        "fitness ranked per (load, seed)",
        "settings": {
            k: (list(v) if isinstance(v, tuple) else Path(v).name if k in _FILES and v else v)
            for k, v in asdict(cfg).items()
        },
        "neverValidationReward": {str(k): v for k, v in never_val.items()},
        "validationReward": {str(k): v for k, v in best_val.items()},
        "validationGain": best_gain,
        "chosenAtGeneration": best_gen,
        "beatNever": best_gain > 0,
        "startHead": None if start is None else (manifest.get("delayHead") or {}).get("training"),
        "seconds": round(time.monotonic() - started, 1),
    }
    out = Path(cfg.out)
    entry = head.manifest(training)
    manifest = {**manifest, "delayHead": entry}
    version = str(manifest.get("version", "unversioned"))
    manifest["version"] = version if version.endswith("+delay") else f"{version}+delay"
    save_model(out, {**params, **head.arrays()}, manifest)
    out.with_suffix(".json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    out.with_name(out.stem + "-history.json").write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
    log(
        f"wrote {out}: {'a learned delay head' if best_gain > 0 else 'the never-holding head (nothing beat it)'}, "
        f"validation {_fmt(best_val)} vs never {_fmt(never_val)}"
    )
    return entry
