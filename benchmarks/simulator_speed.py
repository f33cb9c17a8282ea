"""Wall time of one FGD-protocol run (default trace, one seed, ~10,800 pods on 1,213 nodes).

    python benchmarks/simulator_speed.py --data "$OPENB" [--repeat 5]

Targets (issue #2): ≤ 1 s with BestFit and ≤ 5 s with FGD on the 2-core development machine. The
first run of each policy warms numba's compiled kernels (cached on disk) and is reported separately.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rlsched.policy.cluster import ClusterState
from rlsched.policy.scorers import make_scorer
from rlsched.policy.simulator import run_sequence
from rlsched.policy.trace import load_nodes, load_pods, openb_default
from rlsched.policy.typical import typical_pods
from rlsched.policy.workload import inflate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder with the openb CSV files (default: $RLSCHED_OPENB_DIR)")
    parser.add_argument("--trace", default="default")
    parser.add_argument(
        "--policy",
        default="bestfit,fgd,random,dotprod,gpupacking,gpuclustering,least-allocated,most-allocated,balanced-allocation",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    try:
        data = Path(openb_default(args.data, "--data"))
    except ValueError as exc:
        parser.error(str(exc))
    nodes = load_nodes(data / "openb_node_list_gpu_node.csv")
    pods = load_pods(data / f"openb_pod_list_{args.trace}.csv")
    typical = typical_pods(pods)
    sequence = inflate(pods, ClusterState(nodes).gpu_milli_capacity, args.seed)
    print(f"trace {args.trace}: {len(sequence)} pods on {len(nodes)} nodes, seed {args.seed}")
    print(f"{'policy':22s} {'first run s':>11s} {'median s':>9s} {'min s':>7s} {'pods/s':>8s}")
    for name in args.policy.split(","):
        times = []
        for _ in range(args.repeat + 1):
            scorer = make_scorer(name, typical)
            t0 = time.perf_counter()
            run_sequence(nodes, sequence, scorer, args.seed, typical)
            times.append(time.perf_counter() - t0)
        first, rest = times[0], times[1:]
        med = statistics.median(rest)
        print(f"{name:22s} {first:11.2f} {med:9.2f} {min(rest):7.2f} {len(sequence) / med:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
