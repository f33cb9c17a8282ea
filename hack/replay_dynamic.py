#!/usr/bin/env python3
"""Replay one living-cluster slice through the real stack and compare its measures with the simulator.

The dynamic counterpart of ``hack/replay_openb.py`` (docs/replay.md, "Dynamic replay"). One run of
the living-cluster simulator (``rlsched.policy.dynamic``) is drawn with the simulator's own code
(``rlsched.policy.dynamic.replay.draw_slice``: the same seed gives the same pods, arrival times,
lifetimes and per-pod usage as ``run_dynamic``) on a deterministic sample of openb nodes, and played
on a local control plane ``--compression`` times faster than simulated time:

- the openb nodes are kwok nodes; kube-scheduler (profile ``rl-scheduler``) with our extender places
  every pod; the steady-state start's pods are submitted first, oldest first, one at a time (each
  bound or marked Unschedulable before the next), then each arrival at its compressed time;
- kwok ends each pod: ``hack/kwok/pod-lifetime.yaml`` deletes a Running pod ``rlsched.io/lifetime``
  (compressed) after it started, or at ``rlsched.io/ends-at`` for a start pod (its simulated end,
  measured from the window's start, as in the simulator);
- the load exporter (``--usage-annotations``) publishes each node's usage from the pods' annotated
  usage model, drawn afresh at every refresh like the simulator's scrapes, and Prometheus scrapes it;
  the extender reads that usage back as node load every compressed scrape interval (``--extender-load``).

Measured on the real stack: GPU allocation sampled at the simulator's scrape ticks from the pods'
bound and deleted times, queueing delay (creation → bound, from the watch), the SLA measures from
what Prometheus holds at each tick (``rlsched_node_utilization``, ``rlsched_node_latency_sensitive_pods``),
pods still pending and rejected. The same measures from ``run_dynamic`` on the same slice with the
same policy and the extender's tie-break (``TieBreak.by_name``) stand beside them, with the spread of
the simulator over other tie-break seeds; exit status 1 when a measure is outside its tolerance. The SLA
measures also fail when more than ``MISSING_ALLOWANCE`` of the node-ticks have no sample in Prometheus
(a missing sample would count as an idle node), or when the load exporter is not alive and healthy
right after the drive.

    export RLSCHED_OPENB_DIR=~/clusterdata/cluster-trace-gpu-v2023/csv   # the openb files (or --nodes, --pods)
    .venv/bin/python hack/replay_dynamic.py                                 # 150 nodes, 30 simulated minutes, fgd
    .venv/bin/python hack/replay_dynamic.py --node-count 40 --window 600    # a quick check
    .venv/bin/python hack/replay_dynamic.py --model policy/models/ppo-openb-dynamic.npz --json out.json

A fresh cluster (with Prometheus and the lifetime stage) is started in a temporary folder and torn
down afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("replay_openb", REPO_ROOT / "hack" / "replay_openb.py")
replay_openb = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules.setdefault("replay_openb", replay_openb)
_spec.loader.exec_module(replay_openb)  # type: ignore[union-attr]
rlstack = replay_openb.rlstack

from rlsched.arg_types import finite_number, integer  # noqa: E402
from rlsched.policy.cluster import ClusterState  # noqa: E402
from rlsched.policy.dynamic.arrivals import ArrivalSettings  # noqa: E402
from rlsched.policy.dynamic.replay import (  # noqa: E402
    ENDS_AT_ANNOTATION,
    LIFETIME_ANNOTATION,
    USAGE_ANNOTATION,
    Compression,
    PodTimeline,
    SlicePod,
    Tolerance,
    compare,
    draw_slice,
    format_comparison,
    measure_timelines,
    sample_nodes,
    tick_times,
)
from rlsched.policy.dynamic.simulator import DynamicSettings, run_dynamic  # noqa: E402
from rlsched.policy.scorers import TieBreak, make_scorer  # noqa: E402
from rlsched.policy.trace import load_nodes, load_pods, missing_input, output_problem  # noqa: E402
from rlsched.policy.typical import typical_pods  # noqa: E402

DATA = replay_openb.DATA
NS = "replay-dynamic"
LIFETIME_STAGE = REPO_ROOT / "hack" / "kwok" / "pod-lifetime.yaml"
log = replay_openb.log

TOLERANCES = {
    "mean_allocated_gpu_pct": Tolerance(absolute=3.0, relative=0.05),
    "wait_p50_s": Tolerance(absolute=60.0, relative=0.5),
    "wait_p99_s": Tolerance(absolute=120.0, relative=0.5),
    "sla_hot_node_pct": Tolerance(absolute=1.0, relative=0.25),
    "sla_ls_pod_seconds": Tolerance(absolute=3600.0, relative=0.35),
    "still_waiting": Tolerance(absolute=5.0, relative=0.5),
    "rejected": Tolerance(absolute=0.0, relative=0.0),
}
"""|real − sim| ≤ max(absolute, relative·|sim|), in the measure's unit (simulated seconds, %, pods).
Why each (docs/replay.md): allocation moves little with placement order; waits on a saturated
cluster hang on kube-scheduler's retry backoff (1–10 real s, 6–60 simulated s at 6×) and on which
pod gets a freed node first; the SLA measures are threshold crossings of noisy usage, drawn by the
exporter from the same model but not the same random numbers, and read up to one scrape late."""


SLA_METRICS = ("sla_hot_node_pct", "sla_ls_pod_seconds")
"""The measures read from what Prometheus holds (:func:`published_sla`): only as good as that data."""
MISSING_ALLOWANCE = 0.02
"""Largest share of node-ticks without a Prometheus sample for which the SLA measures still count. A
missing sample counts as "not hot, no latency-sensitive pod", so missing data biases both measures
down; 2 % allows a scrape lost here and there (a node's first tick, one slow scrape), not an exporter
or Prometheus that stopped for part of the window (which fails the run instead)."""


def go_duration(seconds: float) -> str:
    """A Go ``time.ParseDuration`` string (milliseconds resolution)."""
    return f"{max(seconds, 0.001):.3f}s"


def rfc3339(t: float) -> str:
    """``t`` (seconds since the epoch) as RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_body(pod: SlicePod, name: str, compression: Compression, t0: float) -> dict[str, Any]:
    """The pod of one slice entry: the trace pod's requests, its usage model and its end."""
    ann = {
        USAGE_ANNOTATION: json.dumps(pod.usage, separators=(",", ":")),
        LIFETIME_ANNOTATION: go_duration(compression.real(pod.lifetime_s)),
    }
    if pod.initial:
        ann[ENDS_AT_ANNOTATION] = rfc3339(t0 + compression.real(pod.lifetime_s))
    return rlstack.pod_from_spec(
        pod.spec, name=name, scheduler_name=rlstack.SCHEDULER_NAME, labels={"replay": "dynamic"}, annotations=ann
    )


def pod_name(pod: SlicePod) -> str:
    return f"d{pod.index:05d}-{rlstack.k8s_name(pod.spec.name)}"[:63].rstrip("-")


async def drive(
    cluster: Any, pods: Sequence[SlicePod], compression: Compression, window_s: float, lead_s: float
) -> tuple[dict[str, PodTimeline], float, dict[str, Any]]:
    """Submit the slice and watch it; returns each pod's timeline, the real time of simulated 0 and notes."""
    timelines = {pod_name(p): PodTimeline(p) for p in pods}
    notes: dict[str, Any] = {}
    async with rlstack.Api(cluster, connections=8) as api:
        path = f"/api/v1/namespaces/{NS}/pods"
        _, rv = await api.list(path, {"limit": "1"})
        waiting: dict[str, asyncio.Future[str]] = {}

        def see(typ: str, obj: Mapping[str, Any], now: float) -> None:
            tl = timelines.get(obj["metadata"]["name"])
            if tl is None:
                return
            node = (obj.get("spec") or {}).get("nodeName")
            if node and tl.bound is None:
                tl.bound, tl.node = now, node
            if any(
                c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                for c in (obj.get("status") or {}).get("conditions") or []
            ):
                tl.unschedulable = True
            if typ == "DELETED" and tl.deleted is None:
                tl.deleted = now
            fut = waiting.get(obj["metadata"]["name"])
            if fut is not None and not fut.done() and (tl.bound is not None or tl.unschedulable):
                fut.set_result("bound" if tl.bound is not None else "unschedulable")

        async def watch() -> None:
            nonlocal rv
            while True:
                try:
                    async for typ, obj in api.watch(path, rv, timeout_s=300):
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if typ == "ERROR":
                            raise rlstack.ApiError(int(obj.get("code", 0)), str(obj.get("message")), "watch")
                        if typ != "BOOKMARK":
                            see(typ, obj, time.time())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - 410 Gone, a dropped connection: relist, go on
                    log(f"watch ended ({type(exc).__name__}); relisting")
                    notes["relists"] = notes.get("relists", 0) + 1
                    await asyncio.sleep(0.2)
                    try:
                        items, rv = await api.list(path)
                    except Exception:  # noqa: BLE001
                        continue
                    now = time.time()
                    alive = set()
                    for obj in items:
                        alive.add(obj["metadata"]["name"])
                        see("MODIFIED", obj, now)
                    for name, tl in timelines.items():  # deleted while the watch was down: now is an upper bound
                        if tl.created is not None and tl.deleted is None and name not in alive:
                            tl.deleted = now

        watcher = asyncio.create_task(watch())
        loop = asyncio.get_running_loop()
        try:
            start = [p for p in pods if p.initial]
            t0 = time.time() + lead_s
            for p in start:
                name = pod_name(p)
                fut: asyncio.Future[str] = loop.create_future()
                waiting[name] = fut
                await api.create(path, pod_body(p, name, compression, t0))
                timelines[name].created = time.time()
                try:
                    await asyncio.wait_for(fut, 60)
                except TimeoutError:
                    raise RuntimeError(f"start pod {name} neither bound nor unschedulable after 60 s") from None
                del waiting[name]
            placed = time.time()
            notes["startPods"] = len(start)
            notes["startPlacementRealS"] = round(placed - (t0 - lead_s), 1)
            notes["startOverrunRealS"] = round(max(0.0, placed - t0), 2)
            if placed > t0:
                log(f"placing the start took {placed - t0:.1f} s longer than the lead of {lead_s:.0f} s")
            log(f"{len(start)} start pods placed; the window starts in {max(0.0, t0 - placed):.1f} s")
            lags = []
            for p in pods:
                if p.initial or p.arrival_s >= window_s:
                    continue
                due = t0 + compression.real(p.arrival_s)
                await asyncio.sleep(max(0.0, due - time.time()))
                name = pod_name(p)
                await api.create(path, pod_body(p, name, compression, t0))
                timelines[name].created = time.time()
                lags.append(timelines[name].created - due)
            notes["submitLagRealS"] = {
                "p50": round(float(np.percentile(lags, 50)), 3) if lags else 0.0,
                "max": round(max(lags), 3) if lags else 0.0,
            }
            end = t0 + compression.real(window_s)
            await asyncio.sleep(max(0.0, end - time.time()) + 1.0)
        finally:
            watcher.cancel()
    return timelines, t0, notes


def extender_load(mode: str, compression: Compression, settings: DynamicSettings) -> dict[str, Any] | None:
    """The extender's ``prometheus`` settings. ``published``: the usage gauges the exporter publishes
    (instant CPU and memory utilization, like the simulator's scrapes; no network or disk, which the
    simulator leaves unknown too), refreshed every compressed scrape interval and stale after the
    compressed ``stale_after_s``. ``node-exporter``: the extender's defaults (``rate(...[2m])`` over
    node-exporter counters, refreshed every 15 s: 12 and 1.5 simulated minutes at 6×)."""
    if mode == "node-exporter":
        return None
    queries = {
        "cpu": 'rlsched_node_utilization{resource="cpu"}',
        "memory": 'rlsched_node_utilization{resource="memory"}',
    }
    interval_s = compression.real(settings.scrape.interval_s)
    stale_s = compression.real(settings.scrape.stale_after_s)
    # The extender refuses timings that could serve a value past staleAfterS (intervalS + timeoutS ×
    # queries must stay below it): at high compression the default 5 s timeout no longer fits.
    timeout_s = min(5.0, 0.9 * (stale_s - interval_s) / len(queries))
    return {"intervalS": interval_s, "staleAfterS": stale_s, "timeoutS": timeout_s, "queries": queries}


def prometheus_matrix(url: str, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"})
    code, body = rlstack.http_get(f"{url}/api/v1/query_range?{q}", timeout=30)
    if code != 200:
        raise RuntimeError(f"Prometheus query_range {promql}: HTTP {code}: {body[:200]!r}")
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


def published_sla(
    url: str, names: Sequence[str], t0: float, compression: Compression, settings: DynamicSettings
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """hot[k, n] and ls_pods[k, n] at the simulator's ticks, from what Prometheus holds then."""
    ticks = tick_times(settings.arrivals.window_s, settings.scrape.interval_s)
    step = compression.real(settings.scrape.interval_s)
    start, end = t0, t0 + compression.real(float(ticks[-1]))
    col = {n: i for i, n in enumerate(names)}

    def grid(promql: str) -> np.ndarray:
        out = np.full((len(ticks), len(names)), np.nan)
        for series in prometheus_matrix(url, promql, start, end, step):
            n = col.get(series["metric"].get("instance", ""))
            if n is None:
                continue
            for ts, value in series["values"]:
                k = round((float(ts) - start) / step)
                if 0 <= k < len(ticks):
                    out[k, n] = float(value)
        return out

    cpu = grid('rlsched_node_utilization{resource="cpu"}')
    gpu = grid('rlsched_node_utilization{resource="gpu"}')
    ls = grid("rlsched_node_latency_sensitive_pods")
    missing = int((np.isnan(cpu) | np.isnan(gpu) | np.isnan(ls)).sum())  # a node-tick lacking any of the three
    sla = settings.sla
    hot = (np.nan_to_num(cpu) > sla.cpu_threshold) | (np.nan_to_num(gpu) > sla.gpu_threshold)
    node_ticks = max(1, cpu.size)
    prom = {
        "missingNodeTicks": missing,
        "missingFraction": round(missing / node_ticks, 4),
        "ticks": len(ticks),
        "nodes": len(names),
    }
    return hot, np.nan_to_num(ls), prom


def sla_data_problems(prom: Mapping[str, Any], exporter_health: str | None) -> list[str]:
    """Why the SLA measures cannot be trusted (none: they can). ``prom``: :func:`published_sla`'s notes;
    ``exporter_health``: None when the load exporter was alive and healthy right after the drive, else
    what was wrong (:func:`exporter_problem`)."""
    problems = []
    fraction = float(prom.get("missingFraction", 0.0))
    if fraction > MISSING_ALLOWANCE:
        problems.append(
            f"{prom.get('missingNodeTicks')} node-ticks ({100 * fraction:.1f} %) have no Prometheus sample, "
            f"more than the {100 * MISSING_ALLOWANCE:g} % allowed"
        )
    if exporter_health is not None:
        problems.append(f"the load exporter after the drive: {exporter_health}")
    return problems


def withhold_sla(rows: Sequence[dict[str, Any]], problems: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` with the SLA measures marked not ok (and why) when their data has ``problems``."""
    if not problems:
        return list(rows)
    why = "; ".join(problems)
    return [dict(r, ok=False, problem=why) if r["metric"] in SLA_METRICS else r for r in rows]


def exporter_problem(exporter: Any) -> str | None:
    """None when the load exporter runs and its ``/healthz`` says ok, else what is wrong."""
    if not exporter.alive():
        return f"not running{exporter.exit_note()}"
    try:
        code, body = rlstack.http_get(f"{exporter.url}/healthz", timeout=5)
    except OSError as exc:
        return f"/healthz unreachable ({exc})"
    return None if code == 200 else f"/healthz HTTP {code}: {body.decode(errors='replace').strip()[:200]}"


def lifetime_errors(timelines: Sequence[PodTimeline], compression: Compression, t0: float) -> dict[str, Any]:
    """How far kwok's deletions were from the intended ends, in simulated seconds (ended pods only)."""
    errs = []
    for tl in timelines:
        if tl.bound is None or tl.deleted is None:
            continue
        intended = (
            t0 + compression.real(tl.pod.lifetime_s)
            if tl.pod.initial
            else tl.bound + compression.real(tl.pod.lifetime_s)
        )
        if tl.pod.initial:
            intended = max(intended, tl.bound)
        errs.append(compression.sim(tl.deleted - intended))
    if not errs:
        return {"ended": 0}
    e = np.abs(np.array(errs))
    return {
        "ended": len(errs),
        "absErrorSimS": {"p50": round(float(np.percentile(e, 50)), 2), "p99": round(float(np.percentile(e, 99)), 2)},
        "meanErrorSimS": round(float(np.mean(errs)), 2),
    }


positive_number = finite_number(above=0)
"""``--compression``, ``--window``, ``--load``: NaN or 0 used to fail with a traceback deep in the
simulator, and ``inf`` passed to a run whose every wait is 0 real seconds."""
non_negative_number = finite_number(least=0)
"""``--lead``: real seconds, 0 or more (time 0 cannot be before the start is submitted)."""
count = integer
"""``--node-count`` 1 or more; seeds and ``--tiebreak-seeds`` 0 or more (numpy seeds no negative number,
and the exporter gets ``--seed`` as its ``--usage-seed``)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/replay_dynamic.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"), help="openb node list")
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"), help="openb pod list")
    ap.add_argument("--node-count", type=count(1), default=150, help="nodes sampled from the node list")
    ap.add_argument("--node-seed", type=count(0), default=0, help="seed of the node sample")
    ap.add_argument("--seed", type=count(0), default=1, help="the living-cluster run's seed (also the tie-break seed)")
    ap.add_argument(
        "--load", type=positive_number, default=0.9, help="offered GPU load (the arrival rate follows, Little's law)"
    )
    ap.add_argument("--window", type=positive_number, default=1800.0, help="measured window, simulated seconds")
    ap.add_argument(
        "--compression", type=positive_number, default=6.0, help="simulated seconds per real second (6: 1 h in 10 min)"
    )
    ap.add_argument("--policy", default="fgd", help="fallback heuristic served by the extender (and simulated)")
    ap.add_argument("--model", help="serve this learned model instead (the simulator uses it too)")
    ap.add_argument("--tiebreak-seeds", type=count(0), default=3, help="other tie-break seeds simulated for the spread")
    ap.add_argument(
        "--lead", type=non_negative_number, help="real seconds allowed to place the start (default: 0.05 s a pod + 10)"
    )
    ap.add_argument(
        "--extender-load",
        choices=("published", "node-exporter"),
        default="published",
        help="published: the extender reads the exporter's usage gauges every compressed scrape interval, as the "
        "simulator's scheduler sees load; node-exporter: the extender's default queries and interval",
    )
    ap.add_argument("--keep", action="store_true", help="leave the cluster (and the pods) up")
    ap.add_argument("--json", help="write everything here")
    args = ap.parse_args(argv)

    try:  # the ranges the simulator's settings check (--load at most 10), in one line before anything starts
        compression = Compression(args.compression)
        settings = DynamicSettings(arrivals=ArrivalSettings(load=args.load, window_s=args.window))
    except ValueError as exc:
        ap.error(str(exc))
    if args.window < settings.scrape.interval_s:
        ap.error(f"--window must cover at least one scrape interval ({settings.scrape.interval_s:g} s)")
    interval_real = compression.real(settings.scrape.interval_s)
    for flag, path in (("--nodes", args.nodes), ("--pods", args.pods)):
        if not Path(path).is_file():
            ap.error(missing_input(path, flag))
    if args.json is not None and (problem := output_problem(args.json, "--json")):
        ap.error(problem)  # before a run of minutes, not after it
    all_nodes = load_nodes(args.nodes)
    trace = load_pods(args.pods)
    typical = typical_pods(trace)
    nodes = sample_nodes(all_nodes, args.node_count, args.node_seed)
    capacity = ClusterState(nodes).gpu_milli_capacity
    sim_cluster, pods = draw_slice(nodes, trace, args.seed, typical, settings)
    start_pods = sum(p.initial for p in pods)
    log(
        f"{len(nodes)} of {len(all_nodes)} nodes (seed {args.node_seed}), {capacity // 1000} GPUs; load {args.load}: "
        f"{sim_cluster.rate:.3f} pods/s; {start_pods} start pods, {len(pods) - start_pods} arrivals in "
        f"{args.window:.0f} s; {args.compression:g}x: {compression.real(args.window):.0f} real s, scrape every "
        f"{interval_real:g} real s"
    )

    served = f"ppo:{args.model}" if args.model else args.policy
    names = [nd.name for nd in nodes]

    def simulated(tiebreak: TieBreak | None) -> dict[str, Any]:
        scorer = make_scorer(served, None if args.model else typical)
        return run_dynamic(nodes, trace, scorer, args.seed, typical, settings, tiebreak=tiebreak).summary()

    sim = simulated(TieBreak.by_name(names, args.seed))
    sim_seeded = simulated(None)
    spread = [simulated(TieBreak.by_name(names, 1000 + s)) for s in range(args.tiebreak_seeds)]

    session = replay_openb.ReplayCluster(
        None, keep=args.keep, up_args=("--no-scheduler", "--kwok-config", str(LIFETIME_STAGE))
    )
    cluster = session.cluster
    if cluster.prometheus_url is None:
        session.close()
        raise SystemExit("the cluster has no Prometheus: install it (hack/install-system-deps.sh)")
    extender = rlstack.Extender(cluster, "replay-dynamic-extender")
    scheduler = rlstack.KubeScheduler(cluster, "replay-dynamic-kube-scheduler")
    exporter = rlstack.LoadExporter(cluster, "replay-dynamic-load-exporter")
    result: dict[str, Any] = {
        "nodes": len(nodes),
        "nodeSeed": args.node_seed,
        "gpus": capacity // 1000,
        "trace": Path(args.pods).name,
        "seed": args.seed,
        "load": args.load,
        "windowSimS": args.window,
        "compression": args.compression,
        "policy": args.policy,
        "model": args.model,
        "extenderLoad": args.extender_load,
        "arrivalRatePerSimS": sim_cluster.rate,
        "startPods": start_pods,
        "windowArrivals": len(pods) - start_pods,
    }
    try:
        replay_openb.create_openb_nodes(cluster, nodes, labels={"replay": "dynamic"})
        rlstack.ensure_namespace(cluster, NS)
        exporter.start_with(
            node_selector="replay=dynamic",
            refresh_s=min(1.0, interval_real / 2),
            extra=["--usage-annotations", "--usage-seed", str(args.seed)],
        )
        status = replay_openb.start_scheduling(
            cluster,
            extender,
            scheduler,
            args.policy,
            args.seed,
            typical,
            args.model,
            ring_size=4 * len(pods) + 64,
            prometheus_url=cluster.prometheus_url,
            prometheus=extender_load(args.extender_load, compression, settings),
        )
        result["served"] = rlstack.describe_policy(status)
        k8s_names = [rlstack.k8s_name(n) for n in names]
        rlstack.wait_for(
            lambda: (
                len(rlstack.prometheus_query(cluster.prometheus_url, 'rlsched_node_utilization{resource="cpu"}'))
                >= len(nodes)
            ),
            120,
            "Prometheus scraping every node's published usage",
        )
        log(f"extender serves {result['served']}; Prometheus has every node; replaying")
        lead = args.lead if args.lead is not None else 10.0 + 0.05 * start_pods
        t_run = time.monotonic()
        timelines, t0, notes = asyncio.run(drive(cluster, pods, compression, args.window, lead))
        result["replayRealS"] = round(time.monotonic() - t_run, 1)
        result["notes"] = notes
        exporter_health = exporter_problem(exporter)
        result["exporterAfterDrive"] = exporter_health or "ok"
        hot, ls, prom = published_sla(cluster.prometheus_url, k8s_names, t0, compression, settings)
        result["prometheus"] = prom
        result["decisions"] = extender.status()["policy"]["counters"]
    finally:
        scheduler.stop()
        extender.stop()
        exporter.stop()
        session.close()

    tls = list(timelines.values())
    real = measure_timelines(
        tls,
        t0=t0,
        compression=compression,
        window_s=args.window,
        interval_s=settings.scrape.interval_s,
        gpu_capacity_milli=capacity,
        hot=hot,
        ls_pods=ls,
    )
    sla_problems = sla_data_problems(prom, exporter_health)
    rows = withhold_sla(compare(real, sim, TOLERANCES), sla_problems)
    if sla_problems:
        log(f"SLA measures not trusted: {'; '.join(sla_problems)}")
    result["real"] = real
    result["sim"] = sim
    result["simSeeded"] = sim_seeded
    result["simTiebreakSpread"] = {
        m: {"min": min(float(s[m]) for s in [sim, *spread]), "max": max(float(s[m]) for s in [sim, *spread])}
        for m in TOLERANCES
    }
    result["comparison"] = rows
    result["lifetimes"] = lifetime_errors(tls, compression, t0)
    result["unschedulableEver"] = sum(tl.unschedulable for tl in tls)
    result["boundInWindow"] = sum(tl.bound is not None for tl in tls)
    table = format_comparison(rows)
    print(json.dumps({k: v for k, v in result.items() if k not in ("comparison",)}, indent=1, default=str))
    print(table)
    if args.json:
        replay_openb.write_json(
            args.json,
            json.dumps(
                dict(
                    result,
                    table=table,
                    pods=[
                        {
                            "name": name,
                            "arrivalSimS": tl.pod.arrival_s,
                            "lifetimeSimS": tl.pod.lifetime_s,
                            "created": tl.created,
                            "bound": tl.bound,
                            "deleted": tl.deleted,
                            "node": tl.node,
                        }
                        for name, tl in timelines.items()
                    ],
                    t0=t0,
                ),
                default=str,
            ),
        )
    bad = [r["metric"] for r in rows if not r["ok"]]
    if bad:
        log(f"outside tolerance: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
