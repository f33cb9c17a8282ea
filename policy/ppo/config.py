"""Training settings and what a run returns (torch-free, so ``rlsched train --help``, config validation
and ``--method es`` need no torch)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import typing
from dataclasses import dataclass

from ..scorers.fgd_cpu import DEFAULT_CPU_WEIGHT
from ..trace import OPENB_NODES, OPENB_PODS, openb_file


@dataclass
class Args:
    """Training settings (``rlsched train --help`` lists them as flags; ``--config`` reads them from YAML/JSON)."""

    method: str = "auto"
    """How to learn: ``ppo`` (per-decision PPO, from scratch or from ``init_model``), ``es`` (fine-tune
    ``init_model``, or the bundled model, by evolution strategies on whole episodes: its score head and
    rank weight; no torch needed; see rlsched.policy.es_finetune) or ``auto`` (``es`` when fine-tuning
    an ``init_model`` on the FGD protocol, else ``ppo``). Fine-tuning by PPO does not move the policy
    (docs/ppo.md); ES is what adapts a model to a cluster."""
    exp_name: str = "ppo"
    """Name of the run (the output folder is ``<out_dir>/<exp_name>-s<seed>``)."""
    seed: int = 1
    """Seed for torch, numpy and the order of training workloads (PPO); under --method es it sets the
    search directions only (the training workloads follow --train-seed0)."""
    torch_threads: int = 1
    """Threads torch may use (the simulator is single-threaded; 1 keeps runs reproducible)."""
    nodes: str = openb_file(OPENB_NODES)
    """Node list (openb CSV or generic YAML/JSON); by default the openb node list in ``$RLSCHED_OPENB_DIR``."""
    traces: tuple[str, ...] = (openb_file(OPENB_PODS),)
    """Pod lists to train on; env ``e`` (vine: trunk ``e``) plays trace ``e mod len(traces)``, so PPO needs
    ``num_envs`` (vine: ``vine_trunks``) at least the number of traces; by default the openb default trace
    in ``$RLSCHED_OPENB_DIR``."""
    train_seed0: int = 1000
    """First workload seed of training episodes (the evaluation seeds 42–51 are never used)."""
    val_seeds: tuple[int, ...] = (100, 101, 102)
    """Held-out workload seeds (first trace) for validation episodes that choose the exported model."""
    total_timesteps: int = 360_000
    """Decisions to collect in all (the run also stops at ``max_minutes``)."""
    max_minutes: float = 57.0
    """Stop after this many minutes of wall time (0: no limit): with the defaults a run ends within an hour."""
    max_iterations: int = 0
    """Stop after this many iterations in this invocation (0: no limit); resume continues the run."""
    num_envs: int = 4
    """Simulations stepped side by side."""
    num_steps: int = 512
    """Decisions per env per rollout."""
    learning_rate: float = 1e-4
    """Adam step size."""
    anneal_lr: bool = True
    """Decay the step size linearly to 0."""
    gamma: float = 0.9995
    """Discount per decision."""
    gae_lambda: float = 0.98
    """GAE λ."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    update_epochs: int = 4
    """Passes over each rollout."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    clip_coef: float = 0.2
    """PPO ratio clip."""
    clip_vloss: bool = True
    """Clip the value loss like the policy."""
    ent_coef: float = 0.01
    """Entropy bonus (without it the policy sharpens on noise and gets worse)."""
    vf_coef: float = 0.5
    """Value-loss weight."""
    max_grad_norm: float = 0.5
    """Gradient clipping."""
    target_kl: float | None = 0.02
    """Stop an update's epochs once approx_kl passes this (None: never)."""
    hidden: tuple[int, int] = (32, 32)
    """Widths of the shared per-node MLP."""
    value_hidden: int = 64
    """Width of the value head."""
    prior_scale: float = 50.0
    """Logits per card of FGD-CPU fragmentation change (the prior; 0 trains without it)."""
    rank_scale: float = 80.0
    """Logits across the whole tie-break order (see rlsched.policy.network)."""
    fgd_cpu_weight: float = DEFAULT_CPU_WEIGHT
    """Weight of CPU-stranded cards in the FGD-CPU prior and features."""
    serve_mode: str = "greedy"
    """Decision mode written into the exported model: ``greedy`` (the largest logit; 0.05 pp better than
    ``sample`` on validation seeds 100–109 of default) or ``sample`` (as trained)."""
    advantage: str = "gae"
    """How advantages are estimated: ``gae`` (classic PPO rollouts, GAE over the critic) or ``vine``
    (branch rollouts with common random numbers: each tried action's return to the episode's end,
    from a copy of the simulation with the same future; see rlsched.policy.ppo.vine)."""
    vine_trunks: int = 4
    """vine: trunk episodes (workload seeds) per iteration."""
    vine_points: int = 24
    """vine: branch states per trunk, uniform in ``vine_window``."""
    vine_actions: int = 3
    """vine: actions tried per branch state (the policy's most likely groups)."""
    vine_window: tuple[float, ...] = (0.85, 0.97)
    """vine: arrival fractions (of GPU capacity) between which branch states are taken."""
    rollout_mode: str = "greedy"
    """vine: how trunks and branches are played: ``greedy`` (the serving rule) or ``sample``."""
    workers: int = 0
    """vine and es: processes that play episodes; 0, the default, is one per core (as ``rlsched evaluate
    --jobs``). Only the speed depends on it: episodes and search directions are seeded."""
    es_pairs: int = 4
    """es: antithetic pairs of perturbations per iteration (2 episodes each, on one fresh training seed)."""
    es_seeds_per_pair: int = 1
    """es: fresh training seeds each perturbation plays (its fitness is their mean; more cut the noise)."""
    es_sigma: float = 0.5
    """es: perturbation scale of each score-head weight."""
    es_lr: float = 0.1
    """es: Adam step size of the score head."""
    es_layers: tuple[str, ...] = ("w_out",)
    """es: the policy network's parameters searched (of ``w1 b1 w2 b2 w_out``): the score head alone by
    default; adding the hidden layers lets the search change the features the head sees."""
    es_hidden_sigma: float = 0.03
    """es: perturbation scale of each searched parameter other than ``w_out`` (its step size keeps the
    head's ratio, ``es_lr / es_sigma``)."""
    es_rank_sigma: float = 20.0
    """es: perturbation scale of the rank weight (``decision.rankScale``; 0 keeps the start model's)."""
    es_rank_lr: float = 5.0
    """es: Adam step size of the rank weight."""
    es_eval_every: int = 5
    """es: validate every this many iterations (and at the end); the best validated model, the start
    model included, is the candidate for export."""
    es_confirm_seeds: int = 10
    """es: before export, the candidate and the start model play this many further held-out seeds (the
    ones after ``val_seeds``, 103–112 by default); the candidate is exported only if its mean there is
    lower and it is better on more of them than worse, else the start model is kept (the best of many
    validations on a few seeds is biased low). 0: export the best validated model unconfirmed."""
    head_lr_scale: float = 1.0
    """Step-size multiplier of the score head (the last layer of the learned correction): its
    initialization is tiny (0.01), so at the base step size it cannot grow to the logit scale of the
    prior (tens of logits) within a run."""
    learn_from: float = 0.85
    """FGD mode: decisions made before arrivals reach this fraction of GPU capacity are played by the current
    policy but not stored for updates (pods only start failing at ~96 %, so earlier decisions carry
    no reward within the discount horizon; 0 stores every decision)."""
    end_at: float = 1.005
    """Training episodes end once arrivals pass this fraction of GPU capacity (just after the 100 % point)."""
    target: float = 1.3
    """Inflation target of the workloads (the FGD protocol)."""
    fail_weight: float = 1.0
    """Reward per percent of GPU capacity that fails to be placed."""
    frag_weight: float = 0.0
    """Reward per percent of GPU capacity of FGD-CPU fragmentation removed (shaping; 0.25 pushed the
    policy toward greedy fragmentation descent, which is worse)."""
    cost_weight: float = 0.0
    """Reward penalty per placement × node price / mean price."""
    load_weight: float = 0.0
    """Reward penalty per placement × node cpu load."""
    allow_delay: bool = False
    """Offer the delay action in training."""
    allow_reject: bool = False
    """Offer the reject action in training."""
    mode: str = "fgd"
    """Training simulation: ``fgd`` (the FGD protocol: arrivals only, inflated) or ``dynamic`` (the
    living cluster of docs/dynamic.md: arrivals and departures at ``dynamic_load``, usage, live
    Prometheus-like load features, SLA; validation then reports −100 × the objective, lower better)."""
    dynamic_load: float = 0.9
    """dynamic: offered GPU load."""
    dynamic_window_s: float = 1800.0
    """dynamic: measured seconds per training episode."""
    sla_threshold: float = 0.9
    """dynamic: CPU or GPU utilization above which a node violates its SLA (unless objective_from)."""
    objective_from: str = ""
    """dynamic: a SchedulingPolicy file whose ``spec.objective`` (β, weights, SLA thresholds) sets the SLA
    thresholds and the objective validation reports and the exported model is chosen by."""
    sla_weight: float = 1.0
    """dynamic: reward per decision that pushes its node over the SLA threshold."""
    dynamic_frag_weight: float = 10.0
    """dynamic: reward per percent of GPU capacity of FGD fragmentation removed on the chosen node."""
    dynamic_cost_weight: float = 0.0
    """dynamic: reward penalty per decision that starts an idle node, × its price / mean price."""
    dynamic_ls_weight: float = 0.0
    """dynamic: reward penalty per expected latency-sensitive pod-hour on hot nodes that the decision adds
    (rlsched.policy.dynamic.env, ``LivingReward.ls``)."""
    qos_features: bool = False
    """Fill the QoS feature columns (is the pod latency-sensitive, how many such pods a node runs) in
    training; the exported model is then served with them."""
    hold_s: float = 60.0
    """dynamic: how long the delay action holds a pod back (with allow_delay)."""
    init_model: str = ""
    """Start from this exported model (.npz) instead of a fresh network."""
    eval_every: int = 10
    """Run validation every this many iterations (0: only at the end)."""
    checkpoint_every: int = 5
    """Write the checkpoint every this many iterations."""
    out_dir: str = "runs/train"
    """Where checkpoints, metrics, curves and the exported model go."""
    resume: str = ""
    """Continue from this checkpoint.pt."""
    model_version: str = ""
    """Version string written into the model (default: <exp_name>-s<seed>-<steps>, with the decisions the
    run had collected when it exported that model)."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class TrainResult:
    """What a training run produced (``rlsched train`` prints it)."""

    model_path: str
    best_val: float | None
    final_val: float | None
    steps: int
    """Decisions collected (PPO) or episodes played (ES)."""
    seconds: float
    run_dir: str
    history: list[dict] = dataclasses.field(default_factory=list)


def parse_tuple_fields(args: Args) -> Args:
    """Normalize list-valued fields read from flags or config files into tuples."""
    args.traces = tuple(args.traces)
    args.val_seeds = tuple(int(s) for s in args.val_seeds)
    args.hidden = tuple(int(h) for h in args.hidden)
    args.vine_window = tuple(float(w) for w in args.vine_window)
    if args.method not in ("auto", "ppo", "es"):
        raise ValueError(f"method must be auto, ppo or es, got {args.method!r}")
    if args.mode not in ("fgd", "dynamic"):
        raise ValueError(f"mode must be fgd or dynamic, got {args.mode!r}")
    if args.advantage not in ("gae", "vine"):
        raise ValueError(f"advantage must be gae or vine, got {args.advantage!r}")
    if args.rollout_mode not in ("greedy", "sample"):
        raise ValueError(f"rollout_mode must be greedy or sample, got {args.rollout_mode!r}")
    if len(args.vine_window) != 2 or not 0 <= args.vine_window[0] < args.vine_window[1]:
        raise ValueError(f"vine_window must be two ascending arrival fractions, got {args.vine_window}")
    return args


ARGS_FIELDS: list[dataclasses.Field] = list(dataclasses.fields(Args))


def model_version(args: Args, steps: int) -> str:
    """The version a PPO run writes into a model it exports after ``steps`` decisions: ``model_version``,
    else ``<exp_name>-s<seed>-<steps>``."""
    return args.model_version or f"{args.exp_name}-s{args.seed}-{steps}"


def vine_problem(args: Args) -> str | None:
    """Why ``advantage=vine`` cannot train with these settings, or None. Vine branches FGD-protocol episodes
    at placement decisions and plays every branch to the end by placing (:mod:`rlsched.policy.playout`):
    it has no living cluster to branch, and no delay or reject decision to try (``allow_delay`` and
    ``allow_reject`` as the run ends up with them, a start model's own included)."""
    if args.advantage != "vine":
        return None
    if args.mode != "fgd":
        return (
            f"--advantage vine branches FGD-protocol episodes only, not --mode {args.mode}; "
            "use --advantage gae for the living cluster"
        )
    for name, offered in (("delay", args.allow_delay), ("reject", args.allow_reject)):
        if offered:
            return (
                f"--advantage vine branches placement decisions only, not the {name} action (--allow-{name}, or "
                "a start model trained with it); use --advantage gae to train with it"
            )
    return None


RUN_CONTROL_FIELDS = ("resume", "max_minutes", "max_iterations", "progress", "workers", "checkpoint_every")
"""The settings a ``--resume`` takes from its own invocation: how long and how visibly the run goes on, never
what it learns (``workers`` changes only the speed; the rest comes from the checkpoint)."""


def resumed_args(args: Args, saved: dict[str, typing.Any] | None, checkpoint: str) -> Args:
    """The settings a resumed run continues with: the checkpoint's ``saved`` ones, with only
    :data:`RUN_CONTROL_FIELDS` from ``args``; other fields of ``args`` that differ are ignored, with a note
    (the run continues as it started, whatever the flags of this invocation default to). A checkpoint
    written before it stored its settings (``saved`` None) continues with ``args``."""
    if saved is None:
        print(
            f"rlsched train: {checkpoint} holds no settings (an older checkpoint): using this invocation's",
            file=sys.stderr,
        )
        return args
    known = {f.name for f in ARGS_FIELDS}
    theirs = {k: v for k, v in saved.items() if k in known}
    ours = dataclasses.asdict(args)
    control = {k: ours[k] for k in RUN_CONTROL_FIELDS}
    merged = parse_tuple_fields(Args(**{**theirs, **control}))
    ignored = [f"{k}={ours[k]!r} (the run's: {v!r})" for k, v in dataclasses.asdict(merged).items() if ours[k] != v]
    if ignored:
        print(
            f"rlsched train: resuming {checkpoint} with the run's own settings; ignored: " + ", ".join(ignored),
            file=sys.stderr,
        )
    return merged


def settings_of_init_model(args: Args) -> Args:
    """``args`` with the start model's network sizes, decision rule, feature settings and special actions:
    PPO starts from that model, not from its weights under this run's defaults (an ES-tuned rank weight, a
    QoS model's columns, a model that delays). A flag that says otherwise is overruled, with a note; the
    delay and reject actions stay offered when the model was trained with them (a flag may add one), and
    so do the QoS columns (``--qos-features`` may add them to a model without them).
    :func:`rlsched.policy.ppo.trainer.train` applies it, so the API and ``rlsched train`` start alike."""
    from ..export import read_model, trained_with_qos

    _, manifest, _ = read_model(args.init_model)
    net, decision, feats = manifest["network"], manifest["decision"], manifest["features"]
    trained = (manifest.get("training") or {}).get("args") or {}
    theirs: dict[str, typing.Any] = {
        "hidden": tuple(int(h) for h in net["hidden"]),
        "value_hidden": int(net["valueHidden"]),
        "prior_scale": float(net["priorScale"]),
        "rank_scale": float(decision["rankScale"]),
        "fgd_cpu_weight": float(feats["fgdCpuWeight"]),
        # a model without the QoS columns may gain them (they start at zero weight, so it starts as it
        # scored: docs/dynamic.md's QoS stages); one trained with them keeps them
        "qos_features": trained_with_qos(manifest) or args.qos_features,
        **special_actions(args, manifest),
    }
    if decision.get("mode") in ("greedy", "sample"):
        theirs["serve_mode"] = decision["mode"]
    hold = trained.get("hold_s")
    if isinstance(hold, (int, float)) and not isinstance(hold, bool):  # the hold the served model delays for
        theirs["hold_s"] = float(hold)
    changed = {k: v for k, v in theirs.items() if getattr(args, k) != v}
    if changed:
        print(
            f"rlsched train: starting from {args.init_model}: its "
            + ", ".join(f"{k}={v}" for k, v in changed.items())
            + " (the run's own values are overruled)",
            file=sys.stderr,
        )
    return dataclasses.replace(args, **theirs)


def special_actions(args: Args, manifest: dict[str, typing.Any]) -> dict[str, bool]:
    """``allow_delay`` and ``allow_reject`` of a run from the model with ``manifest``: offered when the model
    was trained with them (a flag may add one)."""
    actions = manifest.get("actions") or {}
    return {
        "allow_delay": args.allow_delay or bool(actions.get("delay")),
        "allow_reject": args.allow_reject or bool(actions.get("reject")),
    }


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name → the docstring under it in the dataclass ``cls`` (what ``--help`` prints)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            out[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[attr-defined]
    return out


def field_doc(name: str) -> str:
    return field_docs(Args).get(name, "")


def field_kind(f: dataclasses.Field):
    """(kind, element type) of a field for the command line: int, float, str, bool, tuple or optional-float."""
    hints = typing.get_type_hints(Args)
    t = hints[f.name]
    if t is bool:
        return bool, None
    if typing.get_origin(t) is tuple:
        return tuple, typing.get_args(t)[0]
    if t == (float | None):
        return "optional-float", None
    return t, None
