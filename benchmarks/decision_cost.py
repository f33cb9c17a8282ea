"""CPU time of one placement decision, FGD against a learned model, on the throughput benchmark's cluster.

    python benchmarks/decision_cost.py [--model policy/models/ppo-openb-default-es.npz] [--pods 3000]
                                       [--window 420] [--profile]

The cluster and the pods are the ones ``benchmarks/scheduler_throughput.py`` creates (its
``make_nodes`` and ``make_pods``, read by the extender's own parsers): 1,000 nodes of 96 cores and
384 GiB, 600 with 8 cards (V100M16, V100M32, A100 in turn), 150 with 4 T4 cards, 250 CPU-only; pods
drawn from the typical pods the extender ships, 4 GiB of memory per core. They are placed one after
the other, each among a random ``--window`` of its feasible nodes: kube-scheduler's adaptive
``percentageOfNodesToScore`` hands the extender about 420 of 1,000.

Per policy, the time of :func:`rlsched.policy.decision.decide` (feasibility, scoring, the choice, the
cards) per pod, p50 / p99 / mean, in one thread; the HTTP path and the cache are not in it.
``--profile`` adds the learned model's cProfile (by own time), to see where its extra time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.extender.objects import node_spec, pod_info
from rlsched.extender.settings import GpuConventions
from rlsched.policy.cluster import ClusterState, PodSpec
from rlsched.policy.decision import decide
from rlsched.policy.feasibility import feasible_nodes
from rlsched.policy.learned import SERVED_MODEL, load_learned_scorer
from rlsched.policy.scorers import make_scorer
from rlsched.policy.scorers.base import Scorer, TieBreak

REPO = Path(__file__).resolve().parents[1]


def _throughput_benchmark() -> Any:
    """``benchmarks/scheduler_throughput.py`` as a module: its cluster and pods are the ones measured here."""
    if "scheduler_throughput" in sys.modules:
        return sys.modules["scheduler_throughput"]
    spec = importlib.util.spec_from_file_location(
        "scheduler_throughput", REPO / "benchmarks" / "scheduler_throughput.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("scheduler_throughput", module)
    spec.loader.exec_module(module)
    return sys.modules["scheduler_throughput"]


def bench_cluster(n: int = 1000) -> ClusterState:
    """The throughput benchmark's kwok nodes (``make_nodes`` there), read as the extender reads them."""
    gpu = GpuConventions()
    return ClusterState([node_spec(node, gpu) for node in _throughput_benchmark().make_nodes(n)])


def bench_pods(n: int, seed: int) -> list[PodSpec]:
    """The throughput benchmark's pods (``make_pods``, ``pod_body`` there), read as the extender reads them."""
    bench, gpu = _throughput_benchmark(), GpuConventions()
    out = []
    for i, shape in enumerate(bench.make_pods(n, seed)):
        body = bench.pod_body(shape, "rl-scheduler", "decision-cost")
        body["metadata"].update(namespace="default", uid=f"uid-{i}", resourceVersion="1")
        spec = pod_info(body, gpu).spec
        assert spec is not None, shape
        out.append(spec)
    return out


def place_all(scorer: Scorer, pods: list[PodSpec], window: int, seed: int) -> np.ndarray:
    """Place ``pods`` in order on a fresh cluster; seconds per decision (pods that fit nowhere excluded)."""
    state = bench_cluster()
    tiebreak = TieBreak.seeded(state.num_nodes, seed)
    rng = np.random.default_rng(seed)
    times = []
    for spec in pods:
        req = state.request(spec)
        feasible = feasible_nodes(state, req)
        if len(feasible) == 0:
            continue
        offered = np.sort(rng.choice(feasible, size=min(len(feasible), window), replace=False))
        start = time.perf_counter()
        decision = decide(scorer, state, req, tiebreak, offered)
        times.append(time.perf_counter() - start)
        if decision is not None:
            state.place(req, decision.node, decision.cards)
    return np.asarray(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(SERVED_MODEL), help="the learned model (default: the one the chart serves)")
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--window", type=int, default=420, help="feasible nodes offered per pod")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="cProfile the learned model's run (own time, top 15)")
    args = ap.parse_args()
    learned = load_learned_scorer(args.model)
    pods = bench_pods(args.pods, args.seed)
    print(f"{'policy':<36} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'decisions':>10}")
    for name, scorer in (("fgd", make_scorer("fgd", learned.encoder.typical)), (learned.version, learned)):
        place_all(scorer, pods[:100], args.window, args.seed)  # warm-up: numba kernels, caches
        ms = place_all(scorer, pods, args.window, args.seed) * 1e3
        print(f"{name:<36} {np.percentile(ms, 50):8.3f} {np.percentile(ms, 99):8.3f} {ms.mean():8.3f} {len(ms):10d}")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(place_all, learned, pods, args.window, args.seed)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
