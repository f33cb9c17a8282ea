"""``rlsched evaluate``: arguments and output for :mod:`rlsched.policy.evaluate`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .workload import DEFAULT_TARGET

POLICY_HELP: dict[str, str] = {
    "random": "a random feasible node",
    "least-allocated": "Kubernetes NodeResourcesFit LeastAllocated (spread)",
    "most-allocated": "Kubernetes NodeResourcesFit MostAllocated (pack)",
    "balanced-allocation": "Kubernetes NodeResourcesBalancedAllocation",
    "dotprod": "DotProduct / Tetris: free vector least aligned with the request",
    "gpupacking": "GpuPacking: prefer partly used cards, then used nodes",
    "gpuclustering": "GpuClustering: keep GPU pods of one kind (share, k-card) together",
    "bestfit": "BestFit: least cpu and GPU left after placing",
    "fgd": "FGD (Weng et al., ATC'23): least GPU fragmentation increase",
    "fgd-cpu": "FGD plus the cards stranded by too little cpu per free card",
    "ppo:PATH": "a trained model file (.npz), as trained",
    "ppo-prior:PATH": "the same model with its network zeroed: its prior and decision rule alone (the ablation)",
}
"""One line per policy name, for ``--help`` (a unit test keeps it in step with the scorer registry;
kept here so that ``rlsched --help`` imports no numpy)."""


def _policy_epilog() -> str:
    width = max(len(name) for name in POLICY_HELP)
    return "policies:\n" + "\n".join(f"  {name:<{width}}  {text}" for name, text in POLICY_HELP.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _policy_epilog()
    parser.add_argument(
        "--nodes", required=True, help="node list: openb CSV (sn,cpu_milli,memory_mib,gpu,model) or generic YAML/JSON"
    )
    parser.add_argument("--pods", required=True, help="pod list: openb CSV or generic YAML/JSON")
    parser.add_argument(
        "--policy", required=True, help="comma-separated policies (listed below), e.g. fgd,ppo:model.npz"
    )
    parser.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 1,5,9 (default: %(default)s)")
    parser.add_argument(
        "--target",
        type=float,
        default=DEFAULT_TARGET,
        help="inflate arrivals to this fraction of cluster GPU capacity (default: %(default)s)",
    )
    parser.add_argument("--typical-from", help="pod list to take FGD's typical pods from (default: --pods)")
    parser.add_argument(
        "--json", metavar="PATH", help="write the evaluation as JSON to this file (default: OUT/NAME.json)"
    )
    parser.add_argument(
        "--out",
        default="runs/evaluate",
        help="folder for the PNG of allocation curves, and the JSON unless --json (default: %(default)s)",
    )
    parser.add_argument(
        "--name", default="evaluation", help="file stem for the outputs in --out (default: %(default)s)"
    )
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    parser.add_argument(
        "--mode",
        choices=("fgd", "events"),
        default="fgd",
        help="fgd: the FGD protocol (arrivals only, inflated); events: replay creation/deletion times",
    )
    parser.add_argument(
        "--retry-failed", action="store_true", help="events mode: queue pods that do not fit and retry after departures"
    )
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
        evaluation = evaluate(
            args.nodes,
            args.pods,
            policies,
            seeds,
            target=args.target,
            jobs=args.jobs or default_jobs(),
            typical_from=args.typical_from,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except (TraceError, UnknownPolicyError, ValueError) as exc:
        print(f"rlsched evaluate: {exc}", file=sys.stderr)
        return 2
    print(format_table(evaluation))
    paths = write_outputs(evaluation, args.out, args.name, json_path=args.json)
    print(f"\nwrote {paths['json']} and {paths['png']}")
    return 0


def _run_events(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> int:
    import json

    from .evaluate import evaluate_events, format_events_table

    results = evaluate_events(args.nodes, args.pods, policies, seeds, args.retry_failed, args.typical_from)
    print(format_events_table(results))
    path = Path(args.json) if args.json else Path(args.out) / f"{args.name}-events.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.summary() for r in results], indent=1))
    print(f"\nwrote {path}")
    return 0
