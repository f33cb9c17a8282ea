#!/usr/bin/env python3
"""Can holding a pod back pay in the living cluster? A fixed hold rule on top of a placement policy.

The rule: a GPU pod asking for at least ``MIN_GPU_MILLI`` in all (``2000``: two whole cards) is held
back for ``HOLD_S`` seconds when it comes up for a decision (at most three times, as for any delay
in the living cluster); everything else is the policy's own placement. It lets smaller pods take the
room first: shortest-job-first by GPU size, which cuts the mean wait when pods queue. Each rule is
played on the same seeds as the policy without it (``none``) and compared per seed on the product's
objective (docs/dynamic.md).

This is a probe, not a policy to ship: it asks whether the delay action has anything to gain at a
given load, and for which placement policy (docs/dynamic.md, "A learned delay"). The rule
``head:MODEL.npz`` plays instead the delay head that ``rlsched train-delay`` learned and stored in a
model file, on top of the same policy, so the learned head, the fixed rule and no hold are compared
on the same seeds.

    python benchmarks/hold_rule.py --nodes "$OPENB/openb_node_list_gpu_node.csv" \\
        --pods "$OPENB/openb_pod_list_default.csv" --policy fgd --load 1.0 --rules none,2000/60 --seeds 42-51
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from rlsched.policy.delay_head import DelayHead
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.delay_search import WithDelayHead
from rlsched.policy.dynamic.evaluation import priced_nodes
from rlsched.policy.dynamic.objective import DynamicResult, ObjectiveWeights
from rlsched.policy.dynamic.simulator import DynamicSettings, run_dynamic
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.export import read_model
from rlsched.policy.scorers import NodeScores, Scorer, make_scorer
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_default
from rlsched.policy.typical import TypicalPods, typical_pods


class HoldLargePods(WithDelayHead):
    """``base``'s placement, plus a delay verdict for GPU pods asking for at least ``min_gpu_milli``
    (a scorer with a ``verdict``, as the living cluster calls it)."""

    def __init__(self, base: Scorer, min_gpu_milli: float, hold_s: float):
        super().__init__(base, None)
        self.min_gpu_milli, self.hold_s = min_gpu_milli, hold_s
        self.name = f"{base.name}+hold"

    def verdict(
        self, state: ClusterState, req: PodRequest, nodes: np.ndarray, scores: NodeScores | None
    ) -> tuple[str, str, float] | None:
        asked = req.num_gpu * req.gpu_milli if req.is_gpu else 0
        if asked < self.min_gpu_milli or len(nodes) == 0:
            return None
        return ("delay", f"asks for {asked} GPU milli: smaller pods first", self.hold_s)


def parse_rule(text: str) -> tuple[float, float] | str | None:
    """``none`` → None; ``MIN_GPU_MILLI/HOLD_S`` (e.g. ``2000/60``) → (2000.0, 60.0); ``head:FILE`` → the
    model file whose learned delay head (``rlsched train-delay``) is played on top of the policy."""
    if text == "none":
        return None
    if text.startswith("head:"):
        path = text[len("head:") :]
        if not Path(path).is_file():
            raise ValueError(f"rule {text!r}: no such model file")
        return path
    size, _, hold = text.partition("/")
    rule = (float(size), float(hold or 60))
    if rule[0] < 0 or rule[1] <= 0:
        raise ValueError(f"rule {text!r}: need MIN_GPU_MILLI >= 0 and HOLD_S > 0")
    return rule


def learned_head(path: str) -> DelayHead:
    """The delay head stored in a model file (refused when the file has none)."""
    arrays, manifest, _ = read_model(path)
    head = DelayHead.from_model(arrays, manifest)
    if head is None:
        raise ValueError(f"model file {path} has no delay head (rlsched train-delay adds one)")
    return head


_worker: tuple[list[NodeSpec], list[PodSpec], TypicalPods, DynamicSettings, str] | None = None


def _init(
    nodes: list[NodeSpec], pods: list[PodSpec], typical: TypicalPods, settings: DynamicSettings, policy: str
) -> None:
    global _worker
    _worker = (nodes, pods, typical, settings, policy)


def _run(task: tuple[str, int]) -> tuple[str, int, DynamicResult]:
    assert _worker is not None
    nodes, pods, typical, settings, policy = _worker
    rule_text, seed = task
    rule = parse_rule(rule_text)
    base = make_scorer(policy, typical)
    scorer: Any = base
    if isinstance(rule, str):
        scorer = WithDelayHead(base, learned_head(rule))
    elif rule is not None:
        scorer = HoldLargePods(base, *rule)
    return rule_text, seed, run_dynamic(nodes, pods, scorer, seed, typical, settings, policy)


def compare(results: Sequence[tuple[str, int, DynamicResult]], weights: ObjectiveWeights) -> list[dict[str, Any]]:
    """Per rule: medians over seeds, and against ``none`` on the same seed, the seeds where the
    objective is better / worse and the median difference (higher objective is better)."""
    by_rule: dict[str, dict[int, DynamicResult]] = {}
    for rule, seed, result in results:
        by_rule.setdefault(rule, {})[seed] = result
    base = by_rule.get("none", {})
    rows = []
    for rule, runs in by_rule.items():
        seeds = sorted(runs)
        objective = {s: runs[s].objective(weights) for s in seeds}
        diff = [objective[s] - base[s].objective(weights) for s in seeds if s in base]
        rows.append(
            {
                "rule": rule,
                "seeds": seeds,
                "objective": round(statistics.median(objective.values()), 4),
                "objectiveBySeed": [round(objective[s], 4) for s in seeds],
                "vsNone": None
                if rule == "none" or not diff
                else {
                    "better": sum(d > 0 for d in diff),
                    "worse": sum(d < 0 for d in diff),
                    "medianDifference": round(statistics.median(diff), 4),
                },
                **{
                    key: round(statistics.median(getattr(runs[s], key) for s in seeds), 3)
                    for key in ("stranded_gpu_pct", "wait_mean_s", "wait_p99_s", "sla_hot_node_pct", "holds")
                },
            }
        )
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| hold pods asking ≥ milli / for s | objective | vs none: better / worse (median difference) "
        "| stranded % | wait mean s | wait p99 s | hot node % | holds |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vs = r["vsNone"]
        versus = "–" if vs is None else f"{vs['better']} / {vs['worse']} ({vs['medianDifference']:+.4f})"
        lines.append(
            f"| {r['rule']} | {r['objective']:.4f} | {versus} | {r['stranded_gpu_pct']:.2f} | {r['wait_mean_s']:.1f} | "
            f"{r['wait_p99_s']:.0f} | {r['sla_hot_node_pct']:.2f} | {r['holds']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--nodes",
        help="node list, openb CSV or the generic format (default: the openb node list in $RLSCHED_OPENB_DIR)",
    )
    p.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    p.add_argument("--policy", default="fgd", help="the placement policy under the rule, e.g. fgd or ppo:MODEL.npz")
    p.add_argument("--load", type=float, default=1.0, help="offered GPU load of the living cluster")
    p.add_argument("--rules", default="none,2000/60", help="comma list: none, MIN_GPU_MILLI/HOLD_S, head:MODEL.npz ...")
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", type=Path, help="write the rows here")
    a = p.parse_args(argv)
    try:
        a.nodes = openb_default(a.nodes, "--nodes", OPENB_NODES)
        a.pods = openb_default(a.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        p.error(str(exc))
    rules = a.rules.split(",")
    for rule in rules:
        parsed = parse_rule(rule)
        if isinstance(parsed, str):
            learned_head(parsed)  # refuse a file without a head before any run
    if "none" not in rules:
        rules.insert(0, "none")
    try:
        pods, nodes = load_pods(a.pods), load_nodes(a.nodes)
    except (ValueError, OSError) as exc:  # a TraceError names the file and what is wrong with it
        p.error(str(exc))
    setup = (
        priced_nodes(nodes),
        pods,
        typical_pods(pods),
        DynamicSettings(arrivals=ArrivalSettings(load=a.load)),
        a.policy,
    )
    make_scorer(a.policy, setup[2])  # refuse a bad policy name before any run
    tasks = [(rule, seed) for rule in rules for seed in parse_seeds(a.seeds)]
    with ProcessPoolExecutor(max_workers=max(1, a.jobs), initializer=_init, initargs=setup) as pool:
        results = list(pool.map(_run, tasks))
    rows = compare(results, ObjectiveWeights())
    print(f"policy {a.policy}, load {a.load}, seeds {a.seeds}")
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps({"policy": a.policy, "load": a.load, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
