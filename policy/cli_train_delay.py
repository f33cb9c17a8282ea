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
from pathlib import Path

from .trace import missing_input


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


def run(ns: argparse.Namespace) -> int:
    from .dynamic.delay_search import DelaySearchSettings, search

    values = {
        f.name: getattr(ns, f.name)
        for f in dataclasses.fields(DelaySearchSettings)
        if getattr(ns, f.name, None) is not None
    }
    cfg = DelaySearchSettings(**values)
    cfg.val_seeds = tuple(cfg.val_seeds)
    cfg.loads = tuple(cfg.loads)
    for path in (cfg.nodes, cfg.pods, cfg.start_model, *([cfg.objective_from] if cfg.objective_from else [])):
        if not Path(path).is_file():
            flag = "--nodes" if path == cfg.nodes else "--pods" if path == cfg.pods else "the file"
            print(f"rlsched train-delay: {missing_input(path, flag)}", file=sys.stderr)
            return 2
    if not (1 <= cfg.elites <= cfg.population) or cfg.generations < 1 or cfg.seeds_per_load < 1 or not cfg.loads:
        print(
            "rlsched train-delay: need 1 <= elites <= population, generations >= 1, seeds >= 1 and a load",
            file=sys.stderr,
        )
        return 2
    if cfg.fitness not in ("ranked", "mean"):
        print(f"rlsched train-delay: --fitness is ranked or mean, not {cfg.fitness!r}", file=sys.stderr)
        return 2
    if cfg.hold_s <= 0 or any(not 0 < load <= 10 for load in cfg.loads):
        print("rlsched train-delay: need hold-s > 0 and loads in (0, 10]", file=sys.stderr)
        return 2
    search(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0
