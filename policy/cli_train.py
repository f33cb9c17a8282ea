"""``rlsched train``: PPO training, or evolution-strategies fine-tuning (``--method es``), from flags or
a config file (YAML/JSON with the same keys).

Every field of :class:`rlsched.policy.ppo.config.Args` is a flag (``--num-envs 4``, ``--traces a.csv b.csv``,
``--no-anneal-lr``); ``--config FILE`` sets defaults that flags override. ``--export PATH`` copies the
chosen model (and its manifest) to PATH when training ends, replacing what was there whole or not at all.
torch is imported only here, when PPO runs; ``--method es`` needs none (:mod:`rlsched.policy.es_finetune`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ppo.config import Args, TrainResult


FLAG_ALIASES: dict[str, tuple[str, ...]] = {"traces": ("--pods",), "init_model": ("--init",)}
"""Other spellings of some flags, in the words of "teach the scheduler my cluster": ``rlsched train
--nodes MY_NODES --pods MY_POD_HISTORY --init policy/models/ppo-openb-default.npz``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .ppo.config import ARGS_FIELDS, field_doc, field_kind

    parser.add_argument("--config", help="YAML or JSON file with training settings (keys as below, with _ or -)")
    parser.add_argument(
        "--export", help="copy the chosen model (.npz, plus its .json manifest) here when training ends"
    )
    parser.add_argument(
        "--from-decisions",
        metavar="PATH",
        help="fine-tune on the workload in rlsched operator's decision log (folder or segment); it "
        "replaces --traces; start from the served model with --init-model (rlsched.policy.decision_dataset)",
    )
    for f in ARGS_FIELDS:
        flags = ["--" + f.name.replace("_", "-"), *FLAG_ALIASES.get(f.name, ())]
        kind, elem = field_kind(f)
        help_text = f"{field_doc(f.name)} (default: {f.default!r})".replace("%", "%%")
        if kind is bool:
            parser.add_argument(
                *flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif kind is tuple:
            parser.add_argument(*flags, dest=f.name, nargs="+", type=elem, default=None, help=help_text)
        elif kind == "optional-float":
            parser.add_argument(*flags, dest=f.name, type=_optional_float, default=None, help=help_text)
        else:
            parser.add_argument(*flags, dest=f.name, type=kind, default=None, help=help_text)


def _optional_float(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "off") else float(text)


def load_config(path: str) -> dict[str, Any]:
    """Settings from a YAML/JSON file; raises ValueError naming unknown keys."""
    import yaml

    from .ppo.config import ARGS_FIELDS

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of settings")
    known = {f.name for f in ARGS_FIELDS}
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(out) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown setting(s) {', '.join(unknown)}; see `rlsched train --help`")
    return out


def build_args(ns: argparse.Namespace) -> Args:
    """Args from config file defaults overridden by explicit flags (the traces are checked later when
    ``--from-decisions`` replaces them)."""
    from .ppo.config import ARGS_FIELDS, Args, parse_tuple_fields

    values: dict[str, Any] = load_config(ns.config) if ns.config else {}
    for f in ARGS_FIELDS:
        v = getattr(ns, f.name, None)
        if v is not None:
            values[f.name] = v
    args = parse_tuple_fields(Args(**values))
    problem = number_problem(args) or range_problem(args)
    if problem:
        raise ValueError(problem)
    from .evaluate import default_jobs, jobs_problem

    problem = jobs_problem(args.workers, "--workers")
    if problem:
        raise ValueError(problem)
    if args.workers == 0:  # recorded in the model's manifest as the count that ran
        args = dataclasses.replace(args, workers=default_jobs())
    if not (args.max_minutes >= 0 and args.max_iterations >= 0):  # NaN too
        raise ValueError(
            f"--max-minutes and --max-iterations must be 0 (no limit) or more, got {args.max_minutes} and "
            f"{args.max_iterations}"
        )
    from .trace import missing_input, output_problem

    traces = () if getattr(ns, "from_decisions", None) else args.traces
    problem = ppo_problem(args, len(traces)) if training_method(args) == "ppo" else None
    if problem:
        raise ValueError(problem)
    problem = None if args.resume else version_problem(args)  # a resumed run's version is its checkpoint's
    if problem:
        raise ValueError(problem)
    for flag, path in (
        ("--nodes", args.nodes),
        *(("--traces", trace) for trace in traces),
        *([("--init-model", args.init_model)] if args.init_model else []),
        *([("--resume", args.resume)] if args.resume else []),
    ):
        if not Path(path).is_file():
            raise ValueError(missing_input(path, flag))
    # a resumed run writes into its checkpoint's own folder, not --out-dir: nothing to check there
    problem = (None if args.resume else output_problem(args.out_dir, "--out-dir", folder=True)) or (
        output_problem(ns.export, "--export") or output_problem(Path(ns.export).with_suffix(".json"), "--export")
        if getattr(ns, "export", None)
        else None
    )
    if problem:
        raise ValueError(problem)
    if args.serve_mode not in ("sample", "greedy"):
        raise ValueError(f"--serve-mode must be sample or greedy, got {args.serve_mode!r}")
    if not 0 <= args.learn_from < args.end_at:
        raise ValueError(f"--learn-from ({args.learn_from}) must be in [0, --end-at = {args.end_at})")
    if args.num_envs < 1 or args.num_steps < 1 or args.num_minibatches < 1:
        raise ValueError("--num-envs, --num-steps and --num-minibatches must be at least 1")
    if (
        training_method(args) == "ppo"
        and args.advantage == "gae"
        and args.num_minibatches > args.num_envs * args.num_steps
    ):
        raise ValueError(
            f"--num-minibatches ({args.num_minibatches}) must be at most the batch, --num-envs × --num-steps "
            f"({args.num_envs * args.num_steps})"
        )
    if args.objective_from:
        from .dynamic.objective_spec import read_objective

        read_objective(args.objective_from)  # refuse a bad policy file before training starts
    return args


INFINITE_OK = ("max_minutes",)
"""Float settings for which infinity means something (no limit, like 0); NaN is refused everywhere."""


def number_problem(args: Args) -> str | None:
    """The first numeric setting no run can use, naming its flag: NaN (it passes every range test written
    with ``<``, and ``--es-sigma nan`` failed only deep in the search), infinity where it is no limit
    (:data:`INFINITE_OK`), an inflation target outside :func:`~rlsched.policy.workload.target_problem`'s
    range, or a negative seed (numpy refuses it only when the first episode starts)."""
    from .cli_search import flag_of, seeds_problem
    from .ppo.config import ARGS_FIELDS
    from .workload import target_problem

    for f in ARGS_FIELDS:
        value = getattr(args, f.name)
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and f.name not in INFINITE_OK)):
                return f"{flag_of(f.name)} must be a finite number, got {v}"
    for flag, seeds in (
        ("--seed", (args.seed,)),
        ("--train-seed0", (args.train_seed0,)),
        ("--val-seeds", args.val_seeds),
    ):
        problem = seeds_problem(flag, tuple(seeds))
        if problem:
            return problem
    if not args.val_seeds:
        return "--val-seeds: give at least one validation seed"
    return target_problem(args.target)


AT_LEAST_ONE = (
    "torch_threads",
    "update_epochs",
    "checkpoint_every",
    "value_hidden",
    "vine_trunks",
    "vine_points",
    "vine_actions",
)
"""Whole-number settings that count something a run needs at least one of (threads, passes, iterations
between checkpoints, units, trunks, branch states, tried actions); 0 failed only in the loop."""


def range_problem(args: Args) -> str | None:
    """The first setting out of the range any run can use, naming its flag: a count of :data:`AT_LEAST_ONE`
    below 1, ``--hidden`` other than two widths of at least 1, a step size not above 0, a negative rank
    weight (the served decision rule refuses one: the model would train, then never load)."""
    from .cli_search import flag_of

    for name in AT_LEAST_ONE:
        value = getattr(args, name)
        if value < 1:
            return f"{flag_of(name)} must be at least 1, got {value}"
    if len(args.hidden) != 2 or min(args.hidden) < 1:
        return f"--hidden takes two layer widths of at least 1, got {' '.join(map(str, args.hidden)) or 'none'}"
    if not args.learning_rate > 0:
        return f"--learning-rate must be more than 0, got {args.learning_rate}"
    if args.head_lr_scale < 0:
        return f"--head-lr-scale must be 0 or more, got {args.head_lr_scale}"
    if args.rank_scale < 0:
        return f"--rank-scale must be 0 or more (a served model's rank weight is never negative), got {args.rank_scale}"
    if args.eval_every < 0:
        return f"--eval-every must be 0 (only at the end) or more, got {args.eval_every}"
    return None


def ppo_problem(args: Args, traces: int) -> str | None:
    """What a PPO run (``method`` ppo) cannot do with these flags: train on ``traces`` pod lists with fewer
    simulations than lists (env ``e``, vine trunk ``e``, plays list ``e mod traces``: the rest would never
    be played while the manifest names them), or run ``--advantage vine`` where it does not branch
    (:func:`~rlsched.policy.ppo.config.vine_problem`; a start model's special actions are checked with the
    model, :func:`check_inputs`)."""
    from .ppo.config import vine_problem

    flag, envs = ("--vine-trunks", args.vine_trunks) if args.advantage == "vine" else ("--num-envs", args.num_envs)
    if traces > envs:
        return (
            f"{traces} traces but {flag} {envs}: each simulation plays one trace, so {traces - envs} would never "
            f"be trained on; raise {flag} to at least {traces}"
        )
    return vine_problem(args)


def version_problem(args: Args) -> str | None:
    """A model version longer than a model file may carry, refused before the run rather than at its export:
    ``--model-version``, or the default the run would write at its last step (``<exp_name>-s<seed>-<steps>``,
    :func:`~rlsched.policy.ppo.config.model_version`; ``-es<iteration>`` under ``--method es``)."""
    from .export import MAX_VERSION_CHARS
    from .ppo.config import model_version

    if training_method(args) == "es":
        # the exported iteration is at most --max-iterations; a run bounded by time alone: allow 9 digits
        version = args.model_version or f"{args.exp_name}-s{args.seed}-es{args.max_iterations or 10**9 - 1}"
    else:
        per_iteration = (
            args.vine_trunks * args.vine_points if args.advantage == "vine" else args.num_envs * args.num_steps
        )
        version = model_version(args, max(args.total_timesteps, per_iteration))
    if len(version) <= MAX_VERSION_CHARS:
        return None
    where = "--model-version" if args.model_version else "the default model version <exp_name>-s<seed>-<steps>"
    return (
        f"{where} would be {len(version)} characters ({version[:40]}…); a model's version has at most "
        f"{MAX_VERSION_CHARS}: shorten it" + ("" if args.model_version else " with --exp-name or --model-version")
    )


def run(ns: argparse.Namespace) -> int:
    try:
        args = build_args(ns)
    except (ValueError, TypeError) as exc:
        print(f"rlsched train: {exc}", file=sys.stderr)
        return 2
    if getattr(ns, "from_decisions", None):
        from .decision_dataset import prepare_fine_tune

        try:
            trace, summary = prepare_fine_tune(ns.from_decisions, args.out_dir)
        except (OSError, ValueError) as exc:
            print(f"rlsched train: --from-decisions: {exc}", file=sys.stderr)
            return 2
        print("\n".join(["decision log " + str(ns.from_decisions) + ":", *summary.lines()]), file=sys.stderr)
        args = dataclasses.replace(args, traces=(str(trace),))
    try:
        check_inputs(args, warn=lambda line: print(f"rlsched train: warning: {line}", file=sys.stderr))
    except ValueError as exc:  # TraceError and ModelFileError too
        print(f"rlsched train: {exc}", file=sys.stderr)
        return 2
    method = training_method(args)
    if method == "es":
        return _run_es(ns, args)
    try:
        from .ppo.trainer import train
    except ImportError as exc:  # pragma: no cover - depends on the install
        print(
            f"rlsched train: needs torch ({exc}); install the 'train' extra into this environment, "
            "from the folder of your clone: pip install -e '.[train]'",
            file=sys.stderr,
        )
        return 2
    from .export import ModelFileError

    try:
        result = train(args)
    except ModelFileError as exc:  # a --resume file that is no checkpoint (ppo.trainer.CheckpointError)
        print(f"rlsched train: {exc}", file=sys.stderr)
        return 2
    return _report(ns, "ppo", result)


def check_inputs(args: Args, warn: Callable[[str], None] | None = None) -> None:
    """Refuse, before any work starts, what no training can use: node lists and traces that cannot be
    read, a cluster without GPUs, a workload without GPU pods (the protocol inflates GPU demand), in FGD
    mode a workload that cannot be inflated to the target (:func:`~rlsched.policy.workload.check_inflatable`),
    a start model that cannot be served or, under ``--advantage vine``, that offers the delay or reject
    action (:func:`~rlsched.policy.ppo.config.vine_problem`). ValueError says which. ``warn`` is told about
    pods that fit no node even in the empty cluster (:func:`~rlsched.policy.evaluate.unplaceable_note`), as
    evaluate does."""
    from .cluster import ClusterState
    from .evaluate import unplaceable_note
    from .export import read_model
    from .ppo.config import special_actions, vine_problem
    from .trace import load_nodes, load_pods
    from .workload import check_inflatable

    nodes = load_nodes(args.nodes)
    if not any(n.gpu_count > 0 for n in nodes):
        raise ValueError(f"{args.nodes}: no node has a GPU; the scheduler learns to place GPU pods")
    capacity = ClusterState(nodes).gpu_milli_capacity
    for trace in args.traces:
        pods = load_pods(trace)
        if not any(p.gpu_request_milli > 0 for p in pods):
            raise ValueError(f"{trace}: no pod asks for a GPU; nothing to learn from")
        if args.mode == "fgd":
            try:
                check_inflatable(pods, capacity, args.target)
            except ValueError as exc:
                raise ValueError(f"{trace}: {exc}") from None
        note = unplaceable_note(nodes, pods)
        if note and warn is not None:
            warn(f"{trace}: {note}")
    if args.init_model:
        _, manifest, _ = read_model(args.init_model)
        if training_method(args) == "ppo":  # the run offers the special actions the model was trained with
            offered = special_actions(args, manifest)
            problem = vine_problem(
                dataclasses.replace(args, allow_delay=offered["allow_delay"], allow_reject=offered["allow_reject"])
            )
            if problem:
                raise ValueError(f"--init-model {args.init_model}: {problem}")


def settings_of_init_model(args: Args) -> Args:
    """The start model's settings over ``args`` (:func:`rlsched.policy.ppo.config.settings_of_init_model`,
    which PPO's ``train`` applies itself)."""
    from .ppo.config import settings_of_init_model as of_model

    return of_model(args)


def training_method(args: Args) -> str:
    """``ppo`` or ``es``: ``auto`` fine-tunes an ``init_model`` on the FGD protocol by ES, else trains by PPO."""
    if args.method != "auto":
        return args.method
    return "es" if args.init_model and args.mode == "fgd" else "ppo"


def _run_es(ns: argparse.Namespace, args: Args) -> int:
    from .es_finetune import finetune

    if args.resume:
        print("rlsched train: --resume continues a PPO run; --method es starts afresh", file=sys.stderr)
        return 2
    start = args.init_model or "the bundled model"
    print(
        f"rlsched train: fine-tuning {start} by evolution strategies (--method es; --method ppo for PPO)",
        file=sys.stderr,
    )

    def progress(row: dict[str, Any]) -> None:
        if args.progress:
            print("es " + json.dumps(row), file=sys.stderr, flush=True)

    try:
        result = finetune(args, progress)
    except ValueError as exc:
        print(f"rlsched train: {exc}", file=sys.stderr)
        return 2
    return _report(ns, "es", result)


def _report(ns: argparse.Namespace, method: str, result: TrainResult) -> int:
    """Print what the run produced; with ``--export``, copy the chosen model and its manifest there
    (:func:`install_copies`). The exit status: 2 when the copy fails (the trained model stays where the
    run wrote it, and what was at the destination stays as it was)."""
    summary = {
        "method": method,
        "model": result.model_path,
        "val_unallocated_best": result.best_val,
        "val_unallocated_final": result.final_val,
        "decisions" if method == "ppo" else "episodes": result.steps,
        "seconds": round(result.seconds, 1),
        "run_dir": result.run_dir,
    }
    confirmation = next((row["confirmation"] for row in reversed(result.history) if "confirmation" in row), None)
    if confirmation is not None:  # es: the candidate against the start on the confirmation seeds
        summary["confirmation"] = confirmation
    print(json.dumps(summary, indent=1))
    if ns.export:
        dest = Path(ns.export)
        try:  # checked before training (build_args), but the filesystem may have changed since
            dest.parent.mkdir(parents=True, exist_ok=True)
            model = Path(result.model_path)
            install_copies([(model, dest), (model.with_suffix(".json"), dest.with_suffix(".json"))])
        except OSError as exc:
            print(
                f"rlsched train: --export {dest}: {exc.strerror or exc}; the model is at {result.model_path}",
                file=sys.stderr,
            )
            return 2
        print(f"exported {dest}")
    return 0


def install_copies(pairs: list[tuple[Path, Path]]) -> None:
    """Copy each source over its destination, so that a failure (a full disk, a kill) never leaves a
    destination half written: every source is first copied to a temporary file in its destination's
    folder, then each is renamed over its destination (``os.replace``, atomic on one filesystem) in order —
    a model before its manifest. OSError if a copy fails; the temporary files are removed."""
    staged: list[tuple[Path, Path]] = []
    try:
        for src, dest in pairs:
            # named here, not by mkstemp: copyfile creates it with a new file's usual permissions (mkstemp's
            # 0600 would hide the model from a server running as another user)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            staged.append((tmp, dest))
            shutil.copyfile(src, tmp)
        for tmp, dest in staged:
            os.replace(tmp, dest)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
