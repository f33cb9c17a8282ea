#!/usr/bin/env python3
"""Scheduling throughput and latency: kube-scheduler + our extender vs the same kube-scheduler without it.

One run, one local control plane (``hack/local-cluster.sh``: etcd, kube-apiserver, controller-manager,
kwok), 1,000 kwok nodes (600 with 8 cards, 150 with 4, 250 CPU-only; 96 cores, 384 GiB each; four
card models), and for each *phase* a kube-scheduler process of its own (the same binary and the same
``clientConnection`` qps/burst):

- ``rl``: our configuration (``rlsched.extender.scheduler_config``: profile ``rl-scheduler``, score
  plugins off, ``percentageOfNodesToScore`` as ``--percentage-of-nodes-to-score``: 0, adaptive, as
  shipped; the extender's filter/bind on loopback, ``topK: 1``)
  with ``rlsched extender`` running (FGD unless ``--model``);
- ``default``: the stock profile (every default plugin, adaptive percentageOfNodesToScore), no
  extender, kube-scheduler's own binder;
- ``rl-noext`` (optional): our profile without the extender, to separate the profile's cost from
  the extender's.

Pods are openb-shaped (the 35 typical pods of ``extender/typical_default.json``, 4 GiB of memory per
core); shares of a card are given by the ``rlsched.io/gpu-milli`` *annotation*, so the very same pods
are valid for both profiles (the stock profile does not know our resource). Each phase runs two modes:

- **backlog**: ``--pods`` pods are created while no scheduler runs, then the scheduler starts;
  throughput = pods / (last bind − first bind) — what the scheduler sustains, independent of how fast
  pods can be created;
- **stream**: the scheduler runs and pods are created at ``--rate`` pods/s; per pod, the latency from
  its creation (the POST returned) to the watch showing it bound; p50/p99.

Also scraped from each kube-scheduler: ``scheduler_scheduling_attempt_duration_seconds`` (one
scheduling cycle, extender filter call included) and ``scheduler_pod_scheduling_sli_duration_seconds``
(queue entry to bound); from the extender, its ``filter`` and ``bind`` handling time.

**Where the CPU goes**: per component (every process with a pid file in the cluster's ``run/``
folder — etcd, kube-apiserver, kube-controller-manager, kwok, the phase's kube-scheduler, the
extender, Prometheus when it runs — and this benchmark's own process), utime+stime of the process
and its live descendants from ``/proc`` before and after each mode. At the end of each phase, with
its scheduler (and extender) still up and no pods, an idle window (``--idle`` s) gives each
component's background rate; rate × the mode's wall time is subtracted, and the rest is divided by
the pods bound: CPU-ms per scheduled pod, per component and in total, rl / default per component.

    .venv/bin/python benchmarks/scheduler_throughput.py                  # a fresh cluster in /tmp, torn down after
    .venv/bin/python benchmarks/scheduler_throughput.py --json out.json --phases rl,default,rl-noext

Numbers, machine load and commands: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("rlstack", REPO_ROOT / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]

NS = "bench"
MODELS8 = ("V100M16", "V100M32", "A100")
MODELS4 = ("T4",)
PROFILE = {"rl": "rl-scheduler", "default": "bench-default", "rl-noext": "rl-scheduler"}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def make_nodes(n: int) -> list[dict]:
    gpu8, gpu4 = int(n * 0.6), int(n * 0.15)
    nodes = []
    for i in range(n):
        if i < gpu8:
            cards, model = 8, MODELS8[i % len(MODELS8)]
        elif i < gpu8 + gpu4:
            cards, model = 4, MODELS4[0]
        else:
            cards, model = 0, ""
        nodes.append(rlstack.kwok_node(f"bench-node-{i:04d}", 96000, 384 * 1024, cards, model, labels={"bench": "1"}))
    return nodes


def make_pods(n: int, seed: int) -> list[dict[str, Any]]:
    """Shapes drawn from the typical pods (cpu, cards, milli), 4 GiB per core."""
    typical = json.loads((REPO_ROOT / "extender" / "typical_default.json").read_text())["typicalPods"]
    rng = random.Random(seed)
    weights = [t["weight"] for t in typical]
    out = []
    for i in range(n):
        t = rng.choices(typical, weights)[0]
        out.append(
            {
                "name": f"bench-{i:05d}",
                "cpu": t["cpuMilli"],
                "mem": max(256, t["cpuMilli"] * 4096 // 1000),
                "gpus": t["numGpu"],
                "milli": t["gpuMilli"],
            }
        )
    return out


def pod_body(shape: dict[str, Any], scheduler: str, prefix: str) -> dict:
    return rlstack.pod_manifest(
        f"{prefix}-{shape['name']}",
        shape["cpu"],
        shape["mem"],
        shape["gpus"],
        shape["milli"],
        scheduler_name=scheduler,
        share_as_annotation=True,
        labels={"bench": "1"},
    )


# -- metrics ----------------------------------------------------------------------------------------


def histogram(text: str, name: str, match: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """Cumulative (le, count) of a Prometheus histogram, summed over series whose labels match."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{") : line.rindex("}")]))
        if match and any(labels.get(k) != v for k, v in match.items()):
            continue
        le = float(labels["le"].replace("+Inf", "inf"))
        buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return sorted(buckets.items())


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile (linear within the bucket)."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def in_first_bucket(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The first bucket's upper bound when the ``q`` quantile falls in it (then the interpolated value
    says only "below that bound": between 0 and the bound nothing is measured), else None."""
    if not buckets or buckets[-1][1] == 0:
        return None
    le, count = buckets[0]
    return le if count >= q * buckets[-1][1] else None


def diff(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    b = dict(before)
    return [(le, c - b.get(le, 0.0)) for le, c in after]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


# -- CPU per component ------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")
BENCH_CLIENT = "benchmark client"
SETTLE_S = 3.0


def proc_cpu_ms(pid: int, children: bool = True) -> float:
    """utime+stime of ``pid`` (all its threads) and, with ``children``, of its live descendants; 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) * 1000.0 / CLK_TCK
    if children:
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                kids = task.read_text().split()
            except OSError:
                continue
            total += sum(proc_cpu_ms(int(k)) for k in kids)
    return total


def component(pid_file: str) -> str:
    if pid_file.startswith("bench-kube-scheduler-"):
        return "scheduler (phase's)"
    return {"bench-extender": "extender"}.get(pid_file, pid_file)


def cpu_snapshot(cluster: Any) -> dict[str, float]:
    """CPU ms so far of every stack process (``rlstack.Proc`` pid files in ``run/``) and of this one.
    Not its children: this process starts kube-scheduler and the extender, whose CPU would come back
    as reaped-children time."""
    out = {BENCH_CLIENT: proc_cpu_ms(os.getpid(), children=False)}
    for f in sorted(cluster.run_dir.glob("*.pid")):
        proc = rlstack.Proc(cluster, f.stem)
        if proc.alive() and proc.pid is not None:
            out[component(f.stem)] = out.get(component(f.stem), 0.0) + proc_cpu_ms(proc.pid)
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per component; one started in between counts from 0, one gone by ``after`` is left out."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def cpu_per_pod(used: dict[str, float], seconds: float, idle_rate: dict[str, float], pods: int) -> dict[str, Any]:
    """CPU-ms per pod of each component, its idle background (ms/s × ``seconds``) removed."""
    net = {k: v - idle_rate.get(k, 0.0) * seconds for k, v in used.items()}
    per = {k: round(v / max(pods, 1), 3) for k, v in sorted(net.items())}
    per["total"] = round(sum(net.values()) / max(pods, 1), 3)
    return {
        "seconds": round(seconds, 2),
        "pods": pods,
        "rawMs": {k: round(v, 1) for k, v in sorted(used.items())},
        "msPerPod": per,
    }


# -- the run ----------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Any):
        self.args, self.cluster = args, cluster
        self.extender = rlstack.Extender(cluster, "bench-extender")
        self.results: list[dict[str, Any]] = []
        self.procs: list[Any] = [self.extender]
        self.watch_restarts = 0
        """Everything started, stopped at the end whatever happens."""

    def scheduler_config(self, phase: str) -> dict:
        a = self.args
        if phase == "rl":
            return rlstack.rl_scheduler_config(
                self.cluster,
                self.extender.url,
                leader_elect=False,
                qps=a.qps,
                burst=a.burst,
                percentage_of_nodes_to_score=a.percentage_of_nodes_to_score,
            )
        if phase == "rl-noext":
            return rlstack.rl_scheduler_config(
                self.cluster,
                None,
                leader_elect=False,
                qps=a.qps,
                burst=a.burst,
                percentage_of_nodes_to_score=a.percentage_of_nodes_to_score,
            )
        return rlstack.rl_scheduler_config(
            self.cluster,
            None,
            scheduler_name=PROFILE["default"],
            leader_elect=False,
            qps=a.qps,
            burst=a.burst,
            default_profile=True,
        )

    async def wait_empty(self, api: Any) -> None:
        """Delete every pod of the namespace and wait until they are gone (a deletecollection of
        thousands of pods can outlast the API server's 60 s request timeout: retry)."""
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                await api.delete_collection(f"/api/v1/namespaces/{NS}/pods")
                items, _ = await api.list(f"/api/v1/namespaces/{NS}/pods", {"limit": "1"})
                if not items:
                    return
            except (TimeoutError, rlstack.ApiError, OSError) as exc:
                log(f"deleting the pods: {type(exc).__name__}: {exc}; retrying")
            except Exception as exc:  # noqa: BLE001 - aiohttp.ServerDisconnectedError and the like
                log(f"deleting the pods: {type(exc).__name__}: {exc}; retrying")
            await asyncio.sleep(1)
        raise RuntimeError("pods of the previous phase did not go away")

    async def watch_bound(
        self, api: Any, rv: str, expected: set[str], bound: dict[str, float], done: asyncio.Event
    ) -> None:
        """Record when each expected pod is first seen bound. Survives the API server ending or
        dropping the watch under load (resume from the last resourceVersion; relist on 410 or
        errors — pods first seen bound in a relist get the relist's time)."""

        def see(obj: dict, now: float) -> None:
            name = obj["metadata"]["name"]
            if name in expected and name not in bound and obj["spec"].get("nodeName"):
                bound[name] = now

        path = f"/api/v1/namespaces/{NS}/pods"
        while len(bound) < len(expected):
            try:
                async for typ, obj in api.watch(path, rv, timeout_s=300):
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if typ in ("ADDED", "MODIFIED"):
                        see(obj, time.monotonic())
                        if len(bound) == len(expected):
                            break
                    elif typ == "ERROR":
                        raise rlstack.ApiError(int(obj.get("code", 0)), str(obj.get("message")), "watch")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - 410 Gone, disconnects: relist and go on
                self.watch_restarts += 1
                log(f"watch ended ({type(exc).__name__}: {str(exc)[:120]}); relisting")
                while True:
                    try:
                        items, rv = await api.list(path)
                        break
                    except Exception:  # noqa: BLE001
                        await asyncio.sleep(1)
                now = time.monotonic()
                for obj in items:
                    see(obj, now)
        done.set()

    async def run_phase(self, api: Any, phase: str, shapes: list[dict], round_: int) -> dict[str, Any]:
        a = self.args
        sched = rlstack.KubeScheduler(self.cluster, f"bench-kube-scheduler-{phase}")
        self.procs.append(sched)
        profile = PROFILE[phase]
        result: dict[str, Any] = {
            "phase": phase,
            "round": round_,
            "pods": len(shapes),
            "nodes": a.nodes,
            "qps": a.qps,
            "burst": a.burst,
            "loadavgStart": loadavg(),
        }
        # Counted from here: the scheduler's log is appended to across rounds, the watch is shared.
        restarts_before = self.watch_restarts
        log_start = sched.log_path.stat().st_size if sched.log_path.exists() else 0
        if phase == "rl" and not self.extender.alive():
            settings: dict[str, Any] = {"log": {"level": "WARNING"}}
            for item in a.extender_set:
                key, value = item.split("=", 1)
                section, _, field = key.rpartition(".")
                target = settings
                for part in filter(None, section.split(".")):
                    target = target.setdefault(part, {})
                target[field] = yaml.safe_load(value)
            result["extenderSettings"] = settings
            await asyncio.to_thread(self.extender.start_with, model=a.model, settings=settings)
        ext_before = self.extender.metrics() if phase == "rl" else ""

        # -- backlog: create everything, then start the scheduler
        await self.wait_empty(api)
        prefix = f"{phase.replace('-', '')}{round_}b"
        bodies = [pod_body(s, profile, prefix) for s in shapes]
        t0 = time.monotonic()
        await api.create_many(f"/api/v1/namespaces/{NS}/pods", bodies, parallel=a.parallel)
        result["createSeconds"] = round(time.monotonic() - t0, 2)
        result["createRate"] = round(len(bodies) / (time.monotonic() - t0), 1)
        _, rv = await api.list(f"/api/v1/namespaces/{NS}/pods", {"limit": "1"})
        expected = {b["metadata"]["name"] for b in bodies}
        bound: dict[str, float] = {}
        done = asyncio.Event()
        watcher = asyncio.create_task(self.watch_bound(api, rv, expected, bound, done))
        # The extender must have seen the pods (pending) before its first filter; the stock phase waits
        # as long, so neither window holds the creation burst's tail. The extender's reading of each
        # new pending pod is outside the window (~0.03 CPU-ms a pod, docs/benchmarks.md).
        await asyncio.sleep(1.0)
        api_b0 = await asyncio.to_thread(self.apiserver_metrics)
        cpu0 = cpu_snapshot(self.cluster)
        t_start = time.monotonic()
        await asyncio.to_thread(sched.start_with, self.scheduler_config(phase), None, 1, 120, bool(a.pprof_dir))
        metrics_before = await asyncio.to_thread(sched.metrics)
        profile_task = (
            asyncio.create_task(asyncio.to_thread(sched.cpu_profile, a.pprof_seconds)) if a.pprof_dir else None
        )
        try:
            await asyncio.wait_for(done.wait(), a.timeout)
        except TimeoutError:
            log(f"{phase}: only {len(bound)}/{len(expected)} bound after {a.timeout}s")
        watcher.cancel()
        if profile_task is not None:
            out = Path(a.pprof_dir) / f"kube-scheduler-{phase}-{round_}-backlog.pprof"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(await profile_task)
            result["backlogProfile"] = str(out)
        cpu_used = {"backlog": (cpu_delta(cpu0, cpu_snapshot(self.cluster)), time.monotonic() - t_start, len(bound))}
        times = sorted(bound.values())
        # A backlog that did not finish is marked: its rate is over the pods that were bound.
        result["backlog"] = {"expected": len(expected), "bound": len(times), "complete": len(times) == len(expected)}
        if len(times) >= 2:
            result["backlog"] |= {
                "podsPerSecond": round((len(times) - 1) / (times[-1] - times[0]), 1),
                "podsPerSecondFromStart": round(len(times) / (times[-1] - t_start), 1),
                "podsPerSecondMiddle80": round(
                    0.8 * len(times) / (times[int(0.9 * len(times)) - 1] - times[int(0.1 * len(times))]), 1
                ),
                "seconds": round(times[-1] - times[0], 2),
            }
        m_backlog = await asyncio.to_thread(sched.metrics)
        result["backlog"]["attemptP50Ms"], result["backlog"]["attemptP99Ms"] = self.q_ms(
            diff(
                histogram(m_backlog, "scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}),
                histogram(metrics_before, "scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}),
            )
        )
        ext_mid = await asyncio.to_thread(self.extender.metrics) if phase == "rl" else None
        api_b1 = await asyncio.to_thread(self.apiserver_metrics)
        self.bind_latency(result["backlog"], api_b0, api_b1, ext_before if phase == "rl" else None, ext_mid)
        result["loadavgBacklog"] = loadavg()
        log(f"{phase} backlog: {result['backlog']}  load {loadavg()}")

        # -- stream: scheduler running, pods at a fixed rate. The scheduler is stopped while the
        # backlog's leftovers are deleted (it would keep retrying them) and started again.
        await asyncio.to_thread(sched.stop)
        await self.wait_empty(api)
        await asyncio.sleep(SETTLE_S)  # the deletions' tail (kwok, controllers) out of the CPU window
        await asyncio.to_thread(sched.start_with, self.scheduler_config(phase), None, 1)
        prefix = f"{phase.replace('-', '')}{round_}s"
        bodies = [pod_body(s, profile, prefix) for s in shapes[: a.stream_pods]]
        _, rv = await api.list(f"/api/v1/namespaces/{NS}/pods", {"limit": "1"})
        expected = {b["metadata"]["name"] for b in bodies}
        bound, created = {}, {}
        done = asyncio.Event()
        watcher = asyncio.create_task(self.watch_bound(api, rv, expected, bound, done))
        m0 = await asyncio.to_thread(sched.metrics)
        api_s0 = await asyncio.to_thread(self.apiserver_metrics)
        ext_s0 = await asyncio.to_thread(self.extender.metrics) if phase == "rl" else None
        cpu0 = cpu_snapshot(self.cluster)
        t0 = time.monotonic()
        sem = asyncio.Semaphore(a.parallel)

        async def create(i: int, b: dict) -> None:
            await asyncio.sleep(max(0.0, t0 + i / a.rate - time.monotonic()))
            async with sem:
                await api.create(f"/api/v1/namespaces/{NS}/pods", b)
                created[b["metadata"]["name"]] = time.monotonic()

        await asyncio.gather(*(create(i, b) for i, b in enumerate(bodies)))
        offered = len(bodies) / (time.monotonic() - t0)
        try:
            await asyncio.wait_for(done.wait(), a.timeout)
        except TimeoutError:
            log(f"{phase}: stream: only {len(bound)}/{len(expected)} bound after {a.timeout}s")
        watcher.cancel()
        cpu_used["stream"] = (cpu_delta(cpu0, cpu_snapshot(self.cluster)), time.monotonic() - t0, len(bound))
        lat = [max(0.0, bound[n] - created[n]) * 1000 for n in bound if n in created]
        # A pod never bound counts as the wait it had when the run gave up (a lower bound): dropping it
        # made the percentiles of a run that lost pods look better than one that bound them all.
        ended = time.monotonic()
        lat += [max(0.0, ended - created[n]) * 1000 for n in expected - bound.keys() if n in created]
        m1 = await asyncio.to_thread(sched.metrics)
        result["stream"] = {
            "offeredRate": round(offered, 1),
            "expected": len(expected),
            "bound": len(bound),
            "complete": len(bound) == len(expected),
            "latencyP50Ms": round(pct(lat, 0.5), 1),
            "latencyP90Ms": round(pct(lat, 0.9), 1),
            "latencyP99Ms": round(pct(lat, 0.99), 1),
            "latencyMaxMs": round(max(lat), 1),
        }
        result["stream"]["attemptP50Ms"], result["stream"]["attemptP99Ms"] = self.q_ms(
            diff(
                histogram(m1, "scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}),
                histogram(m0, "scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}),
            )
        )
        result["stream"]["sliP50Ms"], result["stream"]["sliP99Ms"] = self.q_ms(
            diff(
                histogram(m1, "scheduler_pod_scheduling_sli_duration_seconds"),
                histogram(m0, "scheduler_pod_scheduling_sli_duration_seconds"),
            )
        )
        api_s1 = await asyncio.to_thread(self.apiserver_metrics)
        ext_s1 = await asyncio.to_thread(self.extender.metrics) if phase == "rl" else None
        self.bind_latency(result["stream"], api_s0, api_s1, ext_s0, ext_s1)
        result["loadavgStream"] = loadavg()
        log(f"{phase} stream: {result['stream']}  load {loadavg()}")
        if phase == "rl":
            ext = self.extender.metrics()
            for verb in ("filter", "bind"):
                h = diff(
                    histogram(ext, "rlsched_extender_request_seconds", {"verb": verb, "code": "200"}),
                    histogram(ext_before, "rlsched_extender_request_seconds", {"verb": verb, "code": "200"}),
                )
                result[f"extender{verb.title()}P50Ms"], result[f"extender{verb.title()}P99Ms"] = self.q_ms(h)
            status = self.extender.status()
            result["policy"] = rlstack.describe_policy(status)
        with sched.log_path.open("rb") as f:
            f.seek(log_start)
            phase_log = f.read().decode(errors="replace").splitlines()
        result["schedulerExtenderErrors"] = sum(
            1 for ln in phase_log if ln.startswith("E") and "extender" in ln.lower()
        )
        result["schedulerErrors"] = sum(1 for ln in phase_log if ln.startswith("E") and "retrying" in ln)
        result["watchRestarts"] = self.watch_restarts - restarts_before
        # -- idle: the same stack (this phase's scheduler and extender up), no pods
        await self.wait_empty(api)
        await asyncio.sleep(SETTLE_S)
        cpu0, t0 = cpu_snapshot(self.cluster), time.monotonic()
        await asyncio.sleep(a.idle)
        idle_s = time.monotonic() - t0
        rate = {k: v / idle_s for k, v in cpu_delta(cpu0, cpu_snapshot(self.cluster)).items()}
        result["cpu"] = {
            "idleSeconds": round(idle_s, 2),
            "idleMsPerSecond": {k: round(v, 2) for k, v in sorted(rate.items())},
            **{mode: cpu_per_pod(used, secs, rate, n) for mode, (used, secs, n) in cpu_used.items()},
        }
        log(f"{phase} CPU-ms per pod: { {m: result['cpu'][m]['msPerPod']['total'] for m in cpu_used} }")
        await asyncio.to_thread(sched.stop)
        if phase == "rl":  # the other phases run without it (and it need not follow their pods)
            await asyncio.to_thread(self.extender.stop)
        return result

    def apiserver_metrics(self) -> str | None:
        """kube-apiserver's /metrics (the admin's kubectl; a few ms of client CPU outside every window), or
        None when it cannot be read: an API server swamped by a stalled run must not end the benchmark
        before it reports (the handler's figures are then missing)."""
        try:
            return str(self.cluster.kubectl("get", "--raw", "/metrics", timeout=60).stdout)
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            log(f"kube-apiserver's /metrics could not be read: {exc}")
            return None

    def bind_latency(
        self, mode: dict[str, Any], api0: str | None, api1: str | None, ext0: str | None, ext1: str | None
    ) -> None:
        """Into ``mode``: the API server's own binding handler (``POST pods/binding``) p50/p99 over the
        window, and with the extender the time its bind verb took (which includes that POST); and their
        ratio. The API server's buckets are coarse (5, 25, 50, 100 ms …): its p50 is interpolated."""
        match = {"resource": "pods", "subresource": "binding"}
        handler = (
            diff(
                histogram(api1, "apiserver_request_duration_seconds", match),
                histogram(api0, "apiserver_request_duration_seconds", match),
            )
            if api0 is not None and api1 is not None  # either unreadable: no figure over the wrong window
            else []
        )
        mode["apiserverBindingP50Ms"], mode["apiserverBindingP99Ms"] = self.q_ms(handler)
        mode["apiserverBindings"] = int(handler[-1][1]) if handler else 0
        below = in_first_bucket(handler, 0.5)
        if below is not None:
            # Most binds under the first bucket (5 ms): the interpolated p50 is the bucket's middle,
            # whatever the handler took, and no ratio can be made of it.
            mode["apiserverBindingP50Ms"], mode["apiserverBindingP50BelowMs"] = None, round(below * 1000, 2)
        if ext0 is not None and ext1 is not None:
            verb = {"verb": "bind", "code": "200"}
            ours = diff(
                histogram(ext1, "rlsched_extender_request_seconds", verb),
                histogram(ext0, "rlsched_extender_request_seconds", verb),
            )
            mode["extenderBindP50Ms"], mode["extenderBindP99Ms"] = self.q_ms(ours)
            if mode["extenderBindP50Ms"] and mode["apiserverBindingP50Ms"]:
                mode["extenderBindOverApiserverP50"] = round(
                    mode["extenderBindP50Ms"] / mode["apiserverBindingP50Ms"], 2
                )
            write = diff(
                histogram(ext1, "rlsched_extender_binding_write_seconds", {"result": "ok"}),
                histogram(ext0, "rlsched_extender_binding_write_seconds", {"result": "ok"}),
            )
            mode["bindingWriteP50Ms"], mode["bindingWriteP99Ms"] = self.q_ms(write)
            if mode["extenderBindP50Ms"] and mode["bindingWriteP50Ms"]:
                mode["extenderBindOverWriteP50"] = round(mode["extenderBindP50Ms"] / mode["bindingWriteP50Ms"], 2)
            # Calls that waited for one of the extender's API connections (all busy): how many and how long.
            slot = diff(
                histogram(ext1, "rlsched_extender_api_slot_wait_seconds"),
                histogram(ext0, "rlsched_extender_api_slot_wait_seconds"),
            )
            mode["apiSlotWaits"] = int(slot[-1][1]) if slot else 0
            mode["apiSlotWaitP50Ms"], mode["apiSlotWaitP99Ms"] = self.q_ms(slot)
            results = {}
            for line in ext1.splitlines():
                m = re.match(r'rlsched_extender_binds_total\{result="(\w+)"\} (\S+)', line)
                if m:
                    results[m.group(1)] = float(m.group(2))
            for line in ext0.splitlines():
                m = re.match(r'rlsched_extender_binds_total\{result="(\w+)"\} (\S+)', line)
                if m:
                    results[m.group(1)] = results.get(m.group(1), 0.0) - float(m.group(2))
            mode["extenderBinds"] = {k: int(v) for k, v in sorted(results.items()) if v}

    @staticmethod
    def q_ms(buckets: list[tuple[float, float]]) -> tuple[float | None, float | None]:
        p50, p99 = quantile(buckets, 0.5), quantile(buckets, 0.99)
        return (None if p50 is None else round(p50 * 1000, 2), None if p99 is None else round(p99 * 1000, 2))

    async def run(self) -> None:
        a = self.args
        log(f"creating {a.nodes} kwok nodes (load {loadavg()})")
        took = await asyncio.to_thread(rlstack.create_nodes, self.cluster, make_nodes(a.nodes))
        log(f"{a.nodes} nodes Ready in {took:.1f}s")
        await asyncio.to_thread(rlstack.ensure_namespace, self.cluster, NS)
        shapes = make_pods(a.pods, a.seed)
        async with rlstack.Api(self.cluster, connections=a.parallel + 4) as api:
            for r in range(a.repeat):
                for phase in a.phases.split(","):
                    self.results.append(await self.run_phase(api, phase, shapes, r))
        self.extender.stop()


def summarize(results: list[dict[str, Any]]) -> str:
    lines = [
        "| phase | round | backlog bound / pods | backlog pods/s (first→last bind) | middle 80 % "
        "| attempt p50 / p99 ms | stream offered | stream bound / pods | creation→bound p50 / p99 ms "
        "| SLI p99 ms | load (1-min) |",
        "|---|---:|---:|---:|---:|---|---:|---:|---|---:|---|",
    ]
    for r in results:
        b, s = r.get("backlog", {}), r.get("stream", {})
        lines.append(
            f"| {r['phase']} | {r['round']} | {b.get('bound')} / {b.get('expected')} | {b.get('podsPerSecond')} | "
            f"{b.get('podsPerSecondMiddle80')} | {b.get('attemptP50Ms')} / {b.get('attemptP99Ms')} | "
            f"{s.get('offeredRate')} | {s.get('bound')} / {s.get('expected')} | "
            f"{s.get('latencyP50Ms')} / {s.get('latencyP99Ms')} | {s.get('sliP99Ms')} | "
            f"{r['loadavgStart'].split('/')[0]}–{r.get('loadavgStream', '?').split('/')[0]} |"
        )
    incomplete = [
        f"{r['phase']} round {r['round']} {mode}"
        for r in results
        for mode in ("backlog", "stream")
        if not (r.get(mode) or {}).get("complete", True)
    ]
    if incomplete:
        lines.append(
            "\nNot every pod was bound in: " + ", ".join(incomplete) + " (a stream counts each unbound pod "
            "as the wait it had at the end; a backlog's rate is over the pods bound)"
        )
    by = {}
    for r in results:
        if r.get("backlog", {}).get("podsPerSecond") is not None:
            by.setdefault(r["phase"], []).append(r["backlog"]["podsPerSecond"])
    if "rl" in by and "default" in by:
        rl, df = sum(by["rl"]) / len(by["rl"]), sum(by["default"]) / len(by["default"])
        lines.append(f"\nrl / default backlog throughput: {rl:.1f} / {df:.1f} = **{rl / df:.2f}**")
    return "\n".join(lines + ["", bind_table(results), "", cpu_table(results)])


def bind_table(results: list[dict[str, Any]]) -> str:
    """The API server's binding handler against the extender's bind verb, per phase and mode."""
    lines = [
        "Bind latency (ms): the API server's POST pods/binding handler, that POST as the extender saw it "
        "(request sent → answer read), and the extender's bind verb (which makes that POST):",
        "| phase | round | mode | API server p50 / p99 | bindings | the POST seen by the extender p50 / p99 "
        "| extender bind p50 / p99 | ratio p50 (bind / API server) | bind / POST p50 | extender binds |",
        "|---|---:|---|---|---:|---|---|---:|---:|---|",
    ]
    for r in results:
        for mode in ("backlog", "stream"):
            m = r.get(mode) or {}
            if "apiserverBindingP50Ms" not in m:
                continue
            ours = f"{m['extenderBindP50Ms']} / {m['extenderBindP99Ms']}" if "extenderBindP50Ms" in m else "–"
            p50 = m["apiserverBindingP50Ms"]
            if "apiserverBindingP50BelowMs" in m:
                p50 = f"< {m['apiserverBindingP50BelowMs']:g}"
            handler = f"{p50} / {m['apiserverBindingP99Ms']}"
            write = f"{m['bindingWriteP50Ms']} / {m['bindingWriteP99Ms']}" if "bindingWriteP50Ms" in m else "–"
            lines.append(
                f"| {r['phase']} | {r['round']} | {mode} | {handler} | "
                f"{m['apiserverBindings']} | {write} | {ours} | {m.get('extenderBindOverApiserverP50', '–')} | "
                f"{m.get('extenderBindOverWriteP50', '–')} | {m.get('extenderBinds', '–')} |"
            )
    return "\n".join(lines)


def cpu_table(results: list[dict[str, Any]]) -> str:
    """CPU-ms per scheduled pod, per component: each phase's backlog and stream (the first round of
    each phase), and rl / default where both ran."""
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        if "cpu" in r:
            first.setdefault(r["phase"], r["cpu"])
    phases = list(first)
    if not phases:
        return ""
    ratio = "rl" in first and "default" in first
    comps = sorted({c for cpu in first.values() for m in ("backlog", "stream") for c in cpu[m]["msPerPod"]} - {"total"})
    head = ["component"]
    for mode in ("backlog", "stream"):
        head += [f"{p} {mode}" for p in phases] + ([f"rl/default {mode}"] if ratio else [])
    lines = [
        "CPU-ms per scheduled pod (idle background subtracted):",
        "| " + " | ".join(head) + " |",
        "|---" + "|---:" * (len(head) - 1) + "|",
    ]
    for c in [*comps, "total"]:
        row = [f"**{c}**" if c == "total" else c]
        for mode in ("backlog", "stream"):
            vals = {p: first[p][mode]["msPerPod"].get(c) for p in phases}
            row += ["–" if v is None else f"{v:.2f}" for v in vals.values()]
            if ratio:
                rl, df = vals.get("rl"), vals.get("default")
                row.append(f"{rl / df:.2f}" if rl is not None and df is not None and min(rl, df) > 0.05 else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/scheduler_throughput.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=5000, help="pods per backlog run")
    ap.add_argument("--stream-pods", type=int, default=5000, help="pods per stream run")
    ap.add_argument("--rate", type=float, default=100.0, help="stream: pods created per second")
    ap.add_argument("--phases", default="rl,default", help="comma list of rl, default, rl-noext")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the phases")
    ap.add_argument("--model", help="model file for the extender (default: none, FGD serves)")
    ap.add_argument(
        "--extender-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extender setting (config-file key, dotted), e.g. kubernetes.writeTimeoutS=4.5",
    )
    ap.add_argument("--qps", type=float, default=5000, help="clientConnection.qps of every kube-scheduler")
    ap.add_argument("--burst", type=int, default=5000, help="clientConnection.burst of every kube-scheduler")
    ap.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=0,
        help="percentageOfNodesToScore of the rl and rl-noext phases' kube-scheduler: 0 (adaptive, our "
        "default) or 1-100 (docs/benchmarks.md)",
    )
    ap.add_argument("--parallel", type=int, default=32, help="concurrent pod creations")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run before giving up")
    ap.add_argument(
        "--pprof-dir",
        help="take a Go CPU profile of each phase's kube-scheduler during its backlog and write it here "
        "(read it with `go tool pprof`); the profiling costs some CPU, so leave it off for the figures",
    )
    ap.add_argument("--pprof-seconds", type=float, default=6.0, help="length of that profile")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of the idle window per phase (CPU background)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cluster-dir", help="use this running hack/local-cluster.sh state folder (else a fresh one)")
    ap.add_argument("--keep", action="store_true", help="leave the fresh cluster up")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    own = args.cluster_dir is None
    state = Path(args.cluster_dir or tempfile.mkdtemp(prefix="rlsched-bench-"))
    env = dict(os.environ, RLSCHED_CLUSTER_DIR=str(state))
    for var in [k for k in env if k.startswith("RLSCHED_") and k.endswith("_PORT")]:
        env.pop(var)
    script = str(REPO_ROOT / "hack" / "local-cluster.sh")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    if own:
        log(f"starting a cluster in {state} (load {loadavg()})")
        subprocess.run(
            [script, "up", "--no-scheduler", "--no-prometheus"], env=env, check=True, stdout=subprocess.DEVNULL
        )
    cluster = rlstack.LocalCluster(state.resolve())
    bench = Bench(args, cluster)

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        asyncio.run(bench.run())
    except KeyboardInterrupt:
        log("interrupted; stopping what was started")
    finally:
        for p in bench.procs:
            p.stop()
        if own and not args.keep:
            subprocess.run([script, "down"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(state, ignore_errors=True)
    report = {
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "args": vars(args),
        "results": bench.results,
    }
    print(summarize(bench.results))
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
