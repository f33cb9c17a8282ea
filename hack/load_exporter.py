#!/usr/bin/env python3
"""Node-exporter series for fake (kwok) nodes, so the extender's Prometheus path runs for real.

kwok nodes have no kernel to measure, so this exporter makes the numbers up — from what is placed
on each node: every ``--refresh`` seconds it lists the nodes and pods, and a node's utilization is
a small per-node base (stable, from a hash of its name) plus a share proportional to the cpu and
memory its pods request. ``PUT /loads/<node>`` with ``{"cpu": 0.8}`` pins a value (tests).

With ``--usage-annotations`` (opt-in; the dynamic replay, ``hack/replay_dynamic.py``) a node's load is
instead what the living-cluster simulator says its pods use: each pod carries its usage model in the
``rlsched.io/usage`` annotation (``rlsched.policy.dynamic.replay.usage_annotation``), and every refresh
draws one scrape of it with the simulator's own ``UsageModel.instant`` (mean × a mean-one lognormal
factor, clipped) and sums it per node — CPU and memory as fractions of the node's allocatable, GPU
as a fraction of its cards. No base load; pods without the annotation count as idle, and so do pods
whose annotation is unusable (not a JSON object, a value that is no finite number in range:
``rlsched.policy.dynamic.replay.usage_annotation_problem``) — each such pod is logged once and counted
in ``rlsched_load_exporter_skipped_pods``, and the other pods' usage is published as usual. The node pages
then also carry ``rlsched_node_utilization{resource="cpu"|"memory"|"gpu"}`` (unclipped: a pod may
burst past its request) and ``rlsched_node_latency_sensitive_pods``, the series the replay reads its
SLA measures from.

It publishes, per node, at ``/nodes/<node>/metrics``, the node-exporter series the extender's
default PromQL reads (``extender/settings.py`` ``DEFAULT_QUERIES``):

- ``node_cpu_seconds_total{cpu, mode="idle"|"user"|"system"}`` counters (idle grows at 1 − cpu per
  second per cpu, so ``1 - avg(rate(idle))`` is the utilization);
- ``node_memory_MemTotal_bytes`` / ``node_memory_MemAvailable_bytes`` gauges;
- ``node_network_{receive,transmit}_bytes_total{device="eth0"|"lo"}`` counters (``lo`` is busy and
  must be excluded by the query; eth0 carries utilization × 1.25e9 bytes/s each way);
- ``node_disk_io_time_seconds_total{device="nvme0n1"}`` (busy fraction per second).

With ``--targets-dir`` (``hack/local-cluster.sh``'s Prometheus file_sd folder) it writes
``rlsched-load-exporter.json``: one target per node, ``instance`` = the node name and
``__metrics_path__`` = its page — one scrape target per node, as one node-exporter per node would be,
so ``by (instance)`` in the queries groups by node. The file is rewritten when nodes come and go and
removed at exit.

Other endpoints: ``/healthz`` (503 before the first refresh, after ``UNHEALTHY_AFTER`` failed ones in
a row, and when the last successful one is older than ``stale_after_s``: each list gives up after
``REQUEST_TIMEOUT_S``), ``/loads`` (JSON: node → the utilizations published now), ``/metrics`` (the exporter's own
counters). ``PUT /loads/<node>`` with ``{}`` unpins; at most ``MAX_PINS`` nodes are pinned at once (409).

    hack/load_exporter.py --kubeconfig .cache/cluster/kubeconfig --port 9101 \\
        --targets-dir .cache/cluster/prometheus/targets [--node-selector type=kwok]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from rlsched.arg_types import finite_number, integer

log = logging.getLogger("load_exporter")
TARGETS_FILE = "rlsched-load-exporter.json"
COLUMNS = ("cpu", "memory", "network", "disk")
GPU_RESOURCE = "nvidia.com/gpu"
LINK_BYTES_PER_S = 1.25e9  # one direction of 10 Gbit/s; the default query divides rx+tx by 2.5e9
CPUS_EXPOSED = 2  # per-cpu series; the query averages them
MAX_PINS = 4096
"""Nodes ``PUT /loads/<node>`` may pin at once. A pin may name a node the exporter has not listed yet
(the tests pin a node right after creating it), so unknown names are kept, up to this many."""
UNHEALTHY_AFTER = 3
"""Failed refreshes in a row after which ``/healthz`` says 503: one failed list is a blip, three mean
the published values are going stale."""
REQUEST_TIMEOUT_S = 10.0
"""Bound on each list (connect and every read): without it an API server that stops answering (stopped,
overloaded, a half-open connection) blocks the refresh forever. A local API server lists thousands of
pods in well under a second."""


def stale_after_s(refresh_s: float) -> float:
    """Age of the last successful refresh past which ``/healthz`` says 503, whatever the refresh is doing:
    ``UNHEALTHY_AFTER`` refresh intervals plus the two lists' timeouts (what a refresh may take at most).
    It catches a refresh that hangs, which never counts as failed."""
    return UNHEALTHY_AFTER * refresh_s + 2 * REQUEST_TIMEOUT_S


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a float (cpu in cores, memory in bytes)."""
    s = str(value).strip()
    if not s:
        return 0.0
    suffixes = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "Pi": 2**50,
        "Ei": 2**60,
        "n": 1e-9,
        "u": 1e-6,
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "P": 1e15,
        "E": 1e18,
    }
    for suf in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
        if s.endswith(suf):
            return float(s[:-2]) * suffixes[suf]
    if s[-1] in "numkMGTPE" and not s[-1].isdigit():
        return float(s[:-1]) * suffixes[s[-1]]
    return float(s)


def pod_requests(pod: dict) -> tuple[float, float]:
    """A pod's cpu (cores) and memory (bytes) requests, summed over its containers."""
    cpu = mem = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        req = (c.get("resources") or {}).get("requests") or {}
        cpu += quantity(req.get("cpu", 0))
        mem += quantity(req.get("memory", 0))
    return cpu, mem


def requested_per_node(pods: list[dict]) -> dict[str, list[float]]:
    """node → [cpu cores, memory bytes] requested by the pods bound to it."""
    used: dict[str, list[float]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            continue
        cpu, mem = pod_requests(p)
        u = used.setdefault(node, [0.0, 0.0])
        u[0] += cpu
        u[1] += mem
    return used


def node_capacity(node: dict) -> tuple[float, float, float]:
    """A node's allocatable cpu (cores), memory (bytes) and GPU (milli)."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    cores = max(quantity(alloc.get("cpu", "1")), 1e-3)
    mem = max(quantity(alloc.get("memory", "1Gi")), 1.0)
    return cores, mem, 1000.0 * quantity(alloc.get(GPU_RESOURCE, 0))


def pod_key(pod: dict) -> str:
    """``namespace/name``: how the log and :attr:`Exporter.skipped` name a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def usage_per_node(
    nodes: list[dict], pods: list[dict], rng: Any, skipped: dict[str, tuple[str, str]] | None = None
) -> dict[str, dict[str, float]]:
    """One scrape of the pods' annotated usage (``--usage-annotations``), summed per node: ``cpu`` and
    ``memory`` as fractions of the node's allocatable, ``gpu`` of its cards (0 without cards), and
    ``ls_pods``, the latency-sensitive pods on it. Every node in ``nodes`` gets an entry.

    A pod on a covered node whose annotation is not a JSON object, holds a value that is no finite
    number in range (``usage_annotation_problem``) or draws a non-finite scrape counts as idle, and goes
    into ``skipped`` (``namespace/name`` → (the annotation, why)): anyone can annotate a pod, and one
    bad pod must neither stop every node's refresh nor publish ``NaN``."""
    import numpy as np

    from rlsched.policy.dynamic.replay import (
        USAGE_ANNOTATION,
        parse_usage_annotation,
        usage_annotation_problem,
        usage_from_annotations,
    )
    from rlsched.policy.dynamic.usage import UsageModel

    caps = {n["metadata"]["name"]: node_capacity(n) for n in nodes}
    out = {name: {"cpu": 0.0, "memory": 0.0, "gpu": 0.0, "ls_pods": 0.0} for name in caps}
    bad: dict[str, tuple[str, str]] = {} if skipped is None else skipped
    placed: list[tuple[str, str, str, float, float, dict]] = []  # pod, annotation, node, requests, usage
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        ann = ((p.get("metadata") or {}).get("annotations") or {}).get(USAGE_ANNOTATION)
        if node not in caps or not ann:
            continue
        value = parse_usage_annotation(ann) if isinstance(ann, str) else None
        problem = "not a JSON object" if value is None else usage_annotation_problem(value)
        if problem is not None or value is None:
            bad[pod_key(p)] = (str(ann), problem or "not a JSON object")
            continue
        placed.append((pod_key(p), ann, node, *pod_requests(p), value))
    if not placed:
        return out
    usage = usage_from_annotations([v for *_, v in placed])
    cpu_f, mem_f, gpu_f = UsageModel().instant(usage, np.arange(len(placed)), rng)
    for k, (key, ann, node, cpu, mem, value) in enumerate(placed):
        cores, mem_cap, gpu_cap = caps[node]
        share = {
            "cpu": float(cpu_f[k]) * cpu / cores,
            "memory": float(mem_f[k]) * mem / mem_cap,
            "gpu": float(gpu_f[k]) * float(value.get("gpuMilli", 0)) / gpu_cap if gpu_cap > 0 else 0.0,
        }
        if not all(math.isfinite(v) for v in share.values()):  # a spread overflowing next to a tiny mean
            bad[key] = (ann, "its usage draw is not finite")
            continue
        entry = out[node]
        for column, v in share.items():
            entry[column] += v
        entry["ls_pods"] += 1.0 if value.get("ls") else 0.0
    return out


def base_load(node: str, column: str) -> float:
    """A stable per-node background utilization, 0.03..0.18."""
    return 0.03 + 0.15 * (zlib.crc32(f"{column}/{node}".encode()) % 1000) / 1000


@dataclass
class NodeLoad:
    cpu_cores: float
    memory_bytes: float
    util: dict[str, float]
    pinned: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    """``--usage-annotations`` only: unclipped cpu, memory and gpu utilization and ``ls_pods``."""
    counters: dict[str, float] = field(
        default_factory=lambda: {"idle": 0.0, "user": 0.0, "system": 0.0, "rx": 0.0, "tx": 0.0, "lo": 0.0, "disk": 0.0}
    )
    at: float = field(default_factory=time.time)

    def value(self, column: str) -> float:
        return self.pinned.get(column, self.util.get(column, 0.0))

    def advance(self, now: float) -> None:
        """Move the counters forward at the current rates."""
        dt = max(0.0, now - self.at)
        self.at = now
        cpu = self.value("cpu")
        c = self.counters
        c["idle"] += (1 - cpu) * dt
        c["user"] += cpu * 0.8 * dt
        c["system"] += cpu * 0.2 * dt
        c["rx"] += self.value("network") * LINK_BYTES_PER_S * dt
        c["tx"] += self.value("network") * LINK_BYTES_PER_S * dt
        c["lo"] += 5e8 * dt
        c["disk"] += self.value("disk") * dt


class Exporter:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.nodes: dict[str, NodeLoad] = {}
        self.pins: dict[str, dict[str, float]] = {}
        self.refreshes = 0
        self.last_success: float | None = None
        """``time.monotonic()`` at the end of the last successful refresh."""
        self.errors = 0
        self.failures_in_a_row = 0
        self.failing_since: float | None = None
        self.last_error: str | None = None
        self.skipped: dict[str, tuple[str, str]] = {}
        """``--usage-annotations``: the pods whose usage annotation the last refresh skipped → (it, why)."""
        self.invalid_annotations = 0
        """Distinct (pod, annotation) pairs skipped so far: each is logged once, when first seen."""
        self.api: Any = None
        self.targets_written: tuple[str, ...] = ()
        self.rng: Any = None
        if args.usage_annotations:
            import numpy as np

            self.rng = np.random.default_rng(args.usage_seed)

    # -- Kubernetes ----------------------------------------------------------------------------------
    def connect(self) -> None:
        import kubernetes

        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=self.args.kubeconfig, client_configuration=cfg)
        self.api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))

    def fetch(self) -> tuple[list[dict], list[dict]]:
        """List nodes and the pods that are not finished (blocking: runs in a thread)."""
        nodes = self.api.list_node(
            label_selector=self.args.node_selector or None,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        nodes = json.loads(nodes.data)["items"]
        pods = self.api.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        pods = json.loads(pods.data)["items"]
        return nodes, pods

    def apply(self, nodes: list[dict], pods: list[dict]) -> None:
        """Recompute every node's utilization (on the event loop, like the scrapes)."""
        now = time.time()
        seen = set()
        used = requested_per_node(pods)
        skipped: dict[str, tuple[str, str]] = {}
        usage = usage_per_node(nodes, pods, self.rng, skipped) if self.rng is not None else {}
        for n in nodes:
            name = n["metadata"]["name"]
            seen.add(name)
            cores, mem, _ = node_capacity(n)
            gauges: dict[str, float] = {}
            if self.rng is not None:
                gauges = usage[name]
                cpu_frac = min(gauges["cpu"], 1.0)
                util = {
                    "cpu": cpu_frac,
                    "memory": min(gauges["memory"], 1.0),
                    "network": min(1.0, 0.3 * cpu_frac),
                    "disk": min(1.0, 0.2 * cpu_frac),
                }
            else:
                cpu_used, mem_used = used.get(name, (0.0, 0.0))
                cpu_frac, mem_frac = min(cpu_used / cores, 1.0), min(mem_used / mem, 1.0)
                util = {
                    "cpu": min(1.0, base_load(name, "cpu") + 0.7 * cpu_frac),
                    "memory": min(1.0, base_load(name, "memory") + 0.75 * mem_frac),
                    "network": min(1.0, base_load(name, "network") * 0.5 + 0.3 * cpu_frac),
                    "disk": min(1.0, base_load(name, "disk") + 0.2 * cpu_frac),
                }
            entry = self.nodes.get(name)
            if entry is None:
                entry = self.nodes[name] = NodeLoad(cores, mem, util)
            else:
                entry.advance(now)
                entry.cpu_cores, entry.memory_bytes, entry.util = cores, mem, util
            entry.gauges = gauges
            entry.pinned = self.pins.get(name, {})
        for gone in set(self.nodes) - seen:
            del self.nodes[gone]
        self.note_skipped(skipped)
        self.refreshes += 1
        self.write_targets()

    def note_skipped(self, skipped: dict[str, tuple[str, str]]) -> None:
        """Log each newly skipped pod annotation once (again only when the annotation changes) and keep
        the current set, so that a bad pod that stays does not fill the log every refresh."""
        for key, (ann, why) in sorted(skipped.items()):
            if self.skipped.get(key, ("", ""))[0] != ann:
                self.invalid_annotations += 1
                log.warning("pod %s: usage annotation skipped (counts as idle): %s", key, why)
        self.skipped = skipped

    def write_targets(self) -> None:
        if not self.args.targets_dir:
            return
        names = tuple(sorted(self.nodes))
        if names == self.targets_written:
            return
        groups = [
            {
                "targets": [f"127.0.0.1:{self.args.port}"],
                "labels": {
                    "__metrics_path__": f"/nodes/{n}/metrics",
                    "instance": n,
                    "node": n,
                    "exporter": "rlsched-load-exporter",
                },
            }
            for n in names
        ]
        path = Path(self.args.targets_dir) / TARGETS_FILE
        tmp = path.with_suffix(".tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(groups, indent=1))
        os.replace(tmp, path)
        self.targets_written = names
        log.info("registered %d node targets in %s", len(names), path)

    def remove_targets(self) -> None:
        if self.args.targets_dir:
            (Path(self.args.targets_dir) / TARGETS_FILE).unlink(missing_ok=True)

    async def loop(self) -> None:
        while True:
            await self.refresh_once()
            await asyncio.sleep(self.args.refresh)

    async def refresh_once(self) -> None:
        """One list and apply; a failure keeps the last values served and is counted for ``/healthz``."""
        try:
            self.apply(*await asyncio.to_thread(self.fetch))
            self.last_success = time.monotonic()
            if self.last_error:
                log.info("refresh works again")
            self.last_error = None
            self.failures_in_a_row = 0
            self.failing_since = None
        except Exception as exc:  # noqa: BLE001 - keep serving the last values
            self.errors += 1
            self.failures_in_a_row += 1
            if self.failing_since is None:
                self.failing_since = time.time()
            msg = f"{type(exc).__name__}: {exc}"
            if msg != self.last_error:
                log.warning("refresh failed: %s", msg)
            self.last_error = msg

    # -- HTTP ----------------------------------------------------------------------------------------
    async def node_metrics(self, request: web.Request) -> web.Response:
        name = request.match_info["node"]
        entry = self.nodes.get(name)
        if entry is None:
            raise web.HTTPNotFound(text=f"no node {name}\n")
        entry.advance(time.time())
        c = entry.counters
        lines = [
            "# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.",
            "# TYPE node_cpu_seconds_total counter",
        ]
        for cpu in range(CPUS_EXPOSED):
            for mode in ("idle", "user", "system"):
                lines.append(f'node_cpu_seconds_total{{cpu="{cpu}",mode="{mode}"}} {c[mode]:.6f}')
        mem_total = entry.memory_bytes
        lines += [
            "# HELP node_memory_MemTotal_bytes Memory information field MemTotal_bytes.",
            "# TYPE node_memory_MemTotal_bytes gauge",
            f"node_memory_MemTotal_bytes {mem_total:.0f}",
            "# HELP node_memory_MemAvailable_bytes Memory information field MemAvailable_bytes.",
            "# TYPE node_memory_MemAvailable_bytes gauge",
            f"node_memory_MemAvailable_bytes {mem_total * (1 - entry.value('memory')):.0f}",
            "# HELP node_network_receive_bytes_total Network device statistic receive_bytes.",
            "# TYPE node_network_receive_bytes_total counter",
            f'node_network_receive_bytes_total{{device="eth0"}} {c["rx"]:.0f}',
            f'node_network_receive_bytes_total{{device="lo"}} {c["lo"]:.0f}',
            "# HELP node_network_transmit_bytes_total Network device statistic transmit_bytes.",
            "# TYPE node_network_transmit_bytes_total counter",
            f'node_network_transmit_bytes_total{{device="eth0"}} {c["tx"]:.0f}',
            f'node_network_transmit_bytes_total{{device="lo"}} {c["lo"]:.0f}',
            "# HELP node_disk_io_time_seconds_total Total seconds spent doing I/Os.",
            "# TYPE node_disk_io_time_seconds_total counter",
            f'node_disk_io_time_seconds_total{{device="nvme0n1"}} {c["disk"]:.6f}',
        ]
        if entry.gauges:
            g = entry.gauges
            lines += [
                "# HELP rlsched_node_utilization The pods' drawn usage on this node (fraction of capacity).",
                "# TYPE rlsched_node_utilization gauge",
                *(f'rlsched_node_utilization{{resource="{r}"}} {g[r]:.6f}' for r in ("cpu", "memory", "gpu")),
                "# HELP rlsched_node_latency_sensitive_pods Latency-sensitive pods on this node.",
                "# TYPE rlsched_node_latency_sensitive_pods gauge",
                f"rlsched_node_latency_sensitive_pods {g['ls_pods']:.0f}",
            ]
        lines.append("")
        return web.Response(
            text="\n".join(lines),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def loads(self, request: web.Request) -> web.Response:
        return web.json_response({n: {c: round(e.value(c), 6) for c in COLUMNS} for n, e in sorted(self.nodes.items())})

    async def pin(self, request: web.Request) -> web.Response:
        name = request.match_info["node"]
        try:
            body = await request.json()
            values = {str(k): float(v) for k, v in body.items() if k in COLUMNS}
        except (ValueError, AttributeError, TypeError):  # not JSON, not an object, a value not a number
            raise web.HTTPBadRequest(text='expected JSON like {"cpu": 0.8}\n') from None
        if not all(0 <= v <= 1 for v in values.values()):
            raise web.HTTPBadRequest(text="values are utilizations 0..1\n")
        if values and name not in self.pins and len(self.pins) >= MAX_PINS:
            raise web.HTTPConflict(text=f"{MAX_PINS} nodes are pinned already; PUT {{}} to a pinned node unpins it\n")
        entry = self.nodes.get(name)
        if entry is not None:
            entry.advance(time.time())  # the old rate up to now
            entry.pinned = values
        if values:
            self.pins[name] = values
        else:
            self.pins.pop(name, None)  # {}: back to the model, and the slot is free again
        return web.json_response({"node": name, "pinned": values})

    async def healthz(self, request: web.Request) -> web.Response:
        if self.refreshes == 0:
            return web.Response(status=503, text=f"no refresh yet ({self.last_error or 'starting'})\n")
        if self.failures_in_a_row >= UNHEALTHY_AFTER:
            since = time.strftime("%H:%M:%S", time.localtime(self.failing_since or time.time()))
            return web.Response(
                status=503,
                text=f"the last {self.failures_in_a_row} refreshes failed (since {since}), serving old values: "
                f"{self.last_error}\n",
            )
        age = time.monotonic() - (self.last_success or 0.0)
        if age > stale_after_s(self.args.refresh):
            return web.Response(
                status=503,
                text=f"no successful refresh for {age:.0f} s (bound {stale_after_s(self.args.refresh):g} s: "
                f"a list hangs?), serving old values\n",
            )
        return web.Response(text="ok\n")

    async def own_metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE rlsched_load_exporter_nodes gauge\n"
            f"rlsched_load_exporter_nodes {len(self.nodes)}\n"
            "# TYPE rlsched_load_exporter_refreshes_total counter\n"
            f"rlsched_load_exporter_refreshes_total {self.refreshes}\n"
            "# TYPE rlsched_load_exporter_refresh_errors_total counter\n"
            f"rlsched_load_exporter_refresh_errors_total {self.errors}\n"
            "# HELP rlsched_load_exporter_skipped_pods Pods whose usage annotation the last refresh skipped.\n"
            "# TYPE rlsched_load_exporter_skipped_pods gauge\n"
            f"rlsched_load_exporter_skipped_pods {len(self.skipped)}\n"
            "# HELP rlsched_load_exporter_invalid_usage_annotations_total Distinct bad (pod, annotation) seen.\n"
            "# TYPE rlsched_load_exporter_invalid_usage_annotations_total counter\n"
            f"rlsched_load_exporter_invalid_usage_annotations_total {self.invalid_annotations}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/nodes/{node}/metrics", self.node_metrics)
        app.router.add_get("/loads", self.loads)
        app.router.add_put("/loads/{node}", self.pin)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.own_metrics)
        return app


async def amain(args: argparse.Namespace) -> None:
    exp = Exporter(args)
    exp.connect()
    runner = web.AppRunner(exp.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    log.info("serving on http://%s:%d (nodes: %s)", args.host, args.port, args.node_selector or "all")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(exp.loop())
    try:
        await stop.wait()
    finally:
        task.cancel()
        exp.remove_targets()
        await runner.cleanup()
        log.info("stopped")


positive_seconds = finite_number(above=0)
"""``--refresh``: NaN makes ``asyncio.sleep`` never return, and 0 or less lists every node and pod of the
API server in a tight loop."""
tcp_port = integer(1, 65535)
"""``--port``: not 0 ("any free port"): the Prometheus targets name the port given."""
seed = integer(0)
"""``--usage-seed``: what ``numpy.random.default_rng`` accepts."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/load_exporter.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig (default $KUBECONFIG)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=tcp_port, default=9101)
    ap.add_argument("--refresh", type=positive_seconds, default=5.0, help="seconds between lists of nodes and pods")
    ap.add_argument("--node-selector", help="label selector of the nodes to cover (default: all)")
    ap.add_argument("--targets-dir", help="Prometheus file_sd folder to register the per-node targets in")
    ap.add_argument(
        "--usage-annotations",
        action="store_true",
        help="load = the pods' annotated usage model (rlsched.io/usage, the dynamic replay) instead of requests",
    )
    ap.add_argument("--usage-seed", type=seed, default=0, help="seed of the scrape-to-scrape usage draws (≥ 0)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.kubeconfig:
        ap.error("--kubeconfig (or $KUBECONFIG) is required")
    asyncio.run(amain(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
