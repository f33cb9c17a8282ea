#!/usr/bin/env python3
"""Could placement that knows a pod's QoS class cut the SLA figures of the living cluster? A probe.

The placement policies of this project (FGD, the Trimaran scorers, the learned model) do not see a
pod's QoS class: ``PodSpec.qos`` is used for usage and SLA only, and the feature encoder has no column
for it. Yet the living cluster's second SLA figure, latency-sensitive pod-hours on hot nodes, depends
on where the latency-sensitive (LS) pods go. This script plays two fixed rules that use the class,
beside the baselines they are built from, on the same seeds:

- ``qos-split``: LS pods (``LS``, ``Guaranteed``) placed by LoadVariationRiskBalancing (spread by
  load), every other pod by FGD (packed);
- ``qos-apart``: the same, and the other pods are also kept off nodes that run an LS pod whenever
  some feasible node runs none (FGD chooses among those).

It is a probe, not a shipped policy: it asks whether the QoS class is worth a feature (and what a
learned policy could gain from one), as ``hold_rule.py`` asked for the delay action.

    python benchmarks/qos_placement_probe.py --nodes "$OPENB/openb_node_list_gpu_node.csv" \\
        --pods "$OPENB/openb_pod_list_default.csv" --load 0.9 --seeds 42-51 --json qos-probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.cluster import NodeSpec, PodRequest, PodSpec
from rlsched.policy.decision import decide
from rlsched.policy.dynamic.evaluation import priced_nodes
from rlsched.policy.dynamic.objective import DynamicResult
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster, run_dynamic
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.feasibility import feasible_nodes
from rlsched.policy.scorers import make_scorer
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_default
from rlsched.policy.typical import TypicalPods, typical_pods

BASELINES = ("fgd", "load-variation-risk-balancing")
RULES = ("qos-split", "qos-apart")
LVRB = "load-variation-risk-balancing"

_worker: tuple[Sequence[NodeSpec], Sequence[PodSpec], TypicalPods, DynamicSettings] | None = None


def _init(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], typical: TypicalPods, settings: DynamicSettings) -> None:
    global _worker
    _worker = (nodes, pods, typical, settings)


def apart_nodes(cluster: LivingCluster, req: PodRequest) -> np.ndarray | None:
    """The feasible nodes that run no latency-sensitive pod; None (no restriction) when there are none."""
    running = cluster.running()
    with_ls = running[cluster.latency_sensitive[running]]
    holds_ls = np.bincount(cluster.node_of[with_ls], minlength=cluster.state.num_nodes) > 0
    feasible = feasible_nodes(cluster.state, req)
    apart = feasible[~holds_ls[feasible]]
    return apart if apart.size else None


def play_rule(
    rule: str,
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    typical: TypicalPods,
    settings: DynamicSettings,
    seed: int,
) -> DynamicResult:
    """One living-cluster run of ``rule`` (module docstring); the loop is ``run_dynamic``'s."""
    packer, spreader = make_scorer("fgd", typical), make_scorer(LVRB, typical)
    cluster = LivingCluster(nodes, pods, seed, typical, settings, rule)
    for i in cluster.decisions():
        req = cluster.request(i)
        if cluster.latency_sensitive[i]:
            decision = decide(spreader, cluster.state, req, cluster.tiebreak)
        elif rule == "qos-apart":
            decision = decide(packer, cluster.state, req, cluster.tiebreak, nodes=apart_nodes(cluster, req))
        else:
            decision = decide(packer, cluster.state, req, cluster.tiebreak)
        if decision is not None:
            cluster.place(i, decision.node, decision.cards)
    return cluster.finish(0.0)


def _one(task: tuple[str, int]) -> DynamicResult:
    assert _worker is not None
    nodes, pods, typical, settings = _worker
    policy, seed = task
    if policy in RULES:
        return play_rule(policy, nodes, pods, typical, settings, seed)
    return run_dynamic(nodes, pods, make_scorer(policy, typical), seed, typical, settings, policy)


def _row(r: DynamicResult) -> dict[str, Any]:
    return {
        "policy": r.policy,
        "seed": r.seed,
        "strandedPct": round(r.stranded_gpu_pct, 4),
        "hotNodePct": round(r.sla_hot_node_pct, 4),
        "lsPodHoursOnHot": round(r.sla_ls_pod_seconds / 3600, 2),
        "costPct": round(r.cost_pct, 3),
        "waitP99S": round(r.wait_p99_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", help="node list (default: the openb node list in $RLSCHED_OPENB_DIR)")
    ap.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--load", type=float, default=0.9, help="offered GPU load (docs/dynamic.md)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args(argv)
    try:
        args.nodes = openb_default(args.nodes, "--nodes", OPENB_NODES)
        args.pods = openb_default(args.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        ap.error(str(exc))
    base = DynamicSettings()
    settings = dataclasses.replace(base, arrivals=dataclasses.replace(base.arrivals, load=args.load))
    try:
        nodes, pods = priced_nodes(load_nodes(args.nodes)), load_pods(args.pods)
    except (ValueError, OSError) as exc:  # a TraceError names the file and what is wrong with it
        ap.error(str(exc))
    typical = typical_pods(pods)
    seeds = parse_seeds(args.seeds)
    tasks = [(p, s) for p in (*BASELINES, *RULES) for s in seeds]
    with ProcessPoolExecutor(args.jobs, initializer=_init, initargs=(nodes, pods, typical, settings)) as pool:
        rows = [_row(r) for r in pool.map(_one, tasks)]
    by = {(r["policy"], r["seed"]): r for r in rows}
    keys = ("strandedPct", "hotNodePct", "lsPodHoursOnHot", "costPct", "waitP99S")
    print(f"load {args.load:g}, seeds {args.seeds}: medians; per seed against FGD and LVRB, lower is better")
    print(
        "| policy | stranded % | hot node % | LS pod-h on hot | cost % | wait p99 s "
        "| LS pod-h: seeds better than FGD / LVRB (median difference) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for policy in (*BASELINES, *RULES):
        med = {k: statistics.median(by[policy, s][k] for s in seeds) for k in keys}
        wins = []
        for other in BASELINES:
            if other == policy:
                wins.append("–")
                continue
            diff = [by[policy, s]["lsPodHoursOnHot"] - by[other, s]["lsPodHoursOnHot"] for s in seeds]
            wins.append(f"{sum(d < 0 for d in diff)}/{len(seeds)} ({statistics.median(diff):+.1f})")
        print(
            f"| {policy} | {med['strandedPct']:.2f} | {med['hotNodePct']:.2f} | {med['lsPodHoursOnHot']:.1f} | "
            f"{med['costPct']:.2f} | {med['waitP99S']:.0f} | {' / '.join(wins)} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"load": args.load, "seeds": seeds, "runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
