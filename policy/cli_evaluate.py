"""``rlsched evaluate``: arguments and output for :mod:`rlsched.policy.evaluate`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .workload import DEFAULT_TARGET


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", required=True, help="node list: openb CSV (sn,cpu_milli,memory_mib,gpu,model) or generic YAML/JSON")
    parser.add_argument("--pods", required=True, help="pod list: openb CSV or generic YAML/JSON")
    parser.add_argument("--policy", required=True, help="comma-separated policies: random, least-allocated, most-allocated, "
                        "balanced-allocation, dotprod, gpupacking, gpuclustering, bestfit, fgd, ppo:PATH")
    parser.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 1,5,9 (default: %(default)s)")
    parser.add_argument("--target", type=float, default=DEFAULT_TARGET,
                        help="inflate arrivals to this fraction of cluster GPU capacity (default: %(default)s)")
    parser.add_argument("--typical-from", help="pod list to take FGD's typical pods from (default: --pods)")
    parser.add_argument("--out", default="runs/evaluate", help="folder for evaluation.json and evaluation.png (default: %(default)s)")
    parser.add_argument("--name", default="evaluation", help="file stem for the outputs (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    parser.add_argument("--mode", choices=("fgd", "events"), default="fgd",
                        help="fgd: the FGD protocol (arrivals only, inflated); events: replay creation/deletion times")
    parser.add_argument("--retry-failed", action="store_true", help="events mode: queue pods that do not fit and retry after departures")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from .evaluate import default_jobs, evaluate, format_table, parse_policies, parse_seeds, write_outputs
    from .scorers import UnknownPolicyError
    from .trace import TraceError

    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policy)
        if args.target <= 0:
            raise ValueError(f"--target must be positive, got {args.target}")
        for flag, path in (("--nodes", args.nodes), ("--pods", args.pods), ("--typical-from", args.typical_from)):
            if path and not Path(path).is_file():
                raise ValueError(f"{flag}: no such file: {path}")
        if args.mode == "events":
            return _run_events(args, policies, seeds)
        evaluation = evaluate(args.nodes, args.pods, policies, seeds, target=args.target,
                              jobs=args.jobs or default_jobs(), typical_from=args.typical_from,
                              progress=not args.no_progress and sys.stderr.isatty())
    except (TraceError, UnknownPolicyError, ValueError) as exc:
        print(f"rlsched evaluate: {exc}", file=sys.stderr)
        return 2
    print(format_table(evaluation))
    paths = write_outputs(evaluation, args.out, args.name)
    print(f"\nwrote {paths['json']} and {paths['png']}")
    return 0


def _run_events(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> int:
    import json

    from .evaluate import evaluate_events, format_events_table

    results = evaluate_events(args.nodes, args.pods, policies, seeds, args.retry_failed, args.typical_from)
    print(format_events_table(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}-events.json"
    path.write_text(json.dumps([r.summary() for r in results], indent=1))
    print(f"\nwrote {path}")
    return 0
