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
  with a back-off and other pods may be placed first). A pod fails only when no window has a node
  for it, exactly as at 100 %. Reported: the windows that missed for pods that were then placed
  elsewhere ("misses per placed pod": scheduling cycles the window costs); a pod that fits nowhere is
  unschedulable in one cycle at any setting, so its windows are not counted.

``--mode living`` runs the same window in the living cluster (docs/dynamic.md: arrivals and
departures at an offered load, here 90 %), where the cluster is never pushed to full; there
kube-scheduler's count of free whole cards is approximated by the cards with any room (a card
filled to the last milli by shares counts as taken, which kube-scheduler would count as free).

    python benchmarks/nodes_to_score.py --nodes "$OPENB"/openb_node_list_gpu_node.csv \\
        --pods "$OPENB"/openb_pod_list_default.csv --policy fgd,ppo:policy/models/ppo-openb-default.npz \\
        --percentages 100,50,0,20,10 --seeds 42-51 --jobs 2 --json docs/nodes-to-score.json
    python benchmarks/nodes_to_score.py --nodes "$OPENB"/openb_node_list_gpu_node.csv \\
        --pods "$OPENB"/openb_pod_list_default.csv --mode living \\
        --policy fgd,ppo:policy/models/ppo-openb-dynamic.npz \\
        --percentages 100,50,0,20,10 --seeds 42-51 --jobs 2 --json docs/nodes-to-score-living.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from rlsched.policy.decision import Decision, decide
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.evaluation import priced_nodes
from rlsched.policy.dynamic.objective import ObjectiveWeights
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.scorers import Scorer, TieBreak, make_scorer
from rlsched.policy.simulator import ProtocolMeter, RequestCache
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_default
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

    def __init__(self, state: ClusterState, percentage: int, track_whole_cards: bool = True):
        self.state = state
        self.to_find = num_feasible_nodes_to_find(percentage, state.num_nodes)
        self.next_start = 0
        self.track = track_whole_cards
        self.whole_cards = np.zeros(state.num_nodes, dtype=np.int64)
        """``nvidia.com/gpu`` requested on each node (whole-card pods only), as kube-scheduler counts it."""

    def passes_kube_filters(self, req: PodRequest) -> np.ndarray:
        s = self.state
        ok = (s.cpu_free >= req.cpu_milli) & (s.mem_free >= req.memory_mib)
        if req.is_gpu and not req.is_share:
            if self.track:
                ok &= s.gpu_count - self.whole_cards >= req.num_gpu
            else:  # living cluster (pods leave): cards with any room, which counts a card that shares
                ok &= (s.card_free > 0).sum(axis=1) >= req.num_gpu  # filled to the last milli as taken
        return ok

    def decide(self, scorer: Scorer, req: PodRequest, tiebreak: TieBreak) -> tuple[Decision | None, int, int]:
        """The pod's decision through successive windows (a miss is retried with the next window at
        once), with the cycles it took and how many of them missed."""
        n = self.state.num_nodes
        ok = self.passes_kube_filters(req)
        seen = cycles = missed = 0
        while seen < n:
            before = self.next_start
            window = self.next_window(ok)
            cycles += 1
            seen += (self.next_start - before) % n or n
            if len(window) == 0:
                break
            decision = decide(scorer, self.state, req, tiebreak, window)
            if decision is not None:
                return decision, cycles, missed
            missed += 1
        return None, cycles, missed

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
    retried = cycles = retried_placed = 0
    start = time.perf_counter()
    for pod in sequence:
        req = requests(pod)
        if search is None:
            decision = decide(scorer, state, req, tiebreak)
            cycles += 1
        else:
            decision, used, missed = search.decide(scorer, req, tiebreak)
            cycles += used
            retried += missed
            if decision is not None:
                retried_placed += missed
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
        "retried_cycles_of_placed_pods": retried_placed,
        "cycles": cycles,
        "pods": len(sequence),
        "placed": len(sequence) - result.failed_pods,
        "seconds": round(result.seconds, 2),
    }


def run_living(job: tuple[str, str, str, int, int, float, float]) -> dict[str, Any]:
    """One policy, one seed, one setting in the living cluster (docs/dynamic.md) behind the window."""
    nodes_path, pods_path, policy, seed, percentage, load, window_s = job
    pods = load_pods(pods_path)
    typical = typical_pods(pods)
    scorer = make_scorer(policy, typical)
    settings = DynamicSettings(arrivals=ArrivalSettings(load=load, window_s=window_s))
    cluster = LivingCluster(priced_nodes(load_nodes(nodes_path)), pods, seed, typical, settings, policy)
    search = SearchWindow(cluster.state, percentage, track_whole_cards=False) if percentage < 100 else None
    retried = cycles = pods = placed = retried_placed = 0
    start = time.perf_counter()
    for i in cluster.decisions():
        pods += 1
        req = cluster.request(i)
        if search is None:
            decision = decide(scorer, cluster.state, req, cluster.tiebreak)
            cycles += 1
        else:
            decision, used, missed = search.decide(scorer, req, cluster.tiebreak)
            cycles += used
            retried += missed
            if decision is not None:
                retried_placed += missed
        if decision is not None:
            placed += 1
            cluster.place(i, decision.node, decision.cards)
    result = cluster.finish(time.perf_counter() - start)
    return {
        "policy": policy,
        "seed": seed,
        "percentage": percentage,
        "nodes_to_find": search.to_find if search else cluster.state.num_nodes,
        "objective": round(result.objective(ObjectiveWeights()), 5),
        "stranded_gpu_pct": round(result.stranded_gpu_pct, 4),
        "sla_hot_node_pct": round(result.sla_hot_node_pct, 4),
        "wait_p99_s": round(result.wait_p99_s, 2),
        "retried_cycles": retried,
        "retried_cycles_of_placed_pods": retried_placed,
        "cycles": cycles,
        "pods": pods,
        "placed": placed,
        "seconds": round(time.perf_counter() - start, 2),
    }


METRICS = {"fgd": ("unallocated_gpu_pct_at_100", "unalloc@100", -1), "living": ("objective", "objective", 1)}
"""Mode → (the run's headline key, its column name, +1 if higher is better else −1)."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", help="node list (default: the openb node list in $RLSCHED_OPENB_DIR)")
    p.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    p.add_argument("--policy", default="fgd,ppo:policy/models/ppo-openb-default.npz")
    p.add_argument(
        "--percentages",
        default="100,50,0,20,10",
        help="percentageOfNodesToScore values (0: adaptive); 100 must be one: every setting is compared with it",
    )
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--mode", choices=sorted(METRICS), default="fgd", help="the FGD protocol, or the living cluster")
    p.add_argument("--target", type=float, default=DEFAULT_TARGET, help="fgd: inflation target")
    p.add_argument("--load", type=float, default=0.9, help="living: offered GPU load")
    p.add_argument("--window", type=float, default=3600.0, help="living: measured seconds")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", help="write every run and the summary here")
    args = p.parse_args(argv)
    try:
        percentages = [int(x) for x in args.percentages.split(",")]
    except ValueError:
        p.error(f"--percentages: comma-separated integers, got {args.percentages!r}")
    if 100 not in percentages:
        p.error(f"--percentages must include 100, the setting every other is compared with (got {args.percentages})")
    try:
        args.nodes = openb_default(args.nodes, "--nodes", OPENB_NODES)
        args.pods = openb_default(args.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        p.error(str(exc))
    policies = [x for x in args.policy.split(",") if x]
    seeds = parse_seeds(args.seeds)
    key, column, sign = METRICS[args.mode]
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        if args.mode == "fgd":
            fgd_jobs = [
                (args.nodes, args.pods, pol, s, pct, args.target)
                for pol in policies
                for pct in percentages
                for s in seeds
            ]
            runs = pool.map(run, fgd_jobs, chunksize=1)
        else:
            jobs = [
                (args.nodes, args.pods, pol, s, pct, args.load, args.window)
                for pol in policies
                for pct in percentages
                for s in seeds
            ]
            runs = pool.map(run_living, jobs, chunksize=1)
    baseline = {(r["policy"], r["seed"]): r[key] for r in runs if r["percentage"] == 100}
    summary = []
    print(
        f"{'policy':<45} {'setting':>9} {'nodes':>6} {column + ' med':>16} {'Δ vs 100 med':>13} "
        f"{'seeds worse/better':>19} {'misses/placed pod':>18}"
    )
    for pol in policies:
        for pct in percentages:
            rows = [r for r in runs if r["policy"] == pol and r["percentage"] == pct]
            deltas = [r[key] - baseline[(pol, r["seed"])] for r in rows]
            worse = sum(sign * d < -1e-9 for d in deltas)
            better = sum(sign * d > 1e-9 for d in deltas)
            # a window that held no usable node for a pod that did fit elsewhere: a scheduling cycle
            # lost to the window (a pod that fits nowhere is unschedulable at any setting)
            retries = sum(r["retried_cycles_of_placed_pods"] for r in rows) / max(1, sum(r["placed"] for r in rows))
            row = {
                "policy": pol,
                "percentage": pct,
                "nodes_to_find": rows[0]["nodes_to_find"],
                "median": round(statistics.median(r[key] for r in rows), 5),
                "median_delta_vs_100": round(statistics.median(deltas), 5),
                "seeds_worse": worse,
                "seeds_better": better,
                "misses_per_placed_pod": round(retries, 4),
            }
            summary.append(row)
            label = "adaptive" if pct == 0 else f"{pct} %"
            print(
                f"{pol:<45} {label:>9} {row['nodes_to_find']:>6} {row['median']:>16.4f} "
                f"{row['median_delta_vs_100']:>+13.4f} {worse:>9}/{better:<9} {retries:>18.4f}"
            )
    print(f"({time.time() - t0:.0f} s, {len(runs)} runs)")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": "python benchmarks/nodes_to_score.py " + " ".join(argv or sys.argv[1:]),
                    "machine": f"{platform.machine()}, {multiprocessing.cpu_count()} cores",
                    "mode": args.mode,
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
