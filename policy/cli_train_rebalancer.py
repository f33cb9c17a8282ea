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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dynamic.rebalance_search import SearchSettings


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


def settings_problem(cfg: SearchSettings) -> str | None:
    """What in ``cfg`` no search can use, without reading a file (:mod:`rlsched.policy.cli_search`)."""
    from .cli_search import common_problem

    problem = common_problem(cfg, {"--nodes": cfg.nodes, "--pods": cfg.pods, "--objective-from": cfg.objective_from})
    if problem:
        return problem
    if not (1 <= cfg.elites <= cfg.population) or cfg.generations < 1 or cfg.seeds_per_candidate < 1:
        return "need 1 <= elites <= population, generations >= 1 and seeds >= 1"
    if not 0 < cfg.load <= 10:
        return f"--load must be in (0, 10], got {cfg.load:g}"
    if cfg.migration_penalty < 0:
        return f"--migration-penalty must not be negative, got {cfg.migration_penalty:g}"
    return None


def run(ns: argparse.Namespace) -> int:
    from .cli_evaluate import os_error
    from .cli_search import check_readable
    from .dynamic.rebalance_search import SearchSettings, search

    values = {
        f.name: getattr(ns, f.name) for f in dataclasses.fields(SearchSettings) if getattr(ns, f.name, None) is not None
    }
    cfg = SearchSettings(**values)
    cfg.val_seeds = tuple(cfg.val_seeds)
    try:
        problem = settings_problem(cfg)
        if problem:
            raise ValueError(problem)
        check_readable(cfg)
        search(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as exc:  # TraceError, UnknownPolicyError, ModelFileError too
        print(f"rlsched train-rebalancer: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rlsched train-rebalancer: {os_error(exc)}", file=sys.stderr)
        return 2
    return 0
