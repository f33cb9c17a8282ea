#!/usr/bin/env python3
"""Cross-check our PPO trainer against sb3-contrib's MaskablePPO on the same gymnasium environment.

If MaskablePPO learns where ours does not, the bug is ours; if neither learns, the learning signal is
the problem (docs/ppo.md, "What PPO did, and did not, achieve"). The full openb problem (1,213 nodes,
~10,000 decisions per episode) is far beyond what either trainer learns in minutes on two cores, so
the comparison runs on a SMALL cluster where learning is possible and measurable:

- the cluster: a seeded sample of ``--cluster-nodes`` openb GPU nodes (default 64, in their original
  order), written as a generic node file (``<out>/nodes.json``, usable as ``rlsched evaluate --nodes``
  and ``rlsched train --nodes``); the workload is the whole ``--pods`` list (default trace), which the
  FGD protocol inflates (here: thins) to 130 % of the sample's GPU capacity, so an episode to 100 %
  arrival is ~400 decisions (the full problem: 1,213 nodes, ~8,400 decisions);
- the environment: :class:`rlsched.policy.env.SchedulingEnv` with the trainer's settings (episodes end
  just after 100 % arrival, ``end_at = 1.005``; reward = −failed GPU % of capacity, ``--frag-weight``
  shaping, 0 by default as in ``rlsched train``); both trainers play the same training workload seeds
  (env ``e`` of 4: ``1000 + 10000·seed + e``, ``+4``, …) and are judged on held-out seeds 42–51;
- the PPO settings both use (``rlsched train``'s where the libraries share a knob): 4 envs × 512 steps
  per rollout, 4 minibatches, 4 epochs, γ 0.9995, λ 0.98, clip 0.2, entropy 0.01, value 0.5, gradient
  norm 0.5, target KL 0.02, one constant ``--lr`` (3e-4); the same wall-clock ``--budget-minutes``.

Runs (``--runs``):

- ``maskable``: MaskablePPO with ``MultiInputPolicy`` (the observation ``Dict`` flattened into a 64×64
  MLP; masks from the thin :class:`MaskedWorkloadEnv` wrapper's ``action_masks()``). No prior: it
  must find good placements from the 51 features of every node.
- ``ours``: ``rlsched.policy.ppo.trainer.train`` (GAE mode, every decision stored: ``--learn-from 0``)
  from a fresh network on top of the hand-set prior and tie-break rule (the project's from-scratch).
- ``ours-noprior``: the same with ``prior_scale = rank_scale = 0``: our per-node network with no hand
  rule, learning from nothing like MaskablePPO — the like-for-like cross-check.
- ``ours-init``: ours from the bundled model's weights (``--init-model``).

Each policy is evaluated greedily before and after training on the held-out seeds (headline metric:
unallocated GPU % at 100 % arrival; ours served by ``make_scorer("ppo:…")`` through the simulator, as
``rlsched evaluate`` does; MaskablePPO played in the env with ``deterministic=True``), with the
baselines (random, fgd, fgd-cpu, bestfit, the bundled model and its prior alone) on the same cluster.
"Learns" means the paired per-seed change from its own start is below −2 standard errors. Writes
``<out>/crosscheck.json`` and ``<out>/crosscheck.md``; prints the verdict.

    pip install -e '.[crosscheck]'
    nice -n 19 python benchmarks/maskable_ppo_crosscheck.py --nodes "$OPENB"/openb_node_list_gpu_node.csv \\
        --pods "$OPENB"/openb_pod_list_default.csv --budget-minutes 10 --out runs/crosscheck
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlsched.policy.cluster import NodeSpec, PodSpec
from rlsched.policy.env import EnvConfig, RewardConfig, SchedulingEnv
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.learned import DEFAULT_MODEL
from rlsched.policy.simulator import run_fgd_protocol
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, dump_generic, load_nodes, load_pods, openb_default
from rlsched.policy.typical import TypicalPods, typical_pods

if TYPE_CHECKING:
    from rlsched.policy.ppo.config import Args

RUNS = ("maskable", "ours", "ours-noprior", "ours-init")
BASELINES = ("random", "fgd", "fgd-cpu", "bestfit")
END_AT = 1.005  # rlsched train's default: episodes end just after the 100 % point
NUM_ENVS, NUM_STEPS, MINIBATCHES, EPOCHS = 4, 512, 4, 4
GAMMA, GAE_LAMBDA, CLIP, ENT, VF, GRAD_NORM, TARGET_KL = 0.9995, 0.98, 0.2, 0.01, 0.5, 0.5, 0.02


def small_cluster(nodes: Sequence[NodeSpec], count: int, seed: int) -> list[NodeSpec]:
    """A seeded sample of ``count`` nodes, in their original order."""
    if not 0 < count <= len(nodes):
        raise SystemExit(f"--cluster-nodes must be in 1..{len(nodes)}")
    keep = np.sort(np.random.default_rng(seed).choice(len(nodes), count, replace=False))
    return [nodes[i] for i in keep]


def env_config(frag_weight: float) -> EnvConfig:
    return EnvConfig(end_at=END_AT, reward=RewardConfig(fail_weight=1.0, frag_weight=frag_weight))


def paired(new: Sequence[float], old: Sequence[float]) -> dict[str, Any]:
    """Paired per-seed comparison: mean of new − old, its standard error, and seeds where new < old."""
    d = np.asarray(new, float) - np.asarray(old, float)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return {
        "mean_diff": float(d.mean()),
        "se": se,
        "t": float(d.mean() / se) if se and se > 0 else float("nan"),
        "wins": int((d < 0).sum()),
        "ties": int((d == 0).sum()),
        "n": len(d),
        "significant_better": bool(se > 0 and d.mean() < -2 * se) if se == se else False,
    }


def stats(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, float)
    return {"median": float(np.median(a)), "mean": float(a.mean()), "sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0}


# -- the environment for MaskablePPO ----------------------------------------------------------------


def masked_env_class() -> type:
    import gymnasium as gym

    class MaskedWorkloadEnv(gym.Wrapper):
        """SchedulingEnv plus ``action_masks()`` (what MaskablePPO asks for) and a fixed sequence of
        workload seeds (``seed0``, ``seed0 + stride``, …, as the trainer's VectorCore plays them);
        records each finished episode's headline figure."""

        def __init__(self, env: SchedulingEnv, seed0: int, stride: int):
            super().__init__(env)
            self.next_seed, self.stride = seed0, stride
            self.finished: list[dict[str, Any]] = []
            self._mask = np.zeros(env.action_space.n, dtype=bool)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
            options = dict(options or {})
            if "workload_seed" not in options:
                options["workload_seed"] = self.next_seed
                self.next_seed += self.stride
            obs, info = self.env.reset(seed=seed, options=options)
            self._mask = obs["action_mask"].astype(bool)
            return obs, info

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            obs, reward, done, truncated, info = self.env.step(action)
            self._mask = obs["action_mask"].astype(bool)
            if done:
                core = self.env.unwrapped.core
                self.finished.append(
                    {"seed": core.seed, "return": core.episode_return, "unallocated_100": core.unallocated_at_100()}
                )
            return obs, reward, done, truncated, info

        def action_masks(self) -> np.ndarray:
            return self._mask

    return MaskedWorkloadEnv


def play_env(env: SchedulingEnv, seeds: Sequence[int], choose: Any) -> tuple[list[float], list[int]]:
    """Unallocated % at 100 % and decisions per episode of ``choose(obs) -> action`` on each seed."""
    out, decisions = [], []
    for s in seeds:
        obs, _ = env.reset(options={"workload_seed": s})
        done = False
        while not done:
            obs, _, done, _, info = env.step(choose(obs))
        assert not info["invalid_action"]
        out.append(float(info["unallocated_at_100"]))
        decisions.append(env.core.decisions)
    return out, decisions


def run_maskable(
    nodes: list[NodeSpec], pods: list[PodSpec], typical: TypicalPods, a: argparse.Namespace, seed: int, out: Path
) -> dict[str, Any]:
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    wrapper = masked_env_class()
    cfg = env_config(a.frag_weight)
    seed0 = 1000 + 10_000 * seed  # the trainer's train_seed0 + 10000 · seed
    vec = DummyVecEnv(
        [(lambda e=e: wrapper(SchedulingEnv(nodes, pods, typical, cfg), seed0 + e, NUM_ENVS)) for e in range(NUM_ENVS)]
    )
    model = MaskablePPO(
        "MultiInputPolicy",
        vec,
        learning_rate=a.lr,
        n_steps=NUM_STEPS,
        batch_size=NUM_ENVS * NUM_STEPS // MINIBATCHES,
        n_epochs=EPOCHS,
        gamma=GAMMA,
        gae_lambda=GAE_LAMBDA,
        clip_range=CLIP,
        ent_coef=ENT,
        vf_coef=VF,
        max_grad_norm=GRAD_NORM,
        target_kl=TARGET_KL,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    eval_env = SchedulingEnv(nodes, pods, typical, cfg)

    def evaluate(deterministic: bool) -> list[float]:
        def choose(obs: dict[str, np.ndarray]) -> int:
            action, _ = model.predict(obs, action_masks=obs["action_mask"].astype(bool), deterministic=deterministic)
            return int(action)

        return play_env(eval_env, a.eval_seeds, choose)[0]

    start, start_sample = evaluate(True), evaluate(False)
    curve: list[dict[str, Any]] = []

    class Budget(BaseCallback):
        """Stops at the wall-clock budget; keeps the train/* figures of every update."""

        def __init__(self, seconds: float):
            super().__init__()
            self.deadline = time.time() + seconds

        def _on_rollout_start(self) -> None:
            self._keep()

        def _keep(self) -> None:
            v = self.model.logger.name_to_value
            if "train/approx_kl" in v and (not curve or curve[-1]["global_step"] != self.num_timesteps):
                eps = [e["unallocated_100"] for env in vec.envs for e in env.finished[-2:]]
                curve.append(
                    {
                        "global_step": self.num_timesteps,
                        "approx_kl": float(v["train/approx_kl"]),
                        "entropy": -float(v["train/entropy_loss"]),
                        "explained_variance": float(v["train/explained_variance"]),
                        "clipfrac": float(v["train/clip_fraction"]),
                        "episode_unallocated": float(np.mean(eps)) if eps else None,
                        "elapsed_s": time.time() - t0,
                    }
                )

        def _on_step(self) -> bool:
            return time.time() < self.deadline

    t0, c0 = time.time(), time.process_time()
    callback = Budget(a.budget_minutes * 60)
    model.learn(total_timesteps=10**12, callback=callback)
    callback._keep()
    wall, cpu = time.time() - t0, time.process_time() - c0
    model.save(out / f"maskable-s{seed}.zip")
    final, final_sample = evaluate(True), evaluate(False)
    episodes = [e for env in vec.envs for e in env.finished]
    return {
        "run": "maskable",
        "seed": seed,
        "start": start,
        "final": final,
        "start_sample": start_sample,
        "final_sample": final_sample,
        "decisions": int(model.num_timesteps),
        "episodes": len(episodes),
        "wall_s": wall,
        "cpu_s": cpu,
        "curve": curve,
        "model": str(out / f"maskable-s{seed}.zip"),
        "library": f"sb3-contrib {__import__('sb3_contrib').__version__}, torch {torch.__version__}",
        "harness": "SchedulingEnv, deterministic=True",
    }


# -- our trainer ----------------------------------------------------------------------------------


def ours_args(variant: str, cluster_file: Path, a: argparse.Namespace, seed: int) -> Args:
    """The settings of our trainer's run, as ``train`` will use them: prepared as it prepares them
    (``prepare_args``: a run from ``--init-model`` takes that model's rank and prior scales, widths and
    CPU weight), so the start model exported from them is the policy the run starts from."""
    from rlsched.policy.ppo.config import Args
    from rlsched.policy.ppo.trainer import prepare_args

    args = Args(
        exp_name=variant,
        seed=seed,
        nodes=str(cluster_file),
        traces=(str(a.pods),),
        total_timesteps=10**12,
        max_minutes=a.budget_minutes,
        num_envs=NUM_ENVS,
        num_steps=NUM_STEPS,
        learning_rate=a.lr,
        anneal_lr=False,
        gamma=GAMMA,
        gae_lambda=GAE_LAMBDA,
        num_minibatches=MINIBATCHES,
        update_epochs=EPOCHS,
        clip_coef=CLIP,
        ent_coef=ENT,
        vf_coef=VF,
        max_grad_norm=GRAD_NORM,
        target_kl=TARGET_KL,
        learn_from=0.0,
        end_at=END_AT,
        frag_weight=a.frag_weight,
        eval_every=0,
        out_dir=str(Path(a.out) / "ours"),
        progress=False,
    )
    if variant == "ours-noprior":
        args.prior_scale = args.rank_scale = 0.0
    if variant == "ours-init":
        args.init_model = str(a.init_model)
    prepared, _ = prepare_args(args)
    return prepared


def export_start(variant: str, args: Args, typical: TypicalPods, seed: int) -> Path:
    """The starting policy, exported: the same initial weights as the run (seed_everything, then
    new_agent, as train does, from the same prepared ``args``)."""
    from rlsched.policy.ppo.trainer import export, new_agent, seed_everything

    seed_everything(args)
    out = Path(args.out_dir)
    start_path = out / f"{variant}-s{seed}-start.npz"
    start_path.parent.mkdir(parents=True, exist_ok=True)
    export(new_agent(args), args, start_path, {"start": True}, typical.to_json(), f"{variant}-s{seed}-start")
    return start_path


def run_ours(
    variant: str, cluster_file: Path, typical: TypicalPods, a: argparse.Namespace, seed: int
) -> dict[str, Any]:
    from rlsched.policy.ppo.trainer import train

    args = ours_args(variant, cluster_file, a, seed)
    start = eval_policy(f"ppo:{export_start(variant, args, typical, seed)}", a)
    t0, c0 = time.time(), time.process_time()
    result = train(args)
    wall, cpu = time.time() - t0, time.process_time() - c0
    final_path = Path(result.run_dir) / "final.npz"
    final = eval_policy(f"ppo:{final_path}", a)
    rows = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    keys = ("global_step", "approx_kl", "entropy", "explained_variance", "clipfrac", "episode_unallocated", "elapsed_s")
    episodes = json.loads((Path(result.run_dir) / "episodes.json").read_text())
    return {
        "run": variant,
        "seed": seed,
        "start": start,
        "final": final,
        "decisions": int(result.steps),
        "episodes": len(episodes),
        "wall_s": wall,
        "cpu_s": cpu,
        "curve": [{k: r.get(k) for k in keys} for r in rows],
        "model": str(final_path),
        "args": {
            k: v for k, v in asdict(args).items() if k in ("prior_scale", "rank_scale", "init_model", "learning_rate")
        },
        "harness": "make_scorer('ppo:…') + run_fgd_protocol (greedy)",
    }


_EVAL: dict[str, Any] = {}


def eval_policy(policy: str, a: argparse.Namespace) -> list[float]:
    """Unallocated % at 100 % of a scorer name on every evaluation seed (the simulator, FGD protocol)."""
    nodes, pods, typical = _EVAL["nodes"], _EVAL["pods"], _EVAL["typical"]
    return [run_fgd_protocol(nodes, pods, policy, s, typical=typical).unallocated_at(100) for s in a.eval_seeds]


# -- report ---------------------------------------------------------------------------------------


def summarize(run: dict[str, Any], random: list[float]) -> dict[str, Any]:
    curve = [c for c in run["curve"] if c.get("approx_kl") is not None]
    tail = curve[-max(1, len(curve) // 4) :]  # the last quarter of the updates

    def mean_of(key: str, rows: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None and r[key] == r[key]]
        return float(np.mean(vals)) if vals else None

    return {
        "start": stats(run["start"]),
        "final": stats(run["final"]),
        "final_vs_start": paired(run["final"], run["start"]),
        "final_vs_random": paired(run["final"], random),
        "learns": paired(run["final"], run["start"])["significant_better"],
        "updates": len(curve),
        "approx_kl_max": max((c["approx_kl"] for c in curve), default=None),
        "approx_kl_last_quarter": mean_of("approx_kl", tail),
        "entropy_first": curve[0]["entropy"] if curve else None,
        "entropy_last": curve[-1]["entropy"] if curve else None,
        "explained_variance_last_quarter": mean_of("explained_variance", tail),
    }


def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    c = report["cluster"]
    lines = [
        f"# MaskablePPO cross-check ({c['nodes']} openb nodes, {c['gpus']} GPUs, "
        f"~{c['decisions_per_episode']:.0f} decisions per episode)",
        "",
        f"Command: `{report['command']}`. Budget {report['budget_minutes']} min wall per run, lr "
        f"{report['lr']}, frag weight {report['frag_weight']}; evaluation seeds {report['eval_seeds_text']} "
        f"(unallocated GPU % at 100 % arrival, greedy; lower is better). Machine: {report['machine']}.",
        "",
        "| baseline | median | mean | sd |",
        "|---|---:|---:|---:|",
    ]
    for name, v in report["baselines"].items():
        s = stats(v)
        lines.append(f"| {name} | {fmt(s['median'])} | {fmt(s['mean'])} | {fmt(s['sd'])} |")
    lines += [
        "",
        "| run (train seed) | start median | final median | final − start (mean ± SE) | seeds better | "
        "final − random | decisions | wall / CPU s | approx_kl max / last ¼ | entropy first → last | EV last ¼ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["runs"]:
        s = r["summary"]
        fs, fr = s["final_vs_start"], s["final_vs_random"]
        lines.append(
            f"| {r['run']} (s{r['seed']}) | {fmt(s['start']['median'])} | {fmt(s['final']['median'])} | "
            f"{fs['mean_diff']:+.2f} ± {fs['se']:.2f}{' **learns**' if s['learns'] else ''} | "
            f"{fs['wins']}/{fs['n']} | {fr['mean_diff']:+.2f} | {r['decisions']:,} | "
            f"{r['wall_s']:.0f} / {r['cpu_s']:.0f} | {fmt(s['approx_kl_max'], 4)} / "
            f"{fmt(s['approx_kl_last_quarter'], 4)} | {fmt(s['entropy_first'])} → {fmt(s['entropy_last'])} | "
            f"{fmt(s['explained_variance_last_quarter'])} |"
        )
    if report["head_to_head"]:
        lines += [
            "",
            "| MaskablePPO vs | seeds where MaskablePPO is better | mean (MaskablePPO − it) |",
            "|---|---:|---:|",
        ]
        for h in report["head_to_head"]:
            lines.append(f"| {h['other']} (s{h['seed']}) | {h['wins']}/{h['n']} | {h['mean_diff']:+.2f} |")
    lines += ["", "Per evaluation seed (final policies and baselines):", ""]
    seeds = report["eval_seeds"]
    lines.append("| policy | " + " | ".join(str(s) for s in seeds) + " |")
    lines.append("|---|" + "---:|" * len(seeds))
    for name, v in report["baselines"].items():
        lines.append(f"| {name} | " + " | ".join(fmt(x) for x in v) + " |")
    for r in report["runs"]:
        lines.append(f"| {r['run']} s{r['seed']} final | " + " | ".join(fmt(x) for x in r["final"]) + " |")
    lines += ["", "Verdict:", "", *[f"- {v}" for v in report["verdict"]], ""]
    return "\n".join(lines)


def verdict(report: dict[str, Any]) -> list[str]:
    out = []
    noise = stats(report["baselines"]["fgd-cpu"])["sd"]
    for r in report["runs"]:
        s = r["summary"]
        fs, fr = s["final_vs_start"], s["final_vs_random"]
        learned = "LEARNS" if s["learns"] else "does not learn measurably"
        out.append(
            f"{r['run']} (seed {r['seed']}): {learned} — {s['start']['median']:.2f} → {s['final']['median']:.2f} % "
            f"(paired {fs['mean_diff']:+.2f} ± {fs['se']:.2f} pp, better on {fs['wins']}/{fs['n']} seeds); "
            f"vs random {fr['mean_diff']:+.2f} pp ({fr['wins']}/{fr['n']})"
        )
    for h in report["head_to_head"]:
        out.append(
            f"MaskablePPO vs {h['other']} (seed {h['seed']}): MaskablePPO better on {h['wins']}/{h['n']} seeds, "
            f"mean {h['mean_diff']:+.2f} pp"
        )
    out.append(f"(seed-to-seed sd of fgd-cpu on this cluster: {noise:.2f} pp)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", help="node list (default: the openb node list in $RLSCHED_OPENB_DIR)")
    p.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    p.add_argument("--cluster-nodes", type=int, default=64, help="nodes in the small cluster (default: %(default)s)")
    p.add_argument("--cluster-seed", type=int, default=0, help="seed of the node sample (default: %(default)s)")
    p.add_argument("--budget-minutes", type=float, default=10.0, help="wall-clock per run (default: %(default)s)")
    p.add_argument("--seeds", default="1", help="training seeds, each runs every trainer (default: %(default)s)")
    p.add_argument("--eval-seeds", default="42-51", help="held-out workload seeds (default: %(default)s)")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of: " + ", ".join(RUNS))
    p.add_argument("--lr", type=float, default=3e-4, help="constant Adam step size of both (default: %(default)s)")
    p.add_argument("--frag-weight", type=float, default=0.0, help="fragmentation shaping (default: %(default)s)")
    p.add_argument("--init-model", default=str(DEFAULT_MODEL), help="model for ours-init (default: the bundled)")
    p.add_argument("--out", default="runs/crosscheck", help="output folder (default: %(default)s)")
    a = p.parse_args(argv)
    try:
        a.nodes = openb_default(a.nodes, "--nodes", OPENB_NODES)
        a.pods = openb_default(a.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        p.error(str(exc))
    runs = [r for r in a.runs.split(",") if r]
    unknown = set(runs) - set(RUNS)
    if unknown:
        p.error(f"unknown runs {sorted(unknown)}; choose from {', '.join(RUNS)}")
    if "maskable" in runs:
        try:
            import sb3_contrib  # noqa: F401
        except ImportError:
            print("sb3-contrib is missing: pip install -e '.[crosscheck]'", file=sys.stderr)
            return 2
    if any(r.startswith("ours") for r in runs):
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is missing: pip install -e '.[train]'", file=sys.stderr)
            return 2
    a.eval_seeds = parse_seeds(a.eval_seeds)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    full = load_nodes(a.nodes)
    nodes = small_cluster(full, a.cluster_nodes, a.cluster_seed)
    cluster_file = out / "nodes.json"
    cluster_file.write_text(dump_generic(nodes, []))
    nodes, pods = load_nodes(cluster_file), load_pods(a.pods)  # exactly what the trainer reads
    typical = typical_pods(pods)
    _EVAL.update(nodes=nodes, pods=pods, typical=typical)

    # baselines (the simulator) and the episode length (the env, a uniformly random valid action)
    baselines = {b: eval_policy(b, a) for b in BASELINES}
    baselines["bundled prior (ppo-prior:)"] = eval_policy(f"ppo-prior:{a.init_model}", a)
    baselines["bundled model (ppo:)"] = eval_policy(f"ppo:{a.init_model}", a)
    rng = np.random.default_rng(0)
    env = SchedulingEnv(nodes, pods, typical, env_config(a.frag_weight))
    env_random, decisions = play_env(env, a.eval_seeds, lambda o: int(rng.choice(np.flatnonzero(o["action_mask"]))))
    baselines["random valid action (env)"] = env_random
    models: dict[str, int] = {}
    for n in nodes:
        models[n.gpu_model or "cpu"] = models.get(n.gpu_model or "cpu", 0) + 1
    cluster = {
        "nodes": len(nodes),
        "gpus": sum(n.gpu_count for n in nodes),
        "models": models,
        "sample_seed": a.cluster_seed,
        "file": str(cluster_file),
        "decisions_per_episode": float(np.mean(decisions)),
        "full_cluster": {"nodes": len(full), "gpus": sum(n.gpu_count for n in full)},
        "relation_to_full": "the full openb default problem: ~8,400 decisions per episode to 100 % arrival "
        "(docs/ppo.md, seed 42), the same pod list and protocol, 1/19 of the nodes",
    }
    print(
        f"cluster: {cluster['nodes']} nodes, {cluster['gpus']} GPUs, {cluster['decisions_per_episode']:.0f} "
        f"decisions/episode; baselines: " + ", ".join(f"{k} {np.median(v):.2f}" for k, v in baselines.items()),
        flush=True,
    )

    results = []
    for seed in parse_seeds(a.seeds):
        for run in runs:
            t0 = time.time()
            if run == "maskable":
                r = run_maskable(nodes, pods, typical, a, seed, out)
            else:
                r = run_ours(run, cluster_file, typical, a, seed)
            r["summary"] = summarize(r, baselines["random"])
            results.append(r)
            s = r["summary"]
            print(
                f"{run} seed {seed}: {s['start']['median']:.2f} → {s['final']['median']:.2f} % "
                f"({r['decisions']:,} decisions, {r['episodes']} episodes, {time.time() - t0:.0f} s)",
                flush=True,
            )
            (out / "crosscheck.partial.json").write_text(json.dumps(results, indent=1))

    head = []
    for m in (r for r in results if r["run"] == "maskable"):
        for o in (r for r in results if r["run"] != "maskable" and r["seed"] == m["seed"]):
            head.append({"other": o["run"], "seed": m["seed"], **paired(m["final"], o["final"])})
    report: dict[str, Any] = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "budget_minutes": a.budget_minutes,
        "lr": a.lr,
        "frag_weight": a.frag_weight,
        "eval_seeds": a.eval_seeds,
        "eval_seeds_text": f"{a.eval_seeds[0]}–{a.eval_seeds[-1]}" if len(a.eval_seeds) > 1 else str(a.eval_seeds[0]),
        "machine": f"{platform.machine()}, {platform.node()}",
        "ppo_settings": {
            "num_envs": NUM_ENVS,
            "num_steps": NUM_STEPS,
            "minibatches": MINIBATCHES,
            "epochs": EPOCHS,
            "gamma": GAMMA,
            "gae_lambda": GAE_LAMBDA,
            "clip": CLIP,
            "ent_coef": ENT,
            "vf_coef": VF,
            "max_grad_norm": GRAD_NORM,
            "target_kl": TARGET_KL,
            "end_at": END_AT,
        },
        "cluster": cluster,
        "baselines": baselines,
        "runs": results,
        "head_to_head": head,
        "seconds": time.time() - t_start,
    }
    report["verdict"] = verdict(report)
    (out / "crosscheck.json").write_text(json.dumps(report, indent=1))
    (out / "crosscheck.md").write_text(markdown(report))
    (out / "crosscheck.partial.json").unlink(missing_ok=True)
    print(
        "\n".join(["", "VERDICT", *report["verdict"], f"written: {out / 'crosscheck.json'}, {out / 'crosscheck.md'}"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
