#!/usr/bin/env python3
"""What ``percentageOfNodesToScore`` below 100 costs in placement: kube-scheduler's search window, simulated.

kube-scheduler (``pkg/scheduler/schedule_one.go``, v1.37) stops filtering once it has found
``numFeasibleNodesToFind`` nodes that pass *its own* filter plugins, and hands only those to the
extender. Our extender then chooses among them. This script runs the FGD protocol (openb default,
seeds 42–51) with that window in front of the policy:

- ``numFeasibleNodesToFind(N)``: all nodes when N < 100; else ``N · p / 100`` with ``p`` the
  setting, or ``50 − N/125`` (at least 5) when it is 0 ("adaptive", kube-scheduler's default); at
  least 100;
- the search starts at ``nextStartNodeIndex`` and walks the node list in order (the list kube-scheduler
  reads from its informer: the nodes by name, which for openb is the CSV's order), keeping the nodes
  that pass kube-scheduler's filters, until it has that many; ``nextStartNodeIndex`` then advances by
  the nodes it processed (kube-scheduler filters in parallel, so in a real run a few more nodes are
  processed than here; that only shifts the rotation);
- kube-scheduler's filters see cpu, memory and the ``nvidia.com/gpu`` count of whole-card pods; a
  share of a card (``rlsched.io/gpu-milli``, ignored by NodeResourcesFit) and the GPU-model
  restriction (an annotation) are seen only by the extender, so a window can hold no node the policy
  finds feasible while other nodes would fit;
- such a pod is **retried** at once with the next window (in a real cluster it goes back to the queue
  with a back-off and other pods may be placed first); the count of these retries is reported. A pod
  fails only when no window has a node for it, exactly as at 100 %.

    python benchmarks/nodes_to_score.py --policy fgd,ppo:policy/models/ppo-openb-default.npz \\
        --percentages 100,50,0,20,10 --seeds 42-51 --jobs 2 --json docs/nodes-to-score.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from rlsched.policy.decision import decide
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.scorers import TieBreak, make_scorer
from rlsched.policy.simulator import ProtocolMeter, RequestCache
from rlsched.policy.trace import load_nodes, load_pods
from rlsched.policy.typical import typical_pods
from rlsched.policy.workload import DEFAULT_TARGET, inflate

MIN_FEASIBLE_NODES_TO_FIND = 100
"""kube-scheduler's ``minFeasibleNodesToFind``."""
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
"""kube-scheduler's ``minFeasibleNodesPercentageToFind``."""


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind`` (0 = adaptive, its default)."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    if percentage == 0:
        percentage = max(50 - num_all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(num_all_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


class SearchWindow:
    """kube-scheduler's rotating search for feasible nodes (its filters only), one cluster."""

    def __init__(self, state: ClusterState, percentage: int):
        self.state = state
        self.to_find = num_feasible_nodes_to_find(percentage, state.num_nodes)
        self.next_start = 0
        self.whole_cards = np.zeros(state.num_nodes, dtype=np.int64)
        """``nvidia.com/gpu`` requested on each node (whole-card pods only), as kube-scheduler counts it."""

    def passes_kube_filters(self, req: PodRequest) -> np.ndarray:
        s = self.state
        ok = (s.cpu_free >= req.cpu_milli) & (s.mem_free >= req.memory_mib)
        if req.is_gpu and not req.is_share:
            ok &= s.gpu_count - self.whole_cards >= req.num_gpu
        return ok

    def next_window(self, ok: np.ndarray) -> np.ndarray:
        """The nodes handed to the extender in one scheduling cycle; advances the start index."""
        n = self.state.num_nodes
        order = (self.next_start + np.arange(n)) % n
        passing = order[ok[order]]
        if len(passing) > self.to_find:
            window = passing[: self.to_find]
            processed = int(np.flatnonzero(order == window[-1])[0]) + 1
        else:
            window = passing
            processed = n
        self.next_start = (self.next_start + processed) % n
        return np.sort(window)

    def placed(self, req: PodRequest, node: int) -> None:
        if req.is_gpu and not req.is_share:
            self.whole_cards[node] += req.num_gpu


def run(job: tuple[str, str, str, int, int, float]) -> dict[str, Any]:
    """One policy, one seed, one setting: the FGD protocol behind kube-scheduler's window."""
    nodes_path, pods_path, policy, seed, percentage, target = job
    nodes: Sequence[NodeSpec] = load_nodes(nodes_path)
    pods: Sequence[PodSpec] = load_pods(pods_path)
    typical = typical_pods(pods)
    scorer = make_scorer(policy, typical)
    state = ClusterState(nodes)
    sequence = inflate(pods, state.gpu_milli_capacity, seed, target)
    requests = RequestCache(state)
    tiebreak = TieBreak.seeded(state.num_nodes, seed)
    meter = ProtocolMeter(state, typical)
    search = SearchWindow(state, percentage) if percentage < 100 else None
    retried = cycles = 0
    window_sizes: list[int] = []
    start = time.perf_counter()
    for pod in sequence:
        req = requests(pod)
        if search is None:
            decision = decide(scorer, state, req, tiebreak)
            cycles += 1
        else:
            ok = search.passes_kube_filters(req)
            seen = 0
            decision = None
            while seen < state.num_nodes:
                before = search.next_start
                window = search.next_window(ok)
                cycles += 1
                window_sizes.append(len(window))
                seen += (search.next_start - before) % state.num_nodes or state.num_nodes
                if len(window) == 0:
                    break
                decision = decide(scorer, state, req, tiebreak, window)
                if decision is not None:
                    break
                retried += 1
        if decision is not None:
            state.place(req, decision.node, decision.cards)
            if search is not None:
                search.placed(req, decision.node)
        meter.record(req, placed=decision is not None)
    result = meter.result(policy, seed, len(sequence), time.perf_counter() - start)
    return {
        "policy": policy,
        "seed": seed,
        "percentage": percentage,
        "nodes_to_find": search.to_find if search else state.num_nodes,
        "unallocated_gpu_pct_at_100": round(result.unallocated_at(100), 4),
        "failed_pods": result.failed_pods,
        "retried_cycles": retried,
        "cycles": cycles,
        "mean_window": round(statistics.fmean(window_sizes), 1) if window_sizes else None,
        "seconds": round(result.seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="../shared/data/openb/openb_node_list_gpu_node.csv")
    p.add_argument("--pods", default="../shared/data/openb/openb_pod_list_default.csv")
    p.add_argument("--policy", default="fgd,ppo:policy/models/ppo-openb-default.npz")
    p.add_argument("--percentages", default="100,50,0,20,10", help="percentageOfNodesToScore values (0: adaptive)")
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--target", type=float, default=DEFAULT_TARGET)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", help="write every run and the summary here")
    args = p.parse_args(argv)
    policies = [x for x in args.policy.split(",") if x]
    percentages = [int(x) for x in args.percentages.split(",")]
    seeds = parse_seeds(args.seeds)
    jobs = [(args.nodes, args.pods, pol, s, pct, args.target) for pol in policies for pct in percentages for s in seeds]
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(run, jobs, chunksize=1)
    baseline = {(r["policy"], r["seed"]): r["unallocated_gpu_pct_at_100"] for r in runs if r["percentage"] == 100}
    summary = []
    print(
        f"{'policy':<45} {'setting':>9} {'nodes':>6} {'unalloc@100 med':>16} {'Δ vs 100 med':>13} "
        f"{'seeds worse/better':>19} {'retried %':>10}"
    )
    for pol in policies:
        for pct in percentages:
            rows = [r for r in runs if r["policy"] == pol and r["percentage"] == pct]
            vals = [r["unallocated_gpu_pct_at_100"] for r in rows]
            deltas = [r["unallocated_gpu_pct_at_100"] - baseline[(pol, r["seed"])] for r in rows]
            worse = sum(d > 1e-9 for d in deltas)
            better = sum(d < -1e-9 for d in deltas)
            retried = 100 * sum(r["retried_cycles"] for r in rows) / max(1, sum(r["cycles"] for r in rows))
            row = {
                "policy": pol,
                "percentage": pct,
                "nodes_to_find": rows[0]["nodes_to_find"],
                "median": round(statistics.median(vals), 4),
                "median_delta_vs_100": round(statistics.median(deltas), 4) if deltas else None,
                "seeds_worse": worse,
                "seeds_better": better,
                "retried_cycles_pct": round(retried, 2),
            }
            summary.append(row)
            label = "adaptive" if pct == 0 else f"{pct} %"
            delta = f"{row['median_delta_vs_100']:+.3f}" if deltas else "-"
            print(
                f"{pol:<45} {label:>9} {row['nodes_to_find']:>6} {row['median']:>16.3f} {delta:>13} "
                f"{worse:>9}/{better:<9} {retried:>10.2f}"
            )
    print(f"({time.time() - t0:.0f} s, {len(runs)} runs)")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": "python benchmarks/nodes_to_score.py " + " ".join(argv or __import__("sys").argv[1:]),
                    "machine": f"{platform.machine()}, {multiprocessing.cpu_count()} cores",
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
