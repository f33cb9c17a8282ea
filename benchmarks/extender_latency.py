"""Extender latency as kube-scheduler sees it: a real server on loopback, one request in flight with
keep-alive, full v1.Node / v1.Pod JSON (≈4.9 KB / 4.0 KB each).

    python benchmarks/extender_latency.py [--nodes 100,1000,5000] [--policies fgd,mlp]
                                          [--requests 300] [--full-requests 30] [--json out.json]

For each cluster size and policy a server process is started (``serve()`` with an in-memory fake API
holding the nodes and ~45 % of the GPU capacity in bound pods), then:

- cache-capable mode: ``filter`` with ``NodeNames`` (every node: kube-scheduler with
  ``percentageOfNodesToScore: 100``, the worst case) then ``prioritize`` for the same pod, for
  ``--requests`` pods cycling through the openb typical shapes (share, 1/2/4/8 cards, CPU-only),
  each with a fresh UID;
- full-node mode: the same with ``Nodes.items`` (the v1.Node objects, echoed back by filter);
- throughput: 4 concurrent clients in cache-capable mode (filter + prioritize per pod).

Policies: ``fgd`` — the fallback the extender serves without a model; ``ppo`` — the model the chart
serves (``rlsched.policy.learned.SERVED_MODEL``) or ``--model PATH``; ``ppo-random`` — the real learned
scorer (feature encoder + network of rlsched.policy) with random weights, i.e. the trained model's
cost before one is trained; ``mlp`` — a bare numpy MLP 16→64→64→1 over per-node features (the
floor: what a learned scorer costs at the least). The default is ``fgd,ppo`` when the bundled model is
there (or ``--model`` is given), else ``fgd,ppo-random``.
Client-side time (send + read the answer) is reported; the machine's load average is printed with
the results because the development machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHAPES = [  # (gpus, gpu_milli, cpu, memory): the openb typical mix, roughly
    (0, 810, "3152m", "12Gi"),
    (1, 0, "11300m", "40Gi"),
    (0, 500, "4", "16Gi"),
    (2, 0, "16", "64Gi"),
    (0, 250, "2", "8Gi"),
    (4, 0, "32", "128Gi"),
    (0, 0, "8", "32Gi"),
    (8, 0, "64", "256Gi"),
    (1, 0, "6", "24Gi"),
]
MODELS = ("V100M16", "V100M32", "T4", "A100")


def cluster(n: int, seed: int = 7):
    """``n`` nodes (≈75 % GPU nodes with 2/4/8 cards) and bound pods filling ≈45 % of the cards."""
    from rlsched.extender.objects import assignment_annotations
    from rlsched.extender.settings import GpuConventions
    from rlsched.extender.testing import make_node, make_pod

    rng = np.random.default_rng(seed)
    gpu = GpuConventions()
    nodes, pods = [], []
    for i in range(n):
        if rng.random() < 0.25:
            nodes.append(make_node(f"cpu-{i:05d}", cpu="64", memory="256Gi"))
            continue
        cards = int(rng.choice([2, 4, 8], p=[0.2, 0.3, 0.5]))
        model = MODELS[int(rng.integers(len(MODELS)))]
        name = f"gpu-{i:05d}"
        nodes.append(make_node(name, cpu="96", memory="384Gi", gpus=cards, model=model))
        for c in range(cards):
            r = rng.random()
            if r < 0.35:
                pods.append(
                    make_pod(
                        f"w-{i}-{c}",
                        cpu="8",
                        memory="32Gi",
                        gpus=1,
                        node=name,
                        uid=f"w-{i}-{c}",
                        annotations=assignment_annotations(gpu, name, (c,), 1000),
                    )
                )
            elif r < 0.55:
                milli = int(rng.choice([250, 500, 750]))
                pods.append(
                    make_pod(
                        f"s-{i}-{c}",
                        cpu="2",
                        memory="8Gi",
                        gpu_milli=milli,
                        node=name,
                        uid=f"s-{i}-{c}",
                        annotations=assignment_annotations(gpu, name, (c,), milli),
                    )
                )
    return nodes, pods


class BenchMLP:
    """Stand-in for the exported PPO policy: a numpy MLP 16→64→64→1 over per-node features."""

    name = "ppo"
    version = "bench-mlp"
    digest = "0" * 64

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.w1 = rng.normal(0, 0.3, (16, 64)).astype(np.float32)
        self.w2 = rng.normal(0, 0.2, (64, 64)).astype(np.float32)
        self.w3 = rng.normal(0, 0.2, (64, 1)).astype(np.float32)

    def score(self, state, req, nodes):
        from rlsched.policy.scorers import NodeScores

        k = len(nodes)
        x = np.empty((k, 16), dtype=np.float32)
        cpu_cap = np.maximum(state.cpu_cap[nodes], 1)
        mem_cap = np.maximum(state.mem_cap[nodes], 1)
        cards = np.maximum(state.gpu_count[nodes], 1)
        x[:, 0] = state.cpu_free[nodes] / cpu_cap
        x[:, 1] = state.mem_free[nodes] / mem_cap
        x[:, 2] = state.full_free[nodes] / cards
        x[:, 3] = state.max_card_free[nodes] / 1000
        x[:, 4] = state.gpu_count[nodes] / 8
        x[:, 5] = state.card_free[nodes].sum(axis=1) / (cards * 1000)
        x[:, 6:10] = np.nan_to_num(state.load[nodes], nan=0.0)
        x[:, 10] = req.cpu_milli / cpu_cap
        x[:, 11] = req.memory_mib / mem_cap
        x[:, 12] = req.num_gpu / 8
        x[:, 13] = req.gpu_milli / 1000
        x[:, 14] = state.price[nodes]
        x[:, 15] = 1.0
        h = np.maximum(x @ self.w1, 0)
        h = np.maximum(h @ self.w2, 0)
        return NodeScores((h @ self.w3)[:, 0].astype(np.float64))

    def choose(self, scores, nodes, tiebreak):
        return tiebreak.argmax(scores.values, nodes)

    def cards(self, state, req, node, position, scores, tiebreak):
        from rlsched.policy.cards import default_cards

        return default_cards(state, req, node)


# -- the server process ----------------------------------------------------------------------------


def serve_main(args: argparse.Namespace) -> int:
    import uvloop

    from rlsched.extender.logs import setup_logging
    from rlsched.extender.server import limit_native_threads, serve
    from rlsched.extender.settings import ExtenderSettings, PolicySettings, ServerSettings
    from rlsched.extender.testing import FakeKubeApi

    setup_logging("WARNING", "text")
    limit_native_threads()
    nodes, pods = cluster(args.serve_nodes)
    policy = PolicySettings(top_k=0, deadline_ms=200)
    loader = None
    if args.policy == "mlp":
        marker = Path(os.environ.get("TMPDIR", "/tmp")) / "rlsched-bench-model"
        marker.write_text("bench")
        policy = PolicySettings(top_k=0, deadline_ms=200, model_path=str(marker))
        loader = lambda path, typical: BenchMLP()  # noqa: E731
    elif args.policy == "ppo":
        policy = PolicySettings(top_k=0, deadline_ms=200, model_path=args.model or str(bundled_model()))
    elif args.policy == "ppo-random":
        path = random_model(Path(os.environ.get("TMPDIR", "/tmp")) / "rlsched-bench-random.npz")
        policy = PolicySettings(top_k=0, deadline_ms=200, model_path=str(path))
    settings = ExtenderSettings(
        server=ServerSettings(port=args.port, status_port=0, status_host="127.0.0.1", max_body_bytes=256 * 1024 * 1024),
        policy=policy,
    )

    def ready(service):
        print(f"READY {service.addresses['verbs'][1]} pods={len(service.cache.pods)}", flush=True)

    kwargs = {"model_loader": loader} if loader else {}
    return uvloop.run(serve(settings, api=FakeKubeApi(nodes, pods), ready=ready, **kwargs))


# -- the client ------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) * 1e3


async def run_client(port: int, nodes: list[dict], requests: int, full_requests: int) -> dict:
    import aiohttp
    import orjson

    from rlsched.extender.testing import make_pod

    url = f"http://127.0.0.1:{port}"
    names = [n["metadata"]["name"] for n in nodes]
    node_list = {"metadata": {"resourceVersion": "1"}, "items": nodes}

    def pods(count: int, tag: str) -> list[dict]:
        out = []
        for i in range(count):
            gpus, milli, cpu, mem = SHAPES[i % len(SHAPES)]
            out.append(make_pod(f"bench-{tag}-{i}", cpu=cpu, memory=mem, gpus=gpus, gpu_milli=milli, uid=f"{tag}-{i}"))
        return out

    results: dict = {}
    connector = aiohttp.TCPConnector(limit=1, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def post(verb: str, body: bytes) -> tuple[float, bytes]:
            t = time.perf_counter()
            async with http.post(f"{url}/{verb}", data=body, headers={"Content-Type": "application/json"}) as r:
                raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{verb}: HTTP {r.status}: {raw[:300]!r}")
            return time.perf_counter() - t, raw

        for mode, count in (("cache", requests), ("full", full_requests)):
            if count <= 0:
                continue
            batch = pods(count + 10, mode)
            bodies = []
            for p in batch:
                if mode == "cache":
                    bodies.append(orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": names}))
                else:
                    bodies.append(orjson.dumps({"Pod": p, "Nodes": node_list, "NodeNames": None}))
            f_times, p_times, sizes = [], [], []
            gc.disable()
            for i, body in enumerate(bodies):
                dt, raw = await post("filter", body)
                answer = orjson.loads(raw)
                kept = (
                    answer["NodeNames"]
                    if mode == "cache"
                    else [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
                )
                if mode == "cache":
                    pbody = orjson.dumps({"Pod": batch[i], "Nodes": None, "NodeNames": kept})
                else:
                    keep = set(kept)
                    pbody = orjson.dumps(
                        {"Pod": batch[i], "Nodes": {"items": [n for n in nodes if n["metadata"]["name"] in keep]}}
                    )
                dp, _ = await post("prioritize", pbody) if kept else (None, b"")
                if i >= 10:  # warm-up
                    f_times.append(dt)
                    if dp is not None:
                        p_times.append(dp)
                    sizes.append((len(body), len(raw), len(kept)))
                del answer
                gc.collect(0)
            gc.enable()
            results[mode] = {
                "filter_p50_ms": pct(f_times, 50),
                "filter_p99_ms": pct(f_times, 99),
                "prioritize_p50_ms": pct(p_times, 50) if p_times else None,
                "prioritize_p99_ms": pct(p_times, 99) if p_times else None,
                "requests": len(f_times),
                "filter_request_bytes": int(statistics.mean(s[0] for s in sizes)),
                "filter_response_bytes": int(statistics.mean(s[1] for s in sizes)),
                "feasible_nodes_mean": round(statistics.mean(s[2] for s in sizes), 1),
            }

    # throughput: 4 clients, each its own connection, filter + prioritize per pod
    async def client(k: int, batch: list[dict], http) -> int:
        done = 0
        for p in batch:
            async with http.post(f"{url}/filter", data=orjson.dumps({"Pod": p, "NodeNames": names})) as r:
                kept = (orjson.loads(await r.read()))["NodeNames"]
            if kept:
                async with http.post(f"{url}/prioritize", data=orjson.dumps({"Pod": p, "NodeNames": kept})) as r:
                    await r.read()
            done += 2 if kept else 1
        return done

    per_client = max(20, requests // 4)
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(4)]
    try:
        batches = [pods(per_client, f"tp{k}") for k in range(4)]
        t = time.perf_counter()
        calls = await asyncio.gather(*(client(k, batches[k], sessions[k]) for k in range(4)))
        elapsed = time.perf_counter() - t
    finally:
        for s in sessions:
            await s.close()
    results["throughput_4_clients_calls_per_s"] = round(sum(calls) / elapsed, 1)
    results["throughput_4_clients_pods_per_s"] = round(per_client * 4 / elapsed, 1)
    return results


def random_model(path: Path) -> Path:
    """A model file with the current feature schema and network layout but random weights: costs
    what the trained policy costs, decides nothing useful (for timing before a model is trained)."""
    from rlsched.extender.policy import default_typical
    from rlsched.policy.export import build_manifest, save_model
    from rlsched.policy.features import CLUSTER_FEATURES, FEATURES
    from rlsched.policy.network import param_shapes

    shapes = param_shapes(len(FEATURES), len(CLUSTER_FEATURES), (64, 64), 64)
    rng = np.random.default_rng(0)
    params = {k: rng.normal(0, 0.1, shape).astype(np.float32) for k, shape in shapes.items()}
    manifest = build_manifest(
        version="random-weights",
        hidden=(64, 64),
        value_hidden=64,
        prior_scale=1.0,
        rank_scale=0.0,
        mode="greedy",
        fgd_cpu_weight=0.5,
        typical_json=default_typical().to_json(),
        training={"note": "random weights, for latency measurements only"},
    )
    save_model(path, params, manifest)
    return path


def bundled_model() -> Path | None:
    try:
        from rlsched.policy.learned import SERVED_MODEL
    except ImportError:
        return None
    return SERVED_MODEL if SERVED_MODEL.is_file() else None


def bench(n: int, policy: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--serve", "--serve-nodes", str(n), "--policy", policy, "--port", "0"]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"server did not start: {line!r}")
        port = int(line.split()[1])
        nodes, _ = cluster(n)
        full = args.full_requests if n <= 1000 else max(5, args.full_requests // 3)
        load_before = os.getloadavg()
        out = asyncio.run(run_client(port, nodes, args.requests, full))
        out["loadavg"] = [round(v, 2) for v in os.getloadavg()]
        out["loadavg_before"] = [round(v, 2) for v in load_before]
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument(
        "--policies", help="fgd, ppo, ppo-random, mlp (default: fgd,ppo with the bundled model, else fgd,ppo-random)"
    )
    parser.add_argument("--requests", type=int, default=300, help="pods per cache-mode run (after 10 warm-up)")
    parser.add_argument("--full-requests", type=int, default=30, help="pods per full-node run (a third of it at 5,000)")
    parser.add_argument("--model", help="the model file for the ppo policy (default: the bundled one)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-nodes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--policy", default="fgd", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve_main(args)
    if not args.policies:
        args.policies = "fgd,ppo" if (args.model or bundled_model()) else "fgd,ppo-random"
    all_results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "runs": []}
    print(
        f"{'nodes':>6} {'policy':>6} {'mode':>5} {'filter p50':>10} {'p99':>7} {'prio p50':>9} {'p99':>7} "
        f"{'req KB':>8} {'resp KB':>8} {'calls/s(4)':>10} {'load':>5}"
    )
    for n in [int(x) for x in args.nodes.split(",")]:
        for policy in args.policies.split(","):
            r = bench(n, policy, args)
            all_results["runs"].append({"nodes": n, "policy": policy, **r})
            for mode in ("cache", "full"):
                m = r.get(mode)
                if not m:
                    continue
                tp = r["throughput_4_clients_calls_per_s"] if mode == "cache" else ""
                print(
                    f"{n:>6} {policy:>6} {mode:>5} {m['filter_p50_ms']:>10.2f} {m['filter_p99_ms']:>7.2f} "
                    f"{m['prioritize_p50_ms'] or 0:>9.2f} {m['prioritize_p99_ms'] or 0:>7.2f} "
                    f"{m['filter_request_bytes'] / 1024:>8.1f} {m['filter_response_bytes'] / 1024:>8.1f} {tp!s:>10} "
                    f"{r['loadavg'][0]:>5.2f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(all_results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
