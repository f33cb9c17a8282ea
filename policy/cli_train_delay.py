"""``rlsched train-delay``: learn a model's delay head in the living cluster.

Every field of :class:`rlsched.policy.dynamic.delay_search.DelaySearchSettings` is a flag. The result
is a model file: the start model with a delay head added, served like any model
(``ppo:FILE`` in ``rlsched evaluate``, ``modelPath`` of a SchedulingPolicy); docs/dynamic.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dynamic.delay_search import DelaySearchSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .dynamic.delay_search import DelaySearchSettings
    from .ppo.config import field_docs

    docs = field_docs(DelaySearchSettings)
    hints = typing.get_type_hints(DelaySearchSettings)
    for f in dataclasses.fields(DelaySearchSettings):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{docs.get(f.name, '')} (default: {f.default!r})".replace("%", "%%")
        hint = hints[f.name]
        if hint in (tuple[int, ...], tuple[float, ...]):
            parser.add_argument(
                flag, dest=f.name, nargs="+", type=typing.get_args(hint)[0], default=None, help=help_text
            )
        else:
            parser.add_argument(flag, dest=f.name, type=hint, default=None, help=help_text)


def settings_problem(cfg: DelaySearchSettings) -> str | None:
    """What in ``cfg`` no search can use, without reading a file (:mod:`rlsched.policy.cli_search`)."""
    from .cli_search import common_problem
    from .delay_head import MAX_HOLD_S

    problem = common_problem(
        cfg,
        {
            "--nodes": cfg.nodes,
            "--pods": cfg.pods,
            "--start-model": cfg.start_model,
            "--objective-from": cfg.objective_from,
        },
    )
    if problem:
        return problem
    if not (1 <= cfg.elites <= cfg.population) or cfg.generations < 1 or cfg.seeds_per_load < 1 or not cfg.loads:
        return "need 1 <= elites <= population, generations >= 1, seeds >= 1 and a load"
    if cfg.fitness not in ("ranked", "mean"):
        return f"--fitness is ranked or mean, not {cfg.fitness!r}"
    if cfg.train_seed0 < 1:  # the probe runs play seed train_seed0 - 1
        return f"--train-seed0 must be at least 1, got {cfg.train_seed0}"
    if not 0 < cfg.hold_s <= MAX_HOLD_S or any(not 0 < load <= 10 for load in cfg.loads):
        return f"need hold-s in (0, {MAX_HOLD_S:g}] and loads in (0, 10]"
    return None


def run(ns: argparse.Namespace) -> int:
    from .cli_evaluate import os_error
    from .cli_search import check_readable
    from .dynamic.delay_search import DelaySearchSettings, search
    from .export import read_model

    values = {
        f.name: getattr(ns, f.name)
        for f in dataclasses.fields(DelaySearchSettings)
        if getattr(ns, f.name, None) is not None
    }
    cfg = DelaySearchSettings(**values)
    cfg.val_seeds = tuple(cfg.val_seeds)
    cfg.loads = tuple(cfg.loads)
    try:
        problem = settings_problem(cfg)
        if problem:
            raise ValueError(problem)
        read_model(cfg.start_model)
        check_readable(cfg)
        search(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as exc:  # TraceError, ModelFileError, UnknownPolicyError, NoWaitError too
        print(f"rlsched train-delay: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rlsched train-delay: {os_error(exc)}", file=sys.stderr)
        return 2
    return 0
