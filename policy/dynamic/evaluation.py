"""``rlsched evaluate --mode dynamic``: every policy on every seed in the living-cluster mode."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from ..cluster import NodeSpec, PodSpec
from ..scorers import make_scorer
from ..trace import load_nodes, load_pods
from ..typical import TypicalPods, typical_pods
from .objective import DynamicResult, ObjectiveWeights
from .prices import PriceTable, with_prices
from .rebalancing import check_rebalancer, rebalancer_label, run_rebalanced
from .simulator import DynamicSettings, run_dynamic

_worker: tuple[Sequence[NodeSpec], Sequence[PodSpec], TypicalPods, DynamicSettings] | None = None


def _init(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], typical: TypicalPods, settings: DynamicSettings) -> None:
    global _worker
    _worker = (nodes, pods, typical, settings)


def _one(task: tuple[str, int, str]) -> DynamicResult:
    assert _worker is not None
    nodes, pods, typical, settings = _worker
    policy, seed, rebalancer = task
    if rebalancer != "none":
        scorer, name = make_scorer(policy, typical), f"{policy}+{rebalancer_label(rebalancer)}"
        return run_rebalanced(nodes, pods, scorer, seed, typical, rebalancer, settings, policy_name=name)[0]
    return run_dynamic(nodes, pods, make_scorer(policy, typical), seed, typical, settings, policy)


def priced_nodes(nodes: Sequence[NodeSpec], table: PriceTable | None = None) -> list[NodeSpec]:
    """The nodes with prices: their own when any node has one, else the published price table's."""
    if any(n.price != 1.0 for n in nodes):
        return list(nodes)
    return with_prices(nodes, table or PriceTable())


def evaluate_dynamic(
    nodes_path: str | Path,
    pods_path: str | Path,
    policies: Sequence[str],
    seeds: Iterable[int],
    settings: DynamicSettings | None = None,
    jobs: int = 1,
    typical_from: str | Path | None = None,
    rebalancers: Sequence[str] = ("none",),
) -> list[DynamicResult]:
    """Run every policy on every seed, under each rebalancer (:mod:`.rebalancing`; ``none`` runs the
    plain simulator); results in (policy, rebalancer, seed) order, a rebalanced row named ``policy+rebalancer``."""
    settings = settings or DynamicSettings()
    nodes = priced_nodes(load_nodes(nodes_path))
    pods = load_pods(pods_path)
    typical = typical_pods(load_pods(typical_from) if typical_from else pods)
    for policy in policies:
        make_scorer(policy, typical)  # refuse a bad name before any run starts
    for rebalancer in rebalancers:
        check_rebalancer(rebalancer)
    tasks = [(policy, seed, reb) for policy in policies for reb in rebalancers for seed in seeds]
    if jobs <= 1:
        _init(nodes, pods, typical, settings)
        return [_one(task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs, initializer=_init, initargs=(nodes, pods, typical, settings)) as pool:
        return list(pool.map(_one, tasks))


COLUMNS = (
    ("alloc GPU %", "mean_allocated_gpu_pct", ".2f"),
    ("stranded %", "stranded_gpu_pct", ".2f"),
    ("wait p50 s", "wait_p50_s", ".1f"),
    ("wait p99 s", "wait_p99_s", ".0f"),
    ("hot node %", "sla_hot_node_pct", ".3f"),
    ("LS pod-h hot", "sla_ls_pod_seconds", ".1f"),
    ("cost %", "cost_pct", ".2f"),
    ("rejected", "rejected", ".0f"),
    ("migr/100 pod-h", "migrations_per_100_pod_hours", ".2f"),
)


def format_dynamic_table(results: Sequence[DynamicResult], weights: ObjectiveWeights | None = None) -> str:
    """Medians over seeds per policy, with the objective and its per-seed wins against the first policy."""
    weights = weights or ObjectiveWeights()
    header = ("policy", "runs", *(c[0] for c in COLUMNS), "objective", "wins vs first")
    rows = [header]
    policies = list(dict.fromkeys(r.policy for r in results))
    first = {r.seed: r.objective(weights) for r in results if r.policy == policies[0]}
    for policy in policies:
        rs = [r for r in results if r.policy == policy]
        cells = [policy, str(len(rs))]
        for _, attr, fmt in COLUMNS:
            values = [getattr(r, attr) for r in rs]
            if attr == "sla_ls_pod_seconds":
                values = [v / 3600 for v in values]
            cells.append(format(float(np.median(values)), fmt))
        objs = {r.seed: r.objective(weights) for r in rs}
        cells.append(f"{np.median(list(objs.values())):.4f}")
        paired = [(objs[s], first[s]) for s in objs if s in first]
        wins = sum(a > b for a, b in paired)
        losses = sum(a < b for a, b in paired)
        cells.append("-" if policy == policies[0] else f"{wins}/{losses}/{len(paired) - wins - losses}")
        rows.append(tuple(cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
