"""PPO for pod placement, in the style of CleanRL's ppo.py: one ``Args``, one visible loop.

``train(args)`` collects ``num_steps`` decisions from each of ``num_envs`` FGD-protocol simulations
(:class:`~rlsched.policy.env.VectorCore`) with the numpy policy — the same code that serves — then
runs ``update_epochs`` of clipped-PPO minibatch updates in torch (GAE, entropy bonus, advantage
normalization, value clipping, gradient clipping, target-KL early stop). Every iteration logs return,
approx_kl, clipfrac, explained variance and steps/s; checkpoints make runs resumable bit for bit;
validation episodes on held-out seeds pick the model that is exported.

:func:`fit_from_records` is the offline seam: it fits the same agent to logged (features, action,
reward) decisions (behaviour cloning, optionally advantage-weighted), for retraining from the
operator's decision log.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn, optim

from ..env import EnvConfig, RewardConfig, SchedulingCore, VectorCore
from ..export import ModelFileError, build_manifest, save_model
from ..features import CLUSTER_FEATURES, CLUSTER_SLICE, FEATURES, FeatureEncoder
from ..network import PolicyNetwork, choose_node, group_offsets, log_softmax, sample_index
from ..published import trace_name
from ..trace import load_nodes, load_pods
from ..typical import typical_pods
from .agent import Agent
from .buffer import RolloutBuffer
from .config import Args, TrainResult, model_version, parse_tuple_fields, resumed_args, settings_of_init_model

# -- pieces the loop calls ------------------------------------------------------------------------


def make_cores(args: Args, end_at: float) -> list[Any]:
    """The simulations to train in: FGD-protocol cores, or living-cluster cores with ``mode=dynamic``."""
    if args.mode == "dynamic":
        return make_living_cores(args)
    nodes = load_nodes(args.nodes)
    config = EnvConfig(
        target=args.target,
        end_at=end_at,
        allow_delay=args.allow_delay,
        allow_reject=args.allow_reject,
        reward=RewardConfig(args.fail_weight, args.frag_weight, args.cost_weight, args.load_weight),
    )
    workloads = []
    for path in args.traces:
        pods = load_pods(path)
        typical = typical_pods(pods)
        workloads.append((pods, typical, trace_name(path) or Path(path).stem))
    cores = []
    for e in range(args.num_envs):
        pods, typical, name = workloads[e % len(workloads)]
        encoder = FeatureEncoder(typical, args.fgd_cpu_weight, use_qos=args.qos_features)
        cores.append(SchedulingCore(nodes, pods, typical, config, encoder, name))
    return cores


def make_living_cores(args: Args) -> list[Any]:
    from ..dynamic.arrivals import ArrivalSettings
    from ..dynamic.env import LivingConfig, LivingCore, LivingReward
    from ..dynamic.evaluation import priced_nodes
    from ..dynamic.objective import SlaSettings
    from ..dynamic.objective_spec import Objective, read_objective
    from ..dynamic.simulator import DynamicSettings

    nodes = priced_nodes(load_nodes(args.nodes))
    if args.objective_from:
        objective = read_objective(args.objective_from)
    else:
        objective = Objective(sla=SlaSettings(cpu_threshold=args.sla_threshold, gpu_threshold=args.sla_threshold))
    config = LivingConfig(
        settings=DynamicSettings(
            arrivals=ArrivalSettings(load=args.dynamic_load, window_s=args.dynamic_window_s),
            sla=objective.sla,
        ),
        reward=LivingReward(
            sla=args.sla_weight, frag=args.dynamic_frag_weight, cost=args.dynamic_cost_weight, ls=args.dynamic_ls_weight
        ),
        weights=objective.weights,
        allow_delay=args.allow_delay,
        hold_s=args.hold_s,
    )
    workloads = []
    for path in args.traces:
        pods = load_pods(path)
        workloads.append((pods, typical_pods(pods), trace_name(path) or Path(path).stem))
    cores: list[Any] = []
    for e in range(args.num_envs):
        pods, typical, name = workloads[e % len(workloads)]
        encoder = FeatureEncoder(typical, args.fgd_cpu_weight, use_qos=args.qos_features)
        cores.append(LivingCore(nodes, pods, typical, config, encoder, name))
    return cores


def act(net: PolicyNetwork, core: SchedulingCore, rank_scale: float) -> dict[str, Any]:
    """Sample one decision of ``core`` with the numpy policy (exactly as the learned scorer serves
    in ``sample`` mode) and return what the buffer stores."""
    cand = core.candidates
    smask = core.special_mask()
    if cand is not None:
        h2 = net.hidden(cand.features)
        s = net.scores(cand.features, cand.prior, h2)
        cluster = cand.features[0, CLUSTER_SLICE]
        r = core.rank_frac[cand.nodes]
        offsets = group_offsets(cand.group, r, rank_scale, cand.num_groups)
        x, prior, count = cand.features, cand.prior, cand.count
    else:
        h2 = np.zeros((0, net.hidden_size), dtype=np.float32)
        s = offsets = np.zeros(0)
        cluster = core.encoder.cluster_context(core.state, 0, 0)
        x, prior, count = np.zeros((0, len(FEATURES)), np.float32), np.zeros(0), np.zeros(0)
    pooled = net.pooled(h2, count, cluster)
    value = net.value(pooled)
    special = net.special_logits(pooled)
    if smask.any():
        logits = np.concatenate([s[cand.group] - rank_scale * r if cand is not None else np.zeros(0), special[smask]])
        k = len(cand.nodes) if cand is not None else 0
        j = sample_index(logits, core.tiebreak.rng) if len(logits) > 1 else 0
        if j < k:
            node, action = int(cand.nodes[j]), int(cand.group[j])
        else:
            node, action = -1, -1 - int(np.flatnonzero(smask)[j - k])
    else:
        pos = choose_node(s[cand.group] - rank_scale * r, cand.nodes, core.tiebreak, "sample")
        node, action = int(cand.nodes[pos]), int(cand.group[pos])
    z = np.concatenate([s + offsets, np.where(smask, special, -np.inf)])
    lp = log_softmax(z)
    logprob = float(lp[action] if action >= 0 else lp[len(s) + (-action - 1)])
    return dict(
        node=node,
        action=action,
        logprob=logprob,
        value=value,
        x=x,
        prior=prior,
        offset=offsets,
        count=count,
        cluster=cluster,
        special_mask=smask,
    )


def step_core(core: SchedulingCore, node: int, action: int) -> tuple[float, bool]:
    if action >= 0:
        return core.step_node(node)
    return core.step_delay() if action == -1 else core.step_reject()


def validate(net: PolicyNetwork, args: Args, seeds: Sequence[int], core: SchedulingCore) -> list[float]:
    """The episode metric of the sampled policy on held-out seeds (first trace): unallocated GPU % at
    100 % arrival (FGD protocol) or −100 × the objective (living cluster); lower is better."""
    out = []
    for seed in seeds:
        core.reset(seed)
        while not core.done:
            d = act(net, core, args.rank_scale)
            step_core(core, d["node"], d["action"])
        out.append(core.episode_metric())
    return out


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    var = np.var(y_true)
    return float("nan") if var == 0 else float(1 - np.var(y_true - y_pred) / var)


def metric_label(args: Args) -> str:
    """What the episode metric is in this run's mode (lower is better in both)."""
    return "−100 × objective" if args.mode == "dynamic" else "unallocated GPU % at 100 %"


def plot_curves(
    history: list[dict], episodes: list[dict], path: Path, metric: str = "unallocated GPU % at 100 %"
) -> None:
    """PNG learning curves: episode metric, validation, losses, KL, clip fraction, explained variance, steps/s.
    ``metric`` names the episode metric (the living cluster's is −100 × its objective)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history:
        return
    steps = [h["global_step"] for h in history]
    panels = [
        (f"{metric} (train episodes)", None),
        (f"validation: {metric}", "val_unallocated"),
        ("policy loss", "pg_loss"),
        ("value loss", "v_loss"),
        ("entropy", "entropy"),
        ("approx_kl", "approx_kl"),
        ("clipfrac", "clipfrac"),
        ("explained variance", "explained_variance"),
        ("steps/s", "sps"),
    ]
    fig, axes = plt.subplots(3, 3, figsize=(13, 9), dpi=100)
    for ax, (title, key) in zip(axes.flat, panels, strict=True):
        if key is None:
            xs = [e["global_step"] for e in episodes if e.get("unallocated_100") is not None]
            ys = [e["unallocated_100"] for e in episodes if e.get("unallocated_100") is not None]
            ax.plot(xs, ys, ".", alpha=0.5)
            if len(ys) >= 5:
                k = 5
                ax.plot(xs[k - 1 :], np.convolve(ys, np.ones(k) / k, mode="valid"), "-")
        else:
            pts = [(s, h[key]) for s, h in zip(steps, history, strict=True) if h.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), "-o" if key == "val_unallocated" else "-", markersize=3)
            elif key == "val_unallocated":
                ax.text(0.5, 0.5, "not validated in this run (--eval-every 0)", ha="center", transform=ax.transAxes)
        if key == "explained_variance":
            ax.set_ylim(-1.05, 1.05)  # the first iterations' values (before the critic fits) would hide the rest
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("decisions", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def export(
    agent: Agent,
    args: Args,
    path: Path,
    training: dict[str, Any],
    typical_json: list[dict],
    version: str,
    carried: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None,
) -> str:
    """Write ``agent`` as a model file (and its manifest beside it); ``carried``: arrays and manifest
    entries of the start model that PPO does not train and the export keeps (:func:`carried_from_init`)."""
    arrays, entries = carried or ({}, {})
    manifest = build_manifest(
        version=version,
        hidden=args.hidden,
        value_hidden=args.value_hidden,
        prior_scale=args.prior_scale,
        rank_scale=args.rank_scale,
        mode=args.serve_mode,
        fgd_cpu_weight=args.fgd_cpu_weight,
        typical_json=typical_json,
        training=training,
        allow_delay=args.allow_delay,
        load_live=args.mode == "dynamic",
        qos_live=args.qos_features,
        allow_reject=args.allow_reject,
    )
    manifest.update(entries)
    digest = save_model(path, {**agent.to_arrays(), **arrays}, manifest)
    path.with_suffix(".json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return digest


def carried_from_init(args: Args) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """What of ``init_model`` PPO keeps as it is: its learned delay head (the ``delay_*`` arrays and the
    ``delayHead`` entry), which PPO does not train but the served model answers the delay question with."""
    if not args.init_model:
        return {}, {}
    from ..delay_head import ARRAYS as DELAY_ARRAYS
    from ..export import read_model

    params, manifest, _ = read_model(args.init_model)
    if "delayHead" not in manifest:
        return {}, {}
    return {k: params[k] for k in DELAY_ARRAYS}, {"delayHead": manifest["delayHead"]}


def numpy_net(agent: Agent, args: Args) -> PolicyNetwork:
    return PolicyNetwork(agent.to_arrays(), prior_scale=args.prior_scale)


def seed_everything(args: Args) -> None:
    """Every source of randomness of a run, in one block."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.torch_threads)


def new_agent(args: Args) -> Agent:
    """A fresh agent of the configured widths, or the ``init_model`` it starts from."""
    agent = Agent(len(FEATURES), len(CLUSTER_FEATURES), args.hidden, args.value_hidden, args.prior_scale)
    if args.init_model:
        from ..export import read_model

        params, _, _ = read_model(args.init_model)
        agent.load_arrays(params)
    return agent


def out_of_budget(args: Args, iteration: int, first_iteration: int, elapsed_s: float, reserve_s: float = 0.0) -> bool:
    """Whether the run stops before ``iteration``: ``max_minutes`` of wall time (over all invocations) —
    the next iteration and what follows the loop (``reserve_s``: the last iteration's time and one
    validation) must fit — or ``max_iterations`` in this invocation."""
    if args.max_minutes and elapsed_s + reserve_s > args.max_minutes * 60:
        return True
    return bool(args.max_iterations and iteration >= first_iteration + args.max_iterations)


class RunOutput:
    """A run's folder (``<out_dir>/<exp_name>-s<seed>``): its arguments, metrics, and the exported
    models — ``best.npz`` (the best validated policy, the starting one included) and ``final.npz``."""

    def __init__(self, args: Args, typical_json: list[dict], train_seeds: str, best_val: float | None = None):
        self.args, self.typical_json, self.train_seeds = args, typical_json, train_seeds
        self.dir = Path(args.out_dir) / f"{args.exp_name}-s{args.seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "args.json").write_text(json.dumps(asdict(args), indent=1))
        self.best_path, self.final_path = self.dir / "best.npz", self.dir / "final.npz"
        self.best_val = best_val
        self.carried = carried_from_init(args)

    def provenance(self, extra: dict[str, Any]) -> dict[str, Any]:
        a = self.args
        return {
            "command": " ".join(shlex.quote(x) for x in sys.argv),
            "args": asdict(a),
            "gitCommit": git_commit(),
            "torch": torch.__version__,
            "traces": [trace_name(t) or t for t in a.traces],
            "trainSeeds": self.train_seeds,
            "valSeeds": list(a.val_seeds),
            **extra,
        }

    def offer(self, agent: Agent, val: float, steps: int, extra: dict[str, Any]) -> bool:
        """Export ``agent``, trained on ``steps`` decisions, as the best model if its validation figure
        ``val`` beats every earlier one."""
        if self.best_val is not None and val >= self.best_val:
            return False
        self.best_val = val
        export(
            agent,
            self.args,
            self.best_path,
            self.provenance({**extra, "valUnallocated": val}),
            self.typical_json,
            model_version(self.args, steps),
            self.carried,
        )
        return True

    def finish(self, agent: Agent, final_val: float, steps: int, extra: dict[str, Any]) -> None:
        """Export the final policy, and as the best one too when it validates at least as well."""
        prov = self.provenance({**extra, "valUnallocated": final_val})
        version = model_version(self.args, steps)
        export(agent, self.args, self.final_path, prov, self.typical_json, version, self.carried)
        if self.best_val is None or final_val <= self.best_val:
            self.best_val = final_val
            export(agent, self.args, self.best_path, prov, self.typical_json, version, self.carried)

    def log(self, row: dict[str, Any]) -> None:
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


# -- the loop -------------------------------------------------------------------------------------


class CheckpointError(ModelFileError):
    """A ``--resume`` file that is not a checkpoint this trainer wrote (a ModelFileError, so that
    ``rlsched train`` reports it without importing this torch module to name the class)."""


CHECKPOINT_KEYS = ("agent", "optimizer", "torch_rng", "history", "iteration")
"""Entries every checkpoint has, of :func:`save_checkpoint` and of the vine trainer alike (``args`` is
not one: checkpoints written before it was kept resume with this invocation's settings)."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint at ``path``; CheckpointError, naming the file and what went wrong, for anything else.

    A checkpoint holds the pickled simulations, so it is read with ``weights_only=False``: resume only
    from checkpoints your own runs wrote. Any file that is not one fails inside torch or pickle with
    whatever error its bytes lead to (UnpicklingError, RuntimeError, EOFError, …), hence the broad catch."""
    try:
        ckpt = torch.load(path, weights_only=False)
    except Exception as exc:  # unpickling a foreign file can raise anything
        raise CheckpointError(f"--resume {path}: not a PPO checkpoint ({type(exc).__name__}: {exc})") from None
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt] if isinstance(ckpt, dict) else list(CHECKPOINT_KEYS)
    if missing:
        raise CheckpointError(f"--resume {path}: not a PPO checkpoint (no {', '.join(missing)})")
    return ckpt


def prepare_args(args: Args) -> tuple[Args, dict[str, Any] | None]:
    """The settings a run goes with, and its checkpoint when it resumes: a resumed run continues with the
    settings it started with (:func:`~rlsched.policy.ppo.config.resumed_args`), and a run from
    ``init_model`` takes that model's own (:func:`~rlsched.policy.ppo.config.settings_of_init_model`),
    whether it was started by ``rlsched train`` or through this API."""
    args = parse_tuple_fields(args)
    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume)
        args = resumed_args(args, ckpt.get("args"), args.resume)
    if args.init_model:
        args = settings_of_init_model(args)
    return args, ckpt


def episode_decisions(episodes: Sequence[dict], cores: Sequence[Any], end_at: float) -> float:
    """Decisions in one episode: the mean of the last finished training episodes, or before any has
    finished, the furthest running one's decisions scaled up by the arrivals it has still to come
    (FGD protocol; a living cluster's running episode counts as it stands)."""
    done = [e["decisions"] for e in episodes[-8:] if e.get("decisions")]
    if done:
        return float(np.mean(done))
    guesses = [float(c.decisions) for c in cores]
    for c in cores:
        share = getattr(c, "arrived", 0) / (end_at * c.capacity) if c.capacity else 0.0
        if share > 0:
            guesses.append(c.decisions / min(share, 1.0))
    return max(guesses)


def train(args: Args) -> TrainResult:
    """Run PPO; returns where the exported model went and the validation figures."""
    args, ckpt = prepare_args(args)
    if args.advantage == "vine":
        from .vine_trainer import train_vine

        return train_vine(args)
    if not 0 <= args.learn_from < args.end_at:
        raise ValueError(f"learn_from ({args.learn_from}) must be in [0, end_at = {args.end_at})")
    start_time = time.time()
    batch_size = args.num_envs * args.num_steps
    if not 1 <= args.num_minibatches <= batch_size:
        raise ValueError(
            f"num_minibatches ({args.num_minibatches}) must be in [1, num_envs × num_steps = {batch_size}]"
        )
    num_iterations = max(1, args.total_timesteps // batch_size)
    seed_everything(args)
    shuffle_rng = np.random.default_rng([args.seed, 7])

    cores = make_cores(args, args.end_at)
    envs = VectorCore(cores, seed0=args.train_seed0 + 10_000 * args.seed)
    val_core = make_cores(Args(**{**asdict(args), "num_envs": 1}), args.end_at)[0]
    agent = new_agent(args)
    optimizer = make_optimizer(agent, args)
    buffer = RolloutBuffer(args.num_steps, args.num_envs, len(FEATURES), len(CLUSTER_FEATURES))
    history: list[dict] = []
    episodes: list[dict] = []
    global_step, first_iteration, elapsed_before = 0, 1, 0.0
    best_val: float | None = None
    # measured below: what the next iteration and the final validation cost (carried over a resume)
    validation_s = iteration_s = 0.0
    validation_timed = False
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        envs = pickle.loads(ckpt["envs"])
        shuffle_rng = ckpt["shuffle_rng"]
        torch.set_rng_state(ckpt["torch_rng"])
        history, episodes, best_val = ckpt["history"], ckpt["episodes"], ckpt["best_val"]
        global_step, first_iteration, elapsed_before = ckpt["global_step"], ckpt["iteration"] + 1, ckpt["elapsed"]
        timed = [h["iteration_s"] for h in history if h.get("iteration_s")]
        iteration_s = ckpt.get("iteration_s", timed[-1] if timed else 0.0)
        validation_s = ckpt.get("validation_s", 0.0)
        validation_timed = bool(ckpt.get("validation_timed", False))
    out = RunOutput(args, cores[0].typical.to_json(), f"{args.train_seed0 + 10_000 * args.seed}+", best_val)
    run_dir = out.dir

    if not args.resume and args.eval_every:
        # the starting policy is a candidate too: PPO must beat it on validation to replace it
        val_start = time.time()
        start_val = float(np.mean(validate(numpy_net(agent, args), args, args.val_seeds, val_core)))
        validation_s, validation_timed = time.time() - val_start, True
        out.offer(agent, start_val, 0, {"globalStep": 0})
        history.append(
            {"iteration": 0, "global_step": 0, "val_unallocated": start_val, "elapsed_s": time.time() - start_time}
        )

    bar = None
    if args.progress:
        from tqdm import tqdm

        bar = tqdm(total=num_iterations, initial=first_iteration - 1, desc="ppo", unit="it", dynamic_ncols=True)
    done_iterations = first_iteration - 1
    for iteration in range(first_iteration, num_iterations + 1):
        elapsed = elapsed_before + time.time() - start_time
        if out_of_budget(args, iteration, first_iteration, elapsed, iteration_s + validation_s):
            break
        it_start = time.time()
        # every iteration, annealed or not: set_lr is what applies head_lr_scale
        set_lr(optimizer, (1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0) * args.learning_rate)

        # rollout: the numpy policy, as served
        net = numpy_net(agent, args)
        buffer.reset()
        warmup = 0
        for step in range(args.num_steps):
            for e, core in enumerate(envs.cores):
                while args.mode == "fgd" and args.learn_from and core.arrived < args.learn_from * core.capacity:
                    d = act(net, core, args.rank_scale)
                    _, done = step_core(core, d["node"], d["action"])
                    envs.after_step(e, done)
                    warmup += 1
                d = act(net, core, args.rank_scale)
                buffer.add(
                    step,
                    e,
                    d["x"],
                    d["prior"],
                    d["offset"],
                    d["count"],
                    d["cluster"],
                    d["special_mask"],
                    d["action"],
                    d["logprob"],
                    d["value"],
                )
                reward, done = step_core(core, d["node"], d["action"])
                buffer.rewards[step, e] = reward
                buffer.ended[step, e] = float(done)
                envs.after_step(e, done)
            global_step += args.num_envs
        for ep in envs.pop_finished():
            ep["global_step"] = global_step
            episodes.append(ep)
        last_values = np.array([act(net, core, args.rank_scale)["value"] for core in envs.cores], dtype=np.float32)
        buffer.compute_returns_and_advantage(last_values, args.gamma, args.gae_lambda)
        rollout_s = time.time() - it_start

        # update
        b_inds = np.arange(batch_size)
        clipfracs, approx_kl = [], torch.tensor(0.0)
        pg_loss = v_loss = entropy_loss = torch.tensor(0.0)
        for epoch in range(args.update_epochs):  # noqa: B007 (read after the loop: the epochs that ran)
            shuffle_rng.shuffle(b_inds)
            # num_minibatches near-equal parts: no leftover sliver of a few samples takes a full step
            for mb_inds in np.array_split(b_inds, args.num_minibatches):
                mb, extra = buffer.batch(mb_inds)
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb, extra["actions"])
                choice = extra["choice"].float()
                n_choice = choice.sum().clamp(min=1.0)
                logratio = (newlogprob - extra["logprobs"]) * choice
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = (((ratio - 1) - logratio) * choice).sum() / n_choice
                    clipfracs.append(float((((ratio - 1.0).abs() > args.clip_coef).float() * choice).sum() / n_choice))
                mb_adv = extra["advantages"]
                if args.norm_adv:
                    sel = mb_adv[choice > 0]
                    if len(sel) > 1:
                        mb_adv = (mb_adv - sel.mean()) / (sel.std() + 1e-8)
                pg_loss1 = -mb_adv * ratio
                pg_loss2 = -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = (torch.max(pg_loss1, pg_loss2) * choice).sum() / n_choice
                if args.clip_vloss:
                    v_unclipped = (newvalue - extra["returns"]) ** 2
                    v_clipped = extra["values"] + torch.clamp(
                        newvalue - extra["values"], -args.clip_coef, args.clip_coef
                    )
                    v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - extra["returns"]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - extra["returns"]) ** 2).mean()
                entropy_loss = (entropy * choice).sum() / n_choice
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and approx_kl > args.target_kl:
                break
        ev = explained_variance(buffer.values.reshape(-1), buffer.returns.reshape(-1))
        grad_norms = {
            f"grad_{name}": float(p.grad.norm())
            for name, p in agent.named_parameters()
            if p.grad is not None and name.endswith("weight")
        }
        raw_adv = buffer.advantages[buffer.choice]

        # diagnostics, validation, checkpoint
        it_s = time.time() - it_start
        recent = [e["unallocated_100"] for e in episodes[-8:] if e.get("unallocated_100") is not None]
        row = {
            "iteration": iteration,
            "global_step": global_step,
            "lr": optimizer.param_groups[0]["lr"],
            "pg_loss": pg_loss.item(),
            "v_loss": v_loss.item(),
            "entropy": entropy_loss.item(),
            "approx_kl": float(approx_kl),
            "clipfrac": float(np.mean(clipfracs)) if clipfracs else 0.0,
            "explained_variance": ev,
            "epochs": epoch + 1,
            "mean_reward": float(buffer.rewards.mean()),
            "sps": (batch_size + warmup) / max(rollout_s, 1e-9),
            "warmup_decisions": warmup,
            **grad_norms,
            "head_l1": agent.out.weight.detach().abs().sum().item(),
            "adv_std": float(raw_adv.std()) if raw_adv.size else 0.0,
            "iteration_s": it_s,
            "episodes": len(episodes),
            "episode_unallocated": float(np.mean(recent)) if recent else None,
            "episode_return": float(np.mean([e["return"] for e in episodes[-8:]])) if episodes else None,
            "elapsed_s": elapsed_before + time.time() - start_time,
            "val_unallocated": None,
        }
        last_iteration = iteration == num_iterations
        if (args.eval_every and iteration % args.eval_every == 0) or last_iteration:
            val_start = time.time()
            val = validate(numpy_net(agent, args), args, args.val_seeds, val_core)
            validation_s, validation_timed = time.time() - val_start, True
            row["val_unallocated"] = float(np.mean(val))
            out.offer(agent, row["val_unallocated"], global_step, {"globalStep": global_step})
        history.append(row)
        out.log(row)
        iteration_s = time.time() - it_start
        if not validation_timed:  # no validation ran yet (--eval-every 0): its episodes at this rollout's pace
            decision_s = rollout_s / max(batch_size + warmup, 1)
            validation_s = len(args.val_seeds) * episode_decisions(episodes, envs.cores, args.end_at) * decision_s
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                unalloc=row["episode_unallocated"],
                val=out.best_val,
                kl=f"{row['approx_kl']:.4f}",
                ev=f"{ev:.2f}",
                sps=f"{row['sps']:.0f}",
            )
        if iteration % args.checkpoint_every == 0 or last_iteration:
            save_checkpoint(
                run_dir / "checkpoint.pt",
                agent,
                optimizer,
                envs,
                shuffle_rng,
                history,
                episodes,
                out.best_val,
                global_step,
                iteration,
                elapsed_before + time.time() - start_time,
                args,
                {"iteration_s": iteration_s, "validation_s": validation_s, "validation_timed": validation_timed},
            )
            plot_curves(history, episodes, run_dir / "learning_curves.png", metric_label(args))
        done_iterations = iteration
    if bar is not None:
        bar.close()

    # the end: validate the final policy, export final and (if it is better than every validated one) best
    val_start = time.time()
    final_val = float(np.mean(validate(numpy_net(agent, args), args, args.val_seeds, val_core)))
    validation_s, validation_timed = time.time() - val_start, True
    seconds = elapsed_before + time.time() - start_time
    out.finish(agent, final_val, global_step, {"globalStep": global_step, "wallSeconds": seconds})
    save_checkpoint(
        run_dir / "checkpoint.pt",
        agent,
        optimizer,
        envs,
        shuffle_rng,
        history,
        episodes,
        out.best_val,
        global_step,
        done_iterations,
        seconds,
        args,
        {"iteration_s": iteration_s, "validation_s": validation_s, "validation_timed": validation_timed},
    )
    plot_curves(history, episodes, run_dir / "learning_curves.png", metric_label(args))
    (run_dir / "episodes.json").write_text(json.dumps(episodes, indent=0))
    return TrainResult(str(out.best_path), out.best_val, final_val, global_step, seconds, str(run_dir), history)


def make_optimizer(agent: Agent, args: Args) -> optim.Adam:
    """Adam over every parameter, the score head at ``head_lr_scale`` times the base step size."""
    head = list(agent.out.parameters())
    rest = [p for n, p in agent.named_parameters() if not n.startswith("out.")]
    lr, scale = args.learning_rate, args.head_lr_scale
    return optim.Adam(
        [{"params": rest, "lr_scale": 1.0}, {"params": head, "lr_scale": scale, "lr": lr * scale}],
        lr=lr,
        eps=1e-5,
    )


def set_lr(optimizer: optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def save_checkpoint(
    path: Path,
    agent: Agent,
    optimizer: optim.Optimizer,
    envs: VectorCore,
    shuffle_rng: np.random.Generator,
    history: list[dict],
    episodes: list[dict],
    best_val: float | None,
    global_step: int,
    iteration: int,
    elapsed: float,
    args: Args,
    timings: dict[str, Any],
) -> None:
    """Everything needed to continue the run exactly: its settings, weights, optimizer, simulations, random
    streams, and the timings the ``max_minutes`` check reserves (the last iteration's, one validation's)."""
    write_checkpoint(
        path,
        {
            "agent": agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            "envs": pickle.dumps(envs),
            "shuffle_rng": shuffle_rng,
            "torch_rng": torch.get_rng_state(),
            "history": history,
            "episodes": episodes,
            "best_val": best_val,
            "global_step": global_step,
            "iteration": iteration,
            "elapsed": elapsed,
            "args": asdict(args),
            **timings,
        },
    )


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` whole or not at all: into a temporary file beside it, then renamed over
    it, so that a run killed while writing (or a full disk) leaves the previous checkpoint resumable.
    The GAE and vine loops both write through it."""
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -- offline seam ---------------------------------------------------------------------------------


@dataclass
class DecisionRecord:
    """One logged decision: the candidate rows the policy saw, what was done, and what followed."""

    features: np.ndarray
    """float32[G, F] feature rows (schema :data:`rlsched.policy.features.FEATURES`)."""
    prior: np.ndarray
    """float[G] FGD-CPU prior per row (the ``fgdcpu_delta`` column)."""
    action: int
    """Chosen row, or -1 delay / -2 reject."""
    reward: float = 0.0
    """Reward observed after the decision (used as a weight when ``advantage_weighted``)."""
    count: np.ndarray | None = None
    """Nodes per row (default 1)."""
    offset: np.ndarray | None = None
    """Tie-break offsets per row (default 0)."""
    offered: tuple[bool, bool] | None = None
    """Whether delay and reject were offered at this decision (default: as :func:`records_buffer` is told)."""


def records_buffer(
    records: Sequence[DecisionRecord], allow_delay: bool = False, allow_reject: bool = False
) -> RolloutBuffer:
    """The records as one rollout buffer (one decision per step), for :meth:`RolloutBuffer.batch`.

    A record's special actions are offered as its ``offered`` says, else per ``allow_delay`` and
    ``allow_reject`` — or wherever any record took one: a log with delays came from a policy that could
    delay at every decision. Offering delay only where it was taken would teach "always delay"."""
    any_delay = allow_delay or any(r.action == -1 for r in records)
    any_reject = allow_reject or any(r.action == -2 for r in records)
    buf = RolloutBuffer(len(records), 1, len(FEATURES), len(CLUSTER_FEATURES))
    for t, r in enumerate(records):
        delay, reject = r.offered if r.offered is not None else (any_delay, any_reject)
        g = len(r.features)
        buf.add(
            t,
            0,
            r.features,
            r.prior,
            r.offset if r.offset is not None else np.zeros(g),
            r.count if r.count is not None else np.ones(g),
            r.features[0, CLUSTER_SLICE] if g else np.zeros(len(CLUSTER_FEATURES)),
            np.array([delay or r.action == -1, reject or r.action == -2]),
            r.action,
            0.0,
            0.0,
        )
    return buf


def fit_from_records(
    records: Sequence[DecisionRecord],
    args: Args | None = None,
    epochs: int = 10,
    batch: int = 256,
    learning_rate: float = 1e-3,
    advantage_weighted: bool = False,
    beta: float = 1.0,
    init: Agent | None = None,
) -> Agent:
    """Fit the agent's policy to logged decisions by (optionally advantage-weighted) behaviour cloning.

    Loss per decision: ``−w · log π(action)`` with ``w = 1`` (cloning) or ``w = exp(β · (r − mean r) / std r)``
    clipped to 20 (advantage-weighted regression with the observed reward as the advantage). Delay and
    reject are offered as :func:`records_buffer` says (``args.allow_delay``/``allow_reject``, or as the
    records show). The returned agent exports with :func:`export` like a PPO-trained one.
    """
    args = parse_tuple_fields(args or Args())
    if not records:
        raise ValueError("fit_from_records: no records")
    for i, r in enumerate(records):
        if r.features.ndim != 2 or r.features.shape[1] != len(FEATURES):
            raise ValueError(f"record {i}: features must be [G, {len(FEATURES)}], got {r.features.shape}")
        if not -2 <= r.action < len(r.features):
            raise ValueError(f"record {i}: action {r.action} out of range for {len(r.features)} rows")
    torch.manual_seed(args.seed)
    agent = init or Agent(len(FEATURES), len(CLUSTER_FEATURES), args.hidden, args.value_hidden, args.prior_scale)
    buf = records_buffer(records, args.allow_delay, args.allow_reject)
    rewards = np.array([r.reward for r in records], dtype=np.float64)
    if advantage_weighted:
        z = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        weights = np.minimum(np.exp(beta * z), 20.0).astype(np.float32)
    else:
        weights = np.ones(len(records), dtype=np.float32)
    optimizer = optim.Adam(agent.parameters(), lr=learning_rate)
    rng = np.random.default_rng(args.seed)
    idx = np.arange(len(records))
    for _ in range(epochs):
        rng.shuffle(idx)
        for s in range(0, len(idx), batch):
            mb = idx[s : s + batch]
            b, extra = buf.batch(mb)
            _, logprob, _, _ = agent.get_action_and_value(b, extra["actions"])
            loss = -(torch.from_numpy(weights[mb]) * logprob).mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    return agent
