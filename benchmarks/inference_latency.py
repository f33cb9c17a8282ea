"""p50/p99 latency of numpy inference for the learned policy on one core.

    python benchmarks/inference_latency.py [--model policy/models/ppo-openb-default-es.npz] [--nodes 100,1000,5000]

Two figures per cluster size K:

- **network**: ``PolicyNetwork.scores`` on K candidate rows (the worst case: every node in its own
  group — on openb ~600 feasible nodes make ~50 groups);
- **score()**: the whole ``LearnedScorer.score`` + ``choose`` for one pod on a K-node cluster whose
  nodes all differ (grouping cannot help): feature encoding, FGD and FGD-CPU kernels, network,
  decision rule. This is what the extender pays per pod.

Threads are pinned to one (OMP/OPENBLAS/MKL env before numpy loads, and CPU affinity to one core).
Target (issue #3): network p99 ≤ 1 ms at K = 1,000.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from rlsched.policy import ClusterState, NodeSpec, PodSpec, TieBreak, feasible_nodes  # noqa: E402
from rlsched.policy.learned import SERVED_MODEL, load_learned_scorer  # noqa: E402

KINDS = [
    (96_000, 393_216, 8, "G2"),
    (104_000, 524_288, 2, "T4"),
    (64_000, 262_144, 2, "P100"),
    (128_000, 786_432, 8, "G3"),
    (32_000, 131_072, 4, "V100M16"),
    (96_000, 786_432, 8, "V100M32"),
]


def distinct_cluster(k: int, seed: int = 0) -> ClusterState:
    """K nodes of openb's kinds, each with its own cpu usage and card fill (so no two group together)."""
    rng = np.random.default_rng(seed)
    nodes = [NodeSpec(f"n{i}", *KINDS[i % len(KINDS)]) for i in range(k)]
    state = ClusterState(nodes)
    for n in range(k):
        cpu = 10 * (n // len(KINDS)) + 10  # nodes of one kind differ in cpu use, so every key is unique
        cards = int(state.gpu_count[n])
        used = rng.integers(0, 3)
        for c in range(cards):
            if c < used:
                milli = int(rng.choice([250, 500, 810]))
                req = state.request(PodSpec(f"f{n}-{c}", 0, 0, 1, milli))
                state.place(req, n, (c,))
        state.place(state.request(PodSpec(f"c{n}", cpu, 1024)), n, ())
    return state


def percentiles(samples: list[float]) -> dict[str, float]:
    a = np.array(samples) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SERVED_MODEL))
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--repeat", type=int, default=2000, help="timed calls per size (network)")
    parser.add_argument("--repeat-score", type=int, default=300, help="timed calls per size (score)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    scorer = load_learned_scorer(args.model)
    net = scorer.network
    print(
        f"model {scorer.version} ({scorer.digest[:12]}), hidden {net.p['w1'].shape[1]}x{net.p['w2'].shape[1]}, "
        f"{platform.machine()}, numpy {np.__version__}, one thread"
    )
    print(f"{'K':>6} {'network p50':>12} {'p99':>8} {'score() p50':>12} {'p99':>8} {'groups':>7}")
    results = []
    pods = [
        PodSpec("share", 4000, 16_384, 1, 500),
        PodSpec("whole", 12_000, 49_152, 1, 1000),
        PodSpec("two", 16_000, 65_536, 2, 1000),
    ]
    for k in (int(x) for x in args.nodes.split(",")):
        state = distinct_cluster(k)
        tiebreak = TieBreak.seeded(k, 0)
        req = state.request(pods[0])
        nodes = feasible_nodes(state, req)
        cand = scorer.encoder.encode(state, req, nodes)
        rows = np.resize(cand.features, (k, cand.features.shape[1]))  # exactly K rows for the network figure
        prior = np.resize(cand.prior, k)
        for _ in range(50):
            net.scores(rows, prior)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            net.scores(rows, prior)
            times.append(time.perf_counter() - t)
        network = percentiles(times)
        score_times = []
        for i in range(args.repeat_score + 20):
            req = state.request(pods[i % len(pods)])
            nodes = feasible_nodes(state, req)
            state.node_version[nodes[i % len(nodes)]] += 1  # one node changed since the last pod, as in serving
            t = time.perf_counter()
            scores = scorer.score(state, req, nodes)
            scorer.choose(scores, nodes, tiebreak)
            if i >= 20:
                score_times.append(time.perf_counter() - t)
        score = percentiles(score_times)
        groups = scorer.last.num_groups
        print(
            f"{k:6d} {network['p50_ms']:10.3f}ms {network['p99_ms']:6.3f}ms {score['p50_ms']:10.3f}ms "
            f"{score['p99_ms']:6.3f}ms {groups:7d}"
        )
        results.append({"nodes": k, "network": network, "score": score, "groups": groups})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": scorer.version, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
