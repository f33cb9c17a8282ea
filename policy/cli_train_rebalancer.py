"""``rlsched train-rebalancer``: learn the rebalancer's chooser in the living cluster.

Every field of :class:`rlsched.policy.dynamic.rebalance_search.SearchSettings` is a flag. The result
is a weights file for ``rlsched evaluate --mode dynamic --rebalancer learned:FILE``, and its
``weights`` are a SchedulingPolicy's ``spec.rebalance.weights`` as they stand (docs/rebalancer.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

from .trace import missing_input


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .dynamic.rebalance_search import SearchSettings
    from .ppo.config import field_docs

    docs = field_docs(SearchSettings)
    hints = typing.get_type_hints(SearchSettings)
    for f in dataclasses.fields(SearchSettings):
        if f.name == "hand":
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{docs.get(f.name, '')} (default: {f.default!r})".replace("%", "%%")
        if hints[f.name] == tuple[int, ...]:
            parser.add_argument(flag, dest=f.name, nargs="+", type=int, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=hints[f.name], default=None, help=help_text)


def run(ns: argparse.Namespace) -> int:
    from .dynamic.rebalance_search import SearchSettings, search

    values = {
        f.name: getattr(ns, f.name) for f in dataclasses.fields(SearchSettings) if getattr(ns, f.name, None) is not None
    }
    cfg = SearchSettings(**values)
    cfg.val_seeds = tuple(cfg.val_seeds)
    for path in (cfg.nodes, cfg.pods, *([cfg.objective_from] if cfg.objective_from else [])):
        if not Path(path).is_file():
            flag = "--nodes" if path == cfg.nodes else "--pods" if path == cfg.pods else "the file"
            print(f"rlsched train-rebalancer: {missing_input(path, flag)}", file=sys.stderr)
            return 2
    if not (1 <= cfg.elites <= cfg.population) or cfg.generations < 1 or cfg.seeds_per_candidate < 1:
        print(
            "rlsched train-rebalancer: need 1 <= elites <= population, generations >= 1 and seeds >= 1", file=sys.stderr
        )
        return 2
    search(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0
