"""Our hand-written async Kubernetes client (extender/kubeapi.py) against maintained async clients, on
a real kube-apiserver: CPU per watch event, bind latency, list time.

    nice -n 19 .venv/bin/python benchmarks/kube_client_compare.py [--pods 2000] [--binds 150]
        [--concurrency 16] [--rounds 2] [--clients ours,lightkube,lightkube-dict,k8s-asyncio,k8s-asyncio-raw]
        [--json out.json]

    pip install -e '.[bench]'      # lightkube, kubernetes_asyncio (not runtime dependencies)

The cluster: ``hack/local-cluster.sh up --no-scheduler --no-prometheus --fake-nodes 4`` in a temporary
state folder on free ports, torn down at the end; or the running one of ``RLSCHED_CLUSTER_DIR`` (only
the benchmark's namespace is deleted then). No scheduler runs: the pods stay pending until bound here.

Clients (each in its own process, all on uvloop like the extender, HTTP/1.1 + TLS with the kubeconfig's
client certificate, keep-alive; each library's fastest documented path):

- ``ours``: ``KubeApi`` (aiohttp, orjson) — watch events and list items as dicts, what the cache takes;
- ``lightkube``: lightkube's ``AsyncClient`` (httpx2, msgspec) with the typed ``Pod`` (msgspec structs
  decoded straight from the bytes; its documented path); bind with ``create(PodBinding)``;
- ``lightkube-dict``: the same client with a generic resource for pods (plain dicts, msgspec-decoded):
  what would feed our dict-based cache unchanged;
- ``k8s-asyncio``: kubernetes_asyncio (aiohttp) with its models (``V1Pod``), ``Watch().stream``;
  bind with ``create_namespaced_pod_binding(..., _preload_content=False)`` (its model cannot hold the
  Status the server answers);
- ``k8s-asyncio-raw``: ``Watch(return_type="object")`` (dicts) and lists with ``_preload_content=False``.

Phases:

1. watch: one watcher process per client (plus one that records the raw stream) watches the
   benchmark namespace from the same resourceVersion while ``--pods`` pods (extender/testing.make_pod:
   ~4 KB each, 18 env vars, volumes, probes, tolerations) are created 16 at a time; each watcher
   reports its process CPU (user+sys: TLS, HTTP, line splitting, decoding) from opening the watch to
   the last ADDED event, per event. Then a decode-only microbenchmark runs every client's per-line
   decode over the recorded stream (CPU µs per event, best of 5).
2. list: each client lists the namespace (pages of 500) 3 times per round: wall and CPU, best and median.
3. bind: each client binds ``--binds`` pending pods (the Binding carries a card annotation, as ours
   does) one at a time, then ``--binds`` more with ``--concurrency`` in flight (connections warmed
   first); client-side latency p50/p99 and binds/s. Rounds alternate the order of the clients.

The machine's load average and its busy CPU share (from /proc/stat) are reported for every phase:
the development machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "local-cluster.sh"
ALL_CLIENTS = ("ours", "lightkube", "lightkube-dict", "k8s-asyncio", "k8s-asyncio-raw")
BIND_CLIENTS = ("ours", "lightkube", "k8s-asyncio")  # the dict variants bind exactly like their parents
SCHEDULER_NAME = "kube-client-bench"  # no scheduler has it: the pods stay pending
CARDS_ANNOTATION = "rlsched.io/gpu-cards"
SHAPES = [("4", "16Gi", 0, 500), ("8", "32Gi", 1, 0), ("16", "64Gi", 2, 0), ("2", "8Gi", 0, 250), ("8", "32Gi", 0, 0)]


def log(msg: str) -> None:
    print(f"[kube-client-compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class MachineLoad:
    """Load average and the share of all cores busy (any process) between start and stop."""

    def __init__(self) -> None:
        self.loadavg_start = os.getloadavg()
        self._cpu0 = self._stat()

    @staticmethod
    def _stat() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        idle = vals[3] + vals[4]
        return sum(vals) - idle, sum(vals)

    def stop(self) -> dict[str, Any]:
        busy1, total1 = self._stat()
        busy0, total0 = self._cpu0
        return {
            "loadavg_start": [round(v, 2) for v in self.loadavg_start],
            "loadavg_end": [round(v, 2) for v in os.getloadavg()],
            "machine_busy": round((busy1 - busy0) / max(total1 - total0, 1), 3),
            "cores": os.cpu_count(),
        }


# ----------------------------------------------------------------------------------- clients
class Client:
    """One library behind the four calls the benchmark makes."""

    name = ""

    async def open(self, kubeconfig: str) -> None: ...

    async def close(self) -> None: ...

    def events(self, ns: str, rv: str) -> AsyncGenerator[tuple[str, str], None]:
        """The namespace's pod watch from ``rv``: (event type, the object's resourceVersion) per event."""
        raise NotImplementedError

    async def watch(self, ns: str, rv: str, want: int) -> int:
        """Watch from ``rv`` until ``want`` ADDED events arrived; returns the number of events."""
        added = count = 0
        stream = self.events(ns, rv)
        async for kind, _rv in stream:
            count += 1
            if kind == "ADDED":
                added += 1
                if added >= want:
                    break
        await stream.aclose()
        return count

    async def list(self, ns: str) -> int:
        raise NotImplementedError

    async def bind(self, ns: str, name: str, uid: str, node: str, cards: str) -> None:
        raise NotImplementedError

    async def get(self, ns: str, name: str) -> None:
        raise NotImplementedError


class Ours(Client):
    name = "ours"

    async def open(self, kubeconfig: str) -> None:
        from rlsched.extender.kubeapi import KubeApi
        from rlsched.extender.settings import KubeSettings

        self.api = KubeApi.from_settings(KubeSettings(kubeconfig=kubeconfig))

    async def close(self) -> None:
        await self.api.close()

    async def events(self, ns: str, rv: str) -> AsyncGenerator[tuple[str, str], None]:
        async for event in self.api.watch(f"/api/v1/namespaces/{ns}/pods", rv, 300):
            yield event["type"], event["object"]["metadata"]["resourceVersion"]

    async def list(self, ns: str) -> int:
        items, _rv = await self.api.list(f"/api/v1/namespaces/{ns}/pods", limit=500)
        return len(items)

    async def bind(self, ns: str, name: str, uid: str, node: str, cards: str) -> None:
        await self.api.create_binding(ns, name, uid, node, timeout=10.0, annotations={CARDS_ANNOTATION: cards})

    async def get(self, ns: str, name: str) -> None:
        await self.api.get_pod(ns, name, timeout=10.0)


class Lightkube(Client):
    name = "lightkube"
    generic = False

    async def open(self, kubeconfig: str) -> None:
        from lightkube import AsyncClient, KubeConfig
        from lightkube.resources.core_v1 import Pod

        self.client = AsyncClient(KubeConfig.from_file(kubeconfig))  # HTTP/1.1 (http2=False), keep-alive
        self.pod: Any = Pod
        if self.generic:
            from lightkube.generic_resource import create_namespaced_resource

            self.pod = create_namespaced_resource("", "v1", "Pod", "pods")

    async def close(self) -> None:
        await self.client.close()

    async def events(self, ns: str, rv: str) -> AsyncGenerator[tuple[str, str], None]:
        async for kind, obj in self.client.watch(self.pod, namespace=ns, resource_version=rv, server_timeout=300):
            yield kind, obj["metadata"]["resourceVersion"] if self.generic else obj.metadata.resourceVersion

    async def list(self, ns: str) -> int:
        return len([p async for p in self.client.list(self.pod, namespace=ns, chunk_size=500)])

    async def bind(self, ns: str, name: str, uid: str, node: str, cards: str) -> None:
        import msgspec
        from lightkube.models.core_v1 import ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import PodBinding

        body = PodBinding(
            metadata=ObjectMeta(name=name, namespace=ns, uid=uid, annotations={CARDS_ANNOTATION: cards}),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node),
        )
        try:
            await self.client.create(body, name=name, namespace=ns)
        except msgspec.ValidationError:
            # lightkube 1.0.1 decodes the server's answer (a Status) as a Binding and fails on the missing
            # `target` after the binding was written; HTTP errors are raised before this (ApiError).
            pass

    async def get(self, ns: str, name: str) -> None:
        await self.client.get(self.pod, name, namespace=ns)


class LightkubeDict(Lightkube):
    name = "lightkube-dict"
    generic = True


class K8sAsyncio(Client):
    name = "k8s-asyncio"
    raw = False

    async def open(self, kubeconfig: str) -> None:
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.client_mod = client
        self.api_client = client.ApiClient(cfg)  # aiohttp, TCPConnector(limit=100), keep-alive
        self.v1 = client.CoreV1Api(self.api_client)

    async def close(self) -> None:
        await self.api_client.close()

    async def events(self, ns: str, rv: str) -> AsyncGenerator[tuple[str, str], None]:
        from kubernetes_asyncio import watch

        w = watch.Watch(return_type="object") if self.raw else watch.Watch()
        async with w:
            async for event in w.stream(
                self.v1.list_namespaced_pod,
                namespace=ns,
                resource_version=rv,
                timeout_seconds=300,
                allow_watch_bookmarks=True,
            ):
                obj = event["object"]
                yield event["type"], obj["metadata"]["resourceVersion"] if self.raw else obj.metadata.resource_version

    async def list(self, ns: str) -> int:
        n, cont = 0, None
        while True:
            kw: dict[str, Any] = {"limit": 500, "_request_timeout": 60}
            if cont:
                kw["_continue"] = cont
            if self.raw:
                import json as stdjson

                resp = await self.v1.list_namespaced_pod(ns, _preload_content=False, **kw)
                page = stdjson.loads(await resp.read())
                n += len(page["items"])
                cont = page["metadata"].get("continue")
            else:
                page = await self.v1.list_namespaced_pod(ns, **kw)
                n += len(page.items)
                cont = page.metadata._continue
            if not cont:
                return n

    async def bind(self, ns: str, name: str, uid: str, node: str, cards: str) -> None:
        c = self.client_mod
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=ns, uid=uid, annotations={CARDS_ANNOTATION: cards}),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        resp = await self.v1.create_namespaced_pod_binding(name, ns, body, _preload_content=False, _request_timeout=10)
        await resp.read()
        if resp.status >= 400:
            raise RuntimeError(f"bind {name}: HTTP {resp.status}")

    async def get(self, ns: str, name: str) -> None:
        await self.v1.read_namespaced_pod(name, ns, _request_timeout=10)


class K8sAsyncioRaw(K8sAsyncio):
    name = "k8s-asyncio-raw"
    raw = True


CLIENTS: dict[str, type[Client]] = {c.name: c for c in (Ours, Lightkube, LightkubeDict, K8sAsyncio, K8sAsyncioRaw)}


# ----------------------------------------------------------------------------------- workers
async def worker_watch(args: argparse.Namespace) -> dict[str, Any]:
    client = CLIENTS[args.client]()
    await client.open(args.kubeconfig)
    print("ready", flush=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    events = await asyncio.wait_for(client.watch(args.namespace, args.rv, args.count), timeout=args.timeout)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    await client.close()
    return {"events": events, "cpu_s": cpu, "cpu_us_per_event": cpu / events * 1e6, "wall_s": wall}


async def worker_capture(args: argparse.Namespace) -> dict[str, Any]:
    """Record the raw watch stream (lines as the server sends them) for the decode microbenchmark."""
    import orjson

    from rlsched.extender.kubeapi import KubeApi
    from rlsched.extender.settings import KubeSettings

    api = KubeApi.from_settings(KubeSettings(kubeconfig=args.kubeconfig))
    print("ready", flush=True)
    url = f"{api.host}/api/v1/namespaces/{args.namespace}/pods?watch=1&resourceVersion={args.rv}&timeoutSeconds=300"
    added, lines = 0, 0
    with open(args.out, "wb") as out:
        async with api.session().get(url, headers=api._headers()) as resp:
            async for line in resp.content:
                if not line.strip():
                    continue
                out.write(line if line.endswith(b"\n") else line + b"\n")
                lines += 1
                if orjson.loads(line)["type"] == "ADDED":
                    added += 1
                    if added >= args.count:
                        break
    await api.close()
    return {"lines": lines}


async def worker_list(args: argparse.Namespace) -> dict[str, Any]:
    client = CLIENTS[args.client]()
    await client.open(args.kubeconfig)
    await client.list(args.namespace)  # warm-up: imports, connection, first decode
    walls, cpus, n = [], [], 0
    for _ in range(args.repeat):
        cpu0, t0 = time.process_time(), time.perf_counter()
        n = await client.list(args.namespace)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - cpu0)
    await client.close()
    return {"items": n, "wall_s": walls, "cpu_s": cpus}


async def worker_bind(args: argparse.Namespace) -> dict[str, Any]:
    client = CLIENTS[args.client]()
    await client.open(args.kubeconfig)
    job = json.loads(Path(args.pods_file).read_text())
    ns, nodes = args.namespace, job["nodes"]
    # Warm-up: `concurrency` connections opened (TLS handshakes) and the code paths run once.
    warm = job["warm"]
    await asyncio.gather(*(client.get(ns, warm) for _ in range(args.concurrency)))

    async def one(i: int, name: str, uid: str) -> float:
        t = time.perf_counter()
        await client.bind(ns, name, uid, nodes[i % len(nodes)], str(i % 8))
        return time.perf_counter() - t

    out: dict[str, Any] = {}
    cpu0, t0 = time.process_time(), time.perf_counter()
    seq = [await one(i, name, uid) for i, (name, uid) in enumerate(job["sequential"])]
    out["sequential"] = {"lat_s": seq, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}

    sem = asyncio.Semaphore(args.concurrency)

    async def limited(i: int, name: str, uid: str) -> float:
        async with sem:
            return await one(i, name, uid)

    cpu0, t0 = time.process_time(), time.perf_counter()
    conc = await asyncio.gather(*(limited(i, n, u) for i, (n, u) in enumerate(job["concurrent"])))
    out["concurrent"] = {"lat_s": list(conc), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}
    await client.close()
    return out


def worker_decode(args: argparse.Namespace) -> dict[str, Any]:
    """CPU µs per event of each client's per-line decode, over the recorded stream (best of 5)."""
    import orjson

    lines = [ln.rstrip(b"\n") for ln in Path(args.stream).read_bytes().splitlines() if ln.strip()]
    decoders: dict[str, Any] = {"ours": orjson.loads}  # KubeApi.watch: orjson.loads(line) → the cache's dict

    from lightkube.core import decoders as lk
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.core_v1 import Pod

    generic_pod = create_namespaced_resource("", "v1", "Pod", "pods")

    def lightkube_line(res: Any) -> Any:  # lightkube's WatchDriver.process_one_line
        def decode(line: bytes) -> Any:
            ev = lk.decode_watch_event(line)
            obj = lk.decode_object(ev.object, res)
            _ = obj.metadata.resourceVersion
            return ev.type, obj

        return decode

    decoders["lightkube"] = lightkube_line(Pod)
    decoders["lightkube-dict"] = lightkube_line(generic_pod)
    typed = lightkube_line(Pod)
    decoders["lightkube+to_dict"] = lambda line: typed(line)[1].to_dict()  # typed objects into our dict cache

    async def k8s() -> None:
        from kubernetes_asyncio import watch

        w_models, w_raw = watch.Watch(), watch.Watch(return_type="object")
        decoders["k8s-asyncio"] = lambda line: w_models.unmarshal_event(line.decode("utf8"), "V1Pod")
        decoders["k8s-asyncio-raw"] = lambda line: w_raw.unmarshal_event(line.decode("utf8"), "object")

    asyncio.run(k8s())
    best: dict[str, float] = {}
    for _ in range(5):
        for name, fn in decoders.items():
            cpu0 = time.process_time()
            for line in lines:
                fn(line)
            per = (time.process_time() - cpu0) / len(lines) * 1e6
            best[name] = min(best.get(name, per), per)
    sizes = [len(ln) for ln in lines]
    return {"lines": len(lines), "bytes_mean": statistics.mean(sizes), "cpu_us_per_event": best}


# ----------------------------------------------------------------------------------- orchestration
class Cluster:
    """A local control plane: ours (temporary state folder, free ports) or the one in RLSCHED_CLUSTER_DIR."""

    def __init__(self) -> None:
        self.reuse = os.environ.get("RLSCHED_CLUSTER_DIR")
        self.state = Path(self.reuse) if self.reuse else Path(tempfile.mkdtemp(prefix="rlsched-kcc-"))
        self.env = dict(os.environ, RLSCHED_CLUSTER_DIR=str(self.state), PYTHONSAFEPATH="1")
        for var in [v for v in self.env if v.startswith("RLSCHED_") and v.endswith("_PORT")]:
            self.env.pop(var)  # let the script pick free ports: other clusters may run on this machine
        self.kubeconfig = str(self.state / "kubeconfig")

    def up(self) -> None:
        if self.reuse:
            log(f"using the cluster in {self.state}")
            return
        log(f"starting a control plane in {self.state} (no scheduler, 4 kwok nodes)")
        done = subprocess.run(
            [str(SCRIPT), "up", "--no-scheduler", "--no-prometheus", "--fake-nodes", "4"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            self.down()
            raise SystemExit(f"hack/local-cluster.sh up failed:\n{done.stderr[-3000:]}")

    def down(self) -> None:
        if self.reuse:
            return
        subprocess.run([str(SCRIPT), "down"], env=self.env, capture_output=True, timeout=180)
        shutil.rmtree(self.state, ignore_errors=True)


def creatable_pod(i: int, ns: str) -> dict[str, Any]:
    """extender/testing.make_pod as a user would create it (no server-owned fields, no owner)."""
    from rlsched.extender.testing import make_pod

    cpu, mem, gpus, milli = SHAPES[i % len(SHAPES)]
    pod = make_pod(f"bench-{i:05d}", cpu=cpu, memory=mem, gpus=gpus, gpu_milli=milli, namespace=ns)
    meta = pod["metadata"]
    for key in ("uid", "resourceVersion", "generation", "creationTimestamp", "ownerReferences", "managedFields"):
        meta.pop(key, None)
    pod.pop("status", None)
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    return pod


async def prepare(kubeconfig: str, ns: str) -> str:
    """The namespace (waits for its default ServiceAccount); returns the pods' list resourceVersion."""
    from rlsched.extender.kubeapi import ApiError, KubeApi
    from rlsched.extender.settings import KubeSettings

    async with KubeApi.from_settings(KubeSettings(kubeconfig=kubeconfig)) as api:
        await api.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        for _ in range(300):
            try:
                await api.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                break
            except ApiError:
                await asyncio.sleep(0.2)
        _items, rv = await api.list(f"/api/v1/namespaces/{ns}/pods")
        return rv


async def create_pods(kubeconfig: str, ns: str, first: int, count: int, concurrency: int = 16) -> float:
    from rlsched.extender.kubeapi import KubeApi
    from rlsched.extender.settings import KubeSettings

    bodies = [creatable_pod(i, ns) for i in range(first, first + count)]
    t0 = time.perf_counter()
    async with KubeApi.from_settings(KubeSettings(kubeconfig=kubeconfig)) as api:
        queue = iter(bodies)

        async def feeder() -> None:
            for body in queue:
                await api.request("POST", f"/api/v1/namespaces/{ns}/pods", body, timeout=60)

        await asyncio.gather(*(feeder() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def pending_pods(kubeconfig: str, ns: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The namespace's unbound pods (name, uid) and the cluster's node names."""
    from rlsched.extender.kubeapi import KubeApi
    from rlsched.extender.settings import KubeSettings

    async with KubeApi.from_settings(KubeSettings(kubeconfig=kubeconfig)) as api:
        items, _ = await api.list(f"/api/v1/namespaces/{ns}/pods")
        nodes, _ = await api.list("/api/v1/nodes")
    pods = sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in items if not p["spec"].get("nodeName"))
    return pods, [n["metadata"]["name"] for n in nodes]


async def delete_namespace(kubeconfig: str, ns: str) -> None:
    from rlsched.extender.kubeapi import KubeApi
    from rlsched.extender.settings import KubeSettings

    async with KubeApi.from_settings(KubeSettings(kubeconfig=kubeconfig)) as api:
        await api.request("DELETE", f"/api/v1/namespaces/{ns}")


def worker_cmd(task: str, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "worker", task, *extra]


def run_worker(task: str, *extra: str, timeout: float = 600) -> dict[str, Any]:
    done = subprocess.run(worker_cmd(task, *extra), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"worker {task} {' '.join(extra)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--pods", type=int, default=2000, help="pods created while the watches run (and listed)")
    p.add_argument("--binds", type=int, default=150, help="binds per client, per mode, per round")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2, help="list and bind rounds (the client order alternates)")
    p.add_argument("--clients", default=",".join(ALL_CLIENTS))
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    clients = [c for c in args.clients.split(",") if c]
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown:
        p.error(f"unknown client(s) {unknown}; known: {', '.join(CLIENTS)}")
    binders = [c for c in clients if c in BIND_CLIENTS]
    needed_binds = len(binders) * 2 * args.binds * args.rounds

    cluster = Cluster()
    cluster.up()
    ns = f"kcc-{os.getpid()}"
    kc = cluster.kubeconfig
    res: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}, "python": sys.version.split()[0]}
    work = Path(tempfile.mkdtemp(prefix="rlsched-kcc-work-"))
    try:
        rv = asyncio.run(prepare(kc, ns))

        # 1. watch -------------------------------------------------------------------------------
        log(f"watch: {len(clients)} watchers + recorder from rv {rv}; creating {args.pods} pods in {ns}")
        common = ["--kubeconfig", kc, "--namespace", ns, "--rv", rv, "--count", str(args.pods)]
        procs = {
            c: subprocess.Popen(worker_cmd("watch", "--client", c, *common), stdout=subprocess.PIPE, text=True)
            for c in clients
        }
        stream = work / "stream.jsonl"
        procs["_capture"] = subprocess.Popen(
            worker_cmd("capture", *common, "--out", str(stream)), stdout=subprocess.PIPE, text=True
        )
        for c, proc in procs.items():
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"watcher {c} did not start")
        time.sleep(2.0)  # the watches open (they replay from rv anyway)
        load = MachineLoad()
        create_s = asyncio.run(create_pods(kc, ns, 0, max(args.pods, needed_binds)))
        watch: dict[str, Any] = {}
        for c, proc in procs.items():
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"watcher {c} failed (rc {proc.returncode})")
            watch[c] = json.loads(out.strip().splitlines()[-1])
        res["watch"] = watch | {"load": load.stop(), "create_s": create_s}
        log(f"watch done ({create_s:.1f} s to create); decode microbenchmark")
        res["decode"] = run_worker("decode", "--stream", str(stream))

        # 2. list --------------------------------------------------------------------------------
        load = MachineLoad()
        lists: dict[str, dict[str, list[float]]] = {c: {"wall_s": [], "cpu_s": []} for c in clients}
        for r in range(args.rounds):
            for c in clients if r % 2 == 0 else clients[::-1]:
                out = run_worker("list", "--client", c, "--kubeconfig", kc, "--namespace", ns, "--repeat", "3")
                lists[c]["wall_s"] += out["wall_s"]
                lists[c]["cpu_s"] += out["cpu_s"]
                lists[c]["items"] = out["items"]
        res["list"] = lists | {"load": load.stop()}
        log("list done; bind")

        # 3. bind --------------------------------------------------------------------------------
        pods, nodes = asyncio.run(pending_pods(kc, ns))
        if len(pods) < needed_binds + 1:
            raise SystemExit(f"{len(pods)} pending pods, {needed_binds + 1} needed")
        warm, pods, before = pods[0][0], pods[1:], len(pods)
        load = MachineLoad()
        binds: dict[str, dict[str, Any]] = {c: {} for c in binders}
        for r in range(args.rounds):
            for c in binders if r % 2 == 0 else binders[::-1]:
                seq, pods = pods[: args.binds], pods[args.binds :]
                conc, pods = pods[: args.binds], pods[args.binds :]
                job = work / f"bind-{c}-{r}.json"
                job.write_text(json.dumps({"nodes": nodes, "warm": warm, "sequential": seq, "concurrent": conc}))
                out = run_worker(
                    "bind", "--client", c, "--kubeconfig", kc, "--namespace", ns, "--pods-file", str(job),
                    "--concurrency", str(args.concurrency),
                )  # fmt: skip
                for mode, v in out.items():
                    acc = binds[c].setdefault(mode, {"lat_s": [], "wall_s": 0.0, "cpu_s": 0.0})
                    acc["lat_s"] += v["lat_s"]
                    acc["wall_s"] += v["wall_s"]
                    acc["cpu_s"] += v["cpu_s"]
        res["bind"] = binds | {"load": load.stop()}
        left, _ = asyncio.run(pending_pods(kc, ns))
        res["bind"]["bound"] = bound = before - len(left)
        if bound != needed_binds:
            raise SystemExit(f"{bound} pods bound, {needed_binds} binds made: a client's bind did not land")
    finally:
        if cluster.reuse:
            try:
                asyncio.run(delete_namespace(kc, ns))
            except Exception as exc:  # noqa: BLE001 - report and go on
                log(f"could not delete namespace {ns}: {exc}")
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)

    report(res, clients, binders)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


def report(res: dict[str, Any], clients: list[str], binders: list[str]) -> None:
    def load_line(load: dict[str, Any]) -> str:
        la0, la1 = load["loadavg_start"][0], load["loadavg_end"][0]
        return f"  machine: {load['cores']} cores {load['machine_busy']:.0%} busy, load avg {la0:.2f} → {la1:.2f}"

    w, d = res["watch"], res["decode"]
    print(f"\nwatch: {res['args']['pods']} pods created in {w['create_s']:.1f} s; "
          f"events {d['lines']}, {d['bytes_mean']:.0f} B each on the wire")  # fmt: skip
    print(f"  {'client':<18} {'process CPU µs/event':>21} {'decode-only µs/event':>21}")
    for c in clients:
        print(f"  {c:<18} {w[c]['cpu_us_per_event']:>21.0f} {d['cpu_us_per_event'][c]:>21.1f}")
    for extra in sorted(set(d["cpu_us_per_event"]) - set(clients)):
        print(f"  {extra:<18} {'':>21} {d['cpu_us_per_event'][extra]:>21.1f}")
    print(load_line(w["load"]))

    lst = res["list"]
    print(f"\nlist ({next(iter(lst[c]['items'] for c in clients))} pods, pages of 500): wall and CPU, ms")
    print(f"  {'client':<18} {'wall best':>10} {'wall med':>10} {'CPU best':>10} {'CPU med':>10}")
    for c in clients:
        wall, cpu = lst[c]["wall_s"], lst[c]["cpu_s"]
        print(f"  {c:<18} {min(wall) * 1e3:>10.0f} {statistics.median(wall) * 1e3:>10.0f} "
              f"{min(cpu) * 1e3:>10.0f} {statistics.median(cpu) * 1e3:>10.0f}")  # fmt: skip
    print(load_line(lst["load"]))

    b = res["bind"]
    print("\nbind (POST pods/binding with a card annotation), client-side latency")
    print(f"  {'client':<18} {'mode':<12} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'binds/s':>8} {'CPU µs/bind':>12}")
    for c in binders:
        for mode, v in b[c].items():
            n = len(v["lat_s"])
            print(f"  {c:<18} {mode:<12} {n:>5} {pct(v['lat_s'], 0.5) * 1e3:>8.1f} {pct(v['lat_s'], 0.99) * 1e3:>8.1f} "
                  f"{n / v['wall_s']:>8.0f} {v['cpu_s'] / n * 1e6:>12.0f}")  # fmt: skip
    print(load_line(b["load"]))


def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kube_client_compare.py worker")
    p.add_argument("task", choices=["watch", "capture", "list", "bind", "decode"])
    p.add_argument("--client", choices=list(CLIENTS))
    p.add_argument("--kubeconfig")
    p.add_argument("--namespace")
    p.add_argument("--rv")
    p.add_argument("--count", type=int)
    p.add_argument("--out")
    p.add_argument("--stream")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--pods-file")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--timeout", type=float, default=480)
    args = p.parse_args(argv)
    if args.task == "decode":
        out = worker_decode(args)
    else:
        import uvloop  # the extender's loop (extender/cli.py)

        fn = {"watch": worker_watch, "capture": worker_capture, "list": worker_list, "bind": worker_bind}[args.task]
        out = uvloop.run(fn(args))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main())
