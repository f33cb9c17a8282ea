"""What ``rlsched train-delay`` and ``rlsched train-rebalancer`` check before their search starts.

Both searches fork worker processes and play living-cluster runs for minutes to hours; a setting or a
file they cannot use must be refused before that, in one line naming the flag or the file (exit 2),
not as a traceback from a worker or after the last generation when the result is written.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

from .cli_evaluate import MAX_WINDOW_S
from .trace import missing_input, output_problem

MAX_WORKERS = 256
"""``--workers`` at most this: each is a forked process holding the workload (a typo must not fork thousands)."""
MAX_SEED = 2**63 - 1
"""Seeds at most this: torch's ``manual_seed`` takes up to 2**64 - 1, numpy any non-negative integer."""
SEED_FIELDS = ("seed", "train_seed0", "val_seeds")
"""The settings that are workload or search seeds (numpy refuses a negative one, in a worker process)."""


def flag_of(name: str) -> str:
    """The command-line flag of a settings field (``window_s`` → ``--window-s``)."""
    return "--" + name.replace("_", "-")


def number_problems(cfg: Any) -> str | None:
    """The first numeric setting of the dataclass ``cfg`` that no search can use: a float that is NaN or
    infinite (NaN passes every range test written with ``<``), or a seed that is negative or too large."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        values = value if isinstance(value, tuple) else (value,)
        if hints[f.name] in (float, tuple[float, ...]) and not all(math.isfinite(v) for v in values):
            return f"{flag_of(f.name)} must be a finite number, got {' '.join(str(v) for v in values)}"
        if f.name in SEED_FIELDS:
            problem = seeds_problem(flag_of(f.name), values)
            if problem:
                return problem
    return None


def seeds_problem(flag: str, seeds: tuple[int, ...]) -> str | None:
    """Why ``seeds`` given with ``flag`` cannot seed a run (negative, or past :data:`MAX_SEED`), or None."""
    if all(0 <= s <= MAX_SEED for s in seeds):
        return None
    return f"{flag}: seeds are whole numbers from 0 to 2**63 - 1, got {' '.join(map(str, seeds))}"


def common_problem(cfg: Any, files: dict[str, str]) -> str | None:
    """Settings both searches share, checked without reading a file: the input ``files`` (flag → path) are
    there, numbers are finite, the pool and the window have sane sizes, the outputs can be written."""
    for flag, path in files.items():
        if path and not Path(path).is_file():
            return missing_input(path, flag)
    problem = number_problems(cfg)
    if problem:
        return problem
    if not 1 <= cfg.workers <= MAX_WORKERS:
        return f"--workers must be 1 to {MAX_WORKERS}, got {cfg.workers}"
    if not cfg.val_seeds:
        return "--val-seeds: give at least one validation seed"
    if not 0 < cfg.window_s <= MAX_WINDOW_S:
        return f"--window-s must be in (0, {MAX_WINDOW_S:.0f}] seconds (a week), got {cfg.window_s:g}"
    if not (cfg.init_std > 0 and 0 < cfg.smoothing <= 1 and cfg.min_std >= 0 and cfg.max_minutes >= 0):
        return "need --init-std > 0, 0 < --smoothing <= 1, --min-std >= 0 and --max-minutes >= 0"
    out = Path(cfg.out)
    for written in (out, out.with_suffix(".json"), out.with_name(out.stem + "-history.json")):
        problem = output_problem(written, "--out")
        if problem:
            return problem
    return None


def check_readable(cfg: Any) -> None:
    """Read what the search will read, the way it will (ValueError, naming the file, when one cannot
    serve): the node and pod lists, a workload the living cluster can replay (creation and deletion
    times on every pod, GPU nodes to offer load to), the placement policy, and the objective file."""
    from .dynamic.arrivals import ArrivalSettings, lifetimes
    from .dynamic.objective_spec import read_objective
    from .scorers import make_scorer
    from .trace import load_nodes, load_pods
    from .typical import typical_pods

    nodes = load_nodes(cfg.nodes)
    if not any(n.gpu_count for n in nodes):
        raise ValueError(f"{cfg.nodes}: no node has a GPU; the living cluster offers GPU load")
    pods = load_pods(cfg.pods)
    try:
        lifetimes(pods, ArrivalSettings(window_s=cfg.window_s))
    except ValueError as exc:
        raise ValueError(f"{cfg.pods}: {exc}") from None
    make_scorer(cfg.policy, typical_pods(pods))
    if cfg.objective_from:
        read_objective(cfg.objective_from)
