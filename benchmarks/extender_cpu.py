"""The extender's CPU per scheduled pod, alone: filter then bind over HTTP, as kube-scheduler calls them.

    python benchmarks/extender_cpu.py [--nodes 1000] [--pods 2000] [--offered 0.42] [--rounds 3]
                                      [--model PATH] [--json out.json]

The real-stack benchmark (``scheduler_throughput.py``) measures the extender among six busy processes
on the same cores; its per-pod figure moves ±20 % from run to run. This one measures the extender's
own work with nothing else running: a server process (``serve()`` with the shipped settings,
``topK: 1``) over an in-memory API (:class:`rlsched.extender.testing.FakeKubeApi`) holding the
nodes, bound pods filling ~45 % of the cards, and ``--pods`` pending pods of the openb shapes; a
client process sends, for each pod, ``filter`` with a random ``--offered`` share of the node names in a
random order (kube-scheduler's adaptive ``percentageOfNodesToScore`` offers ~42 % at 1,000 nodes,
in an order that changes from pod to pod) and then ``bind`` to the node kept, one call at a time
with keep-alive. The server's CPU (utime + stime from ``/proc``) over the pods after the first
``--warm`` is divided by the pods scheduled.

Included: the HTTP server, filter (parse, decide, hold), bind (checks, cards, the binding write into
the fake API), and the watch event the write produces (applied by the cache). Not included: TLS and
the HTTP client of a real binding write, and the other watch events of a real API server (kwok's
status updates) — ``scheduler_throughput.py`` has those. The fake API's own work is kept small: its
watch events are copied through JSON (what a real watch parses), not ``copy.deepcopy``.

Prints one line per round and the median; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]


def pending_pods(n: int) -> list[dict[str, Any]]:
    """``n`` pending pods cycling through the openb shapes of ``extender_latency.SHAPES``."""
    from extender_latency import SHAPES

    from rlsched.extender.testing import make_pod

    out = []
    for i in range(n):
        gpus, milli, cpu, mem = SHAPES[i % len(SHAPES)]
        out.append(make_pod(f"cpu-bench-{i}", cpu=cpu, memory=mem, gpus=gpus, gpu_milli=milli, uid=f"cpu-bench-{i}"))
    return out


def serve_main(args: argparse.Namespace) -> int:
    import orjson
    import uvloop
    from extender_latency import cluster

    from rlsched.extender.logs import setup_logging
    from rlsched.extender.server import limit_native_threads, serve
    from rlsched.extender.settings import ExtenderSettings, PolicySettings, ServerSettings
    from rlsched.extender.testing import FakeKubeApi

    class JsonCopyApi(FakeKubeApi):
        def emit(self, event: dict[str, Any] | None) -> None:
            for nodes, queue in self._watchers:
                if event is None or (event["object"].get("kind") == "Node") == nodes:
                    queue.put_nowait(None if event is None else orjson.loads(orjson.dumps(event)))

    setup_logging("WARNING", "text")
    limit_native_threads()
    nodes, pods = cluster(args.nodes)
    policy = PolicySettings(model_path=args.model) if args.model else PolicySettings()
    settings = ExtenderSettings(server=ServerSettings(port=0, status_port=0, status_host="127.0.0.1"), policy=policy)

    def ready(service: Any) -> None:
        print(f"READY {service.addresses['verbs'][1]}", flush=True)

    api = JsonCopyApi(nodes, pods + pending_pods(args.pods))
    return int(uvloop.run(serve(settings, api=api, ready=ready)))


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def client(port: int, pid: int, args: argparse.Namespace, seed: int) -> dict[str, float]:
    import aiohttp
    import orjson
    from extender_latency import cluster

    nodes, _ = cluster(args.nodes)
    names = [n["metadata"]["name"] for n in nodes]
    rng = np.random.default_rng(seed)
    offered = max(1, round(args.offered * len(names)))
    pods = pending_pods(args.pods)
    bodies = [
        orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": [names[i] for i in rng.permutation(len(names))[:offered]]})
        for p in pods
    ]
    url = f"http://127.0.0.1:{port}"
    scheduled = 0
    cpu0 = wall0 = 0.0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        for i, (pod, body) in enumerate(zip(pods, bodies, strict=True)):
            if i == args.warm:
                cpu0, wall0 = cpu_ms(pid), time.perf_counter()
            async with http.post(f"{url}/filter", data=body) as r:
                kept = orjson.loads(await r.read()).get("NodeNames") or []
            if not kept:
                continue
            m = pod["metadata"]
            binding = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": kept[0]}
            async with http.post(f"{url}/bind", data=orjson.dumps(binding)) as r:
                error = orjson.loads(await r.read()).get("Error")
            if error:
                raise RuntimeError(f"bind {m['name']} → {kept[0]}: {error}")
            if i >= args.warm:
                scheduled += 1
        wall1 = time.perf_counter()  # the last answer: the wall time stops here, before the wait below
        await asyncio.sleep(0.3)  # the server's CPU for the last watch events
        cpu1 = cpu_ms(pid)
    return {
        "cpuMsPerPod": round((cpu1 - cpu0) / max(scheduled, 1), 4),
        "wallMsPerPod": round((wall1 - wall0) * 1e3 / max(scheduled, 1), 4),
        "scheduled": scheduled,
        "pods": args.pods - args.warm,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000, help="pending pods per round (the first --warm not counted)")
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--offered", type=float, default=0.42, help="share of the node names in each filter")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each with a fresh server")
    parser.add_argument("--model", help="a model file for the extender (default: none, FGD serves)")
    parser.add_argument("--json", help="write the rounds here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve_main(args)
    if not 0 < args.offered <= 1 or not 0 <= args.warm < args.pods:
        parser.error("--offered must be in (0, 1] and --warm below --pods")
    rounds = []
    for k in range(args.rounds):
        cmd = [sys.executable, __file__, "--serve", "--nodes", str(args.nodes), "--pods", str(args.pods)]
        cmd += ["--model", args.model] if args.model else []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("READY"):
                raise RuntimeError(f"server did not start: {line!r}")
            result = asyncio.run(client(int(line.split()[1]), proc.pid, args, seed=k))
        finally:
            proc.terminate()
            proc.wait(10)
        result["load1"] = round(os.getloadavg()[0], 2)
        rounds.append(result)
        print(
            f"round {k}: {result['cpuMsPerPod']:.3f} ms CPU per pod ({result['scheduled']} of "
            f"{result['pods']} scheduled), {result['wallMsPerPod']:.3f} ms wall, load {result['load1']}",
            flush=True,
        )
    median = statistics.median(r["cpuMsPerPod"] for r in rounds)
    print(f"median: {median:.3f} ms of extender CPU per pod (filter + bind), {args.nodes} nodes")
    if args.json:
        out = {"nodes": args.nodes, "offered": args.offered, "model": args.model, "rounds": rounds, "median": median}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
