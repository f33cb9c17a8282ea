#!/usr/bin/env python3
"""Replay the openb trace through the real kube-scheduler + extender and compare with the simulator.

The simulator-to-reality check (docs/replay.md). The FGD protocol's arrival sequence for one seed
(``rlsched.policy.workload.inflate``) is submitted to a local control plane with the openb nodes as
kwok nodes (cpu, memory, ``nvidia.com/gpu`` cards, ``rlsched.io/gpu-model``), **one pod at a time**:
each pod is created, and the next only after it is bound or marked ``Unschedulable`` by kube-scheduler
(an unschedulable pod is then deleted: the protocol never retries a pod, and nothing leaves, so it
would never fit later either). That keeps the real scheduler in the simulator's strict order.

The placements are read back (``spec.nodeName`` and the ``rlsched.io/gpu-cards`` annotation bind
wrote) and replayed into a fresh ``ClusterState`` with the simulator's own accounting (the loop of
``rlsched.policy.simulator.run_sequence``: after every pod, arrived and allocated GPU milli, the curve
at each arrived %, unallocated GPU % at 100 %). Every recorded placement must be feasible there.

Three simulator references for the same sequence and policy:

- ``sim-seeded``: the simulator exactly as ``run_fgd_protocol`` runs it (``run_sequence`` on the same
  inflated sequence, ties broken by ``TieBreak.seeded(n, seed)``);
- ``sim-by-name``: the same loop with the extender's tie-break, ``TieBreak.by_name(names, seed)``
  (the extender runs with ``policy.seed`` = the replay seed) — the real stack should match it pod
  for pod;
- the spread of ``sim-by-name`` over other tie-break seeds: how much tie-breaking alone moves the
  figure.

    export RLSCHED_OPENB_DIR=~/clusterdata/cluster-trace-gpu-v2023/csv   # the openb files (or --nodes, --pods)
    .venv/bin/python hack/replay_openb.py                         # default trace, seed 42, FGD, up to 100 % arrival
    .venv/bin/python hack/replay_openb.py --limit 300             # a quick check (first 300 pods)
    .venv/bin/python hack/replay_openb.py --pods "$RLSCHED_OPENB_DIR"/openb_pod_list_gpushare60.csv \\
        --until 130 --json out.json

A fresh cluster is started in a temporary folder (``hack/local-cluster.sh up --no-scheduler``) and torn
down afterwards unless ``--cluster-dir`` names a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("rlstack", REPO_ROOT / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]

from rlsched.policy.cluster import ClusterState, NodeSpec, PodSpec  # noqa: E402
from rlsched.policy.decision import decide  # noqa: E402
from rlsched.policy.scorers import TieBreak, make_scorer  # noqa: E402
from rlsched.policy.simulator import ProtocolMeter, RequestCache, RunResult, run_sequence  # noqa: E402
from rlsched.policy.trace import (  # noqa: E402
    OPENB_NODES,
    OPENB_PODS,
    load_nodes,
    load_pods,
    missing_input,
    openb_dir,
    output_problem,
)
from rlsched.policy.typical import TypicalPods, typical_pods  # noqa: E402
from rlsched.policy.workload import DEFAULT_TARGET, inflate  # noqa: E402

DATA = openb_dir() or Path()
"""The openb folder, ``$RLSCHED_OPENB_DIR``; unset, the defaults are the bare file names (and a missing
file's error names the flag and the variable)."""
NS = "replay"


def log(msg: str) -> None:
    print(f"[replay {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the simulator's accounting over given outcomes --------------------------------------------------

Outcome = tuple[str, tuple[int, ...]] | None
"""(node name, cards) for a placed pod, None for a failed one."""


@dataclass
class Curve:
    """What ``run_sequence`` measures (its :class:`RunResult`) for any sequence of outcomes, and the
    outcomes the simulator's model could not place."""

    run: RunResult
    problems: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return self.run.failed_pods

    def unallocated_at(self, pct: int) -> float:
        return self.run.unallocated_at(pct)


def account(
    nodes: Sequence[NodeSpec], sequence: Sequence[PodSpec], outcomes: Sequence[Outcome], typical: TypicalPods
) -> Curve:
    """``run_sequence``'s measurement (the same :class:`ProtocolMeter`) with the placements given
    instead of decided. A placement the simulator's model refuses is a problem, counted as neither
    placed nor failed."""
    state = ClusterState(nodes)
    requests = RequestCache(state)
    meter = ProtocolMeter(state, typical)
    problems: list[str] = []
    for pod, outcome in zip(sequence, outcomes, strict=False):
        req = requests(pod)
        if outcome is None:
            meter.record(req, placed=False)
            continue
        node, cards = outcome
        try:
            state.place(req, state.index[node], cards)
        except (ValueError, KeyError) as exc:
            problems.append(f"{pod.name} on {node} cards {cards}: {exc}")
            meter.record(req, placed=False, failed=False)
        else:
            meter.record(req, placed=True)
    return Curve(meter.result("replay", 0, len(sequence), 0.0), problems)


def simulate(
    nodes: Sequence[NodeSpec], sequence: Sequence[PodSpec], policy: str, typical: TypicalPods, tiebreak: TieBreak
) -> list[Outcome]:
    """The simulator's decisions (``decide``, as in ``run_sequence``) with a given tie-break."""
    state = ClusterState(nodes)
    requests = RequestCache(state)
    # A learned model computes its features with its own typical pods, as the extender serves it.
    scorer = make_scorer(policy, None if policy.startswith("ppo:") else typical)
    out: list[Outcome] = []
    for pod in sequence:
        req = requests(pod)
        d = decide(scorer, state, req, tiebreak)
        if d is None:
            out.append(None)
        else:
            state.place(req, d.node, d.cards)
            out.append((state.names[d.node], tuple(d.cards)))
    return out


def prefix_until(sequence: Sequence[PodSpec], capacity: int, until_pct: int) -> int:
    """How many pods of the sequence arrive before the arrived GPU % (rounded) passes ``until_pct``."""
    arrived = 0
    for i, pod in enumerate(sequence):
        arrived += pod.num_gpu * pod.gpu_milli
        if math.floor(arrived * 100 / capacity + 0.5) > until_pct:
            return i
    return len(sequence)


# -- the real stack ----------------------------------------------------------------------------------


class ReplayCluster:
    """The control plane a replay runs on: a fresh ``hack/local-cluster.sh up UP_ARGS`` in a temporary
    folder (torn down by :meth:`close` unless ``keep``), or the running one in ``cluster_dir``."""

    def __init__(self, cluster_dir: str | None, keep: bool = False, up_args: Sequence[str] = ()) -> None:
        self.own = cluster_dir is None
        self.keep = keep
        self.state_dir = Path(cluster_dir or tempfile.mkdtemp(prefix="rlsched-replay-"))
        self.env = {k: v for k, v in os.environ.items() if not (k.startswith("RLSCHED_") and k.endswith("_PORT"))}
        self.env["RLSCHED_CLUSTER_DIR"] = str(self.state_dir)
        self.script = str(REPO_ROOT / "hack" / "local-cluster.sh")
        if self.own:
            log(f"starting a cluster in {self.state_dir}")
            try:
                subprocess.run([self.script, "up", *up_args], env=self.env, check=True, stdout=subprocess.DEVNULL)
            except BaseException:
                self.close()
                raise
        self.cluster = rlstack.LocalCluster(self.state_dir.resolve())

    def close(self) -> None:
        if self.own and not self.keep:
            subprocess.run(
                [self.script, "down"], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
            shutil.rmtree(self.state_dir, ignore_errors=True)


def start_scheduling(
    cluster: Any,
    extender: Any,
    scheduler: Any,
    policy: str,
    seed: int,
    typical: TypicalPods,
    model: str | None,
    ring_size: int,
    prometheus_url: str | None = None,
    prometheus: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Our extender (``policy`` as the fallback, or ``model``; tie-break seed ``seed``; the trace's typical
    pods; load from ``prometheus_url`` with the extender's ``prometheus`` settings) and kube-scheduler's
    ``rl-scheduler`` profile pointed at it. Returns the extender's status."""
    tp = cluster.stack_dir / "typical.json"
    cluster.stack_dir.mkdir(parents=True, exist_ok=True)
    tp.write_text(json.dumps({"typicalPods": typical.to_json()}))
    extender.start_with(
        model=model,
        prometheus_url=prometheus_url,
        settings={
            "policy": {"fallback": policy, "seed": seed, "typicalPodsPath": str(tp), "topK": 1},
            "log": {"level": "WARNING"},
            "decisionRingSize": ring_size,
            **({"prometheus": prometheus} if prometheus else {}),
        },
    )
    # percentageOfNodesToScore 100: every feasible node reaches the policy, as in the simulator. Below
    # 100, kube-scheduler's parallel filters decide which nodes make the window, so placements could
    # not be compared pod for pod (docs/replay.md).
    conf = rlstack.rl_scheduler_config(
        cluster, extender.url, leader_elect=False, qps=1000, burst=1000, percentage_of_nodes_to_score=100
    )
    scheduler.start_with(conf, verbosity=1)
    status: dict[str, Any] = extender.status()
    return status


def create_openb_nodes(cluster: Any, nodes: Sequence[NodeSpec], labels: dict[str, str] | None = None) -> None:
    """The openb nodes as kwok nodes (DNS names from :func:`rlstack.k8s_name`), waited for until Ready."""
    kwok_nodes = [
        rlstack.kwok_node(
            rlstack.k8s_name(nd.name),
            nd.cpu_milli,
            nd.memory_mib,
            nd.gpu_count,
            nd.gpu_model,
            labels=labels or {"replay": "1"},
        )
        for nd in nodes
    ]
    took = rlstack.create_nodes(cluster, kwok_nodes)
    log(f"{len(kwok_nodes)} kwok nodes Ready in {took:.0f}s")


async def replay(
    cluster: Any, sequence: Sequence[PodSpec], scheduler_name: str, timeout_s: float
) -> tuple[list[Outcome], list[float]]:
    """Submit pods one at a time; returns the outcomes and the seconds each pod took."""
    outcomes: list[Outcome] = []
    seconds: list[float] = []
    async with rlstack.Api(cluster, connections=8) as api:
        _, rv = await api.list(f"/api/v1/namespaces/{NS}/pods", {"limit": "1"})
        waiting: dict[str, asyncio.Future] = {}

        def see(obj: dict) -> None:
            fut = waiting.get(obj["metadata"]["name"])
            if fut is None or fut.done():
                return
            if obj["spec"].get("nodeName"):
                fut.set_result(("bound", obj))
            elif any(
                c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                for c in (obj.get("status") or {}).get("conditions") or []
            ):
                fut.set_result(("unschedulable", obj))

        async def watch() -> None:
            nonlocal rv
            while True:
                try:
                    async for typ, obj in api.watch(f"/api/v1/namespaces/{NS}/pods", rv, timeout_s=300):
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if typ in ("ADDED", "MODIFIED"):
                            see(obj)
                        elif typ == "ERROR":
                            raise rlstack.ApiError(int(obj.get("code", 0)), str(obj.get("message")), "watch")
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - 410 Gone, a dropped connection: relist, go on
                    log(f"watch ended ({type(exc).__name__}); relisting")
                    await asyncio.sleep(0.5)
                    try:
                        items, rv = await api.list(f"/api/v1/namespaces/{NS}/pods")
                    except Exception:  # noqa: BLE001
                        continue
                    for obj in items:
                        see(obj)

        watcher = asyncio.create_task(watch())
        loop = asyncio.get_running_loop()
        t_report = time.monotonic()
        try:
            for i, spec in enumerate(sequence):
                name = f"p{i:05d}-{rlstack.k8s_name(spec.name)}"[:63].rstrip("-")
                body = rlstack.pod_from_spec(spec, name=name, scheduler_name=scheduler_name, labels={"replay": "1"})
                fut = loop.create_future()
                waiting[name] = fut
                t0 = time.monotonic()
                await api.create(f"/api/v1/namespaces/{NS}/pods", body)
                try:
                    kind, obj = await asyncio.wait_for(fut, timeout_s)
                except TimeoutError:
                    raise RuntimeError(
                        f"pod {i} ({name}) neither bound nor unschedulable after {timeout_s:.0f}s"
                    ) from None
                del waiting[name]
                if kind == "bound":
                    a = rlstack.card_assignment(obj)
                    node = obj["spec"]["nodeName"]
                    if spec.num_gpu and (a is None or a[0] != node):
                        raise RuntimeError(f"pod {name} bound to {node} without matching card annotations: {a}")
                    outcomes.append((node, a[1] if a else ()))
                else:
                    outcomes.append(None)
                    await api.request(
                        "DELETE",
                        f"/api/v1/namespaces/{NS}/pods/{name}",
                        params={"gracePeriodSeconds": "0"},
                        ok=(200, 202, 404),
                    )
                seconds.append(time.monotonic() - t0)
                if time.monotonic() - t_report > 30:
                    t_report = time.monotonic()
                    placed = sum(o is not None for o in outcomes)
                    log(
                        f"{i + 1}/{len(sequence)} pods ({placed} placed), {len(seconds) / sum(seconds):.1f} pods/s, "
                        f"load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}"
                    )
        finally:
            watcher.cancel()
    return outcomes, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/replay_openb.py", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--nodes",
        default=str(DATA / OPENB_NODES),
        help="openb node list (1,213 GPU nodes; default: in $RLSCHED_OPENB_DIR)",
    )
    ap.add_argument("--pods", default=str(DATA / OPENB_PODS), help="openb pod list (default: in $RLSCHED_OPENB_DIR)")
    ap.add_argument("--seed", type=int, default=42, help="the protocol's seed (inflation; also the tie-break seed)")
    ap.add_argument("--policy", default="fgd", help="fallback heuristic served by the extender (and simulated)")
    ap.add_argument("--model", help="serve this learned model instead (the simulator references use it too)")
    ap.add_argument(
        "--until", type=int, default=100, help="replay up to this arrived GPU %% (the headline needs 100; max 130)"
    )
    ap.add_argument("--limit", type=int, help="replay only the first N pods of the sequence (quick checks)")
    ap.add_argument("--tiebreak-seeds", type=int, default=3, help="other tie-break seeds simulated for the spread")
    ap.add_argument("--pod-timeout", type=float, default=60, help="seconds one pod may take")
    ap.add_argument("--cluster-dir", help="a running hack/local-cluster.sh state folder (else a fresh one)")
    ap.add_argument("--keep", action="store_true", help="leave the fresh cluster (and the replayed pods) up")
    ap.add_argument("--json", help="write results (and every outcome) here")
    ap.add_argument(
        "--allow-differences",
        action="store_true",
        help="exit 0 even when a real placement differs from the simulator's (by default a difference fails the run)",
    )
    args = ap.parse_args(argv)
    for flag, path in (("--nodes", args.nodes), ("--pods", args.pods)):
        if not Path(path).is_file():
            ap.error(missing_input(path, flag))
    if args.json is not None and (problem := output_problem(args.json, "--json")):
        ap.error(problem)  # before a run of minutes, not after it

    nodes = load_nodes(args.nodes)
    trace = load_pods(args.pods)
    typical = typical_pods(trace)
    capacity = ClusterState(nodes).gpu_milli_capacity
    full = inflate(trace, capacity, args.seed, DEFAULT_TARGET)
    n = prefix_until(full, capacity, args.until)
    if args.limit:
        n = min(n, args.limit)
    sequence = full[:n]
    log(
        f"{len(nodes)} nodes, {capacity // 1000} GPUs; trace {Path(args.pods).name}: {len(trace)} pods, inflated to "
        f"{len(full)} (seed {args.seed}); replaying the first {n} (arrived ≤ {args.until} %)"
    )

    # Simulator references.
    t0 = time.monotonic()
    served = f"ppo:{args.model}" if args.model else args.policy  # what the extender will serve
    seeded = run_sequence(
        nodes,
        sequence,
        make_scorer(served, None if args.model else typical),
        args.seed,
        typical,
        record_placements=True,
    )
    placed = {name: (node, tuple(cards)) for name, node, cards in seeded.placements}
    sim_seeded: list[Outcome] = [placed.get(p.name) for p in sequence]
    mine = account(nodes, sequence, sim_seeded, typical)
    # Self-check: our accounting over run_sequence's own decisions gives run_sequence's figure.
    assert abs(mine.unallocated_at(args.until) - seeded.unallocated_at(args.until)) < 1e-9, "account() ≠ run_sequence()"
    names = [nd.name for nd in nodes]
    by_name = simulate(nodes, sequence, served, typical, TieBreak.by_name(names, args.seed))
    spread = {}
    for s in range(args.tiebreak_seeds):
        other = simulate(nodes, sequence, served, typical, TieBreak.by_name(names, 1000 + s))
        spread[f"by-name seed {1000 + s}"] = account(nodes, sequence, other, typical).unallocated_at(args.until)
    log(
        f"simulator references in {time.monotonic() - t0:.0f}s: seeded {mine.unallocated_at(args.until):.3f} %, "
        f"by-name {account(nodes, sequence, by_name, typical).unallocated_at(args.until):.3f} %, spread {spread}"
    )

    # The real stack.
    session = ReplayCluster(args.cluster_dir, keep=args.keep, up_args=("--no-scheduler", "--no-prometheus"))
    cluster = session.cluster
    extender = rlstack.Extender(cluster, "replay-extender")
    scheduler = rlstack.KubeScheduler(cluster, "replay-kube-scheduler")
    result: dict[str, Any] = {
        "nodes": len(nodes),
        "trace": Path(args.pods).name,
        "seed": args.seed,
        "policy": args.policy,
        "model": args.model,
        "sequence": len(full),
        "replayed": n,
        "until": args.until,
    }
    try:
        create_openb_nodes(cluster, nodes)
        rlstack.ensure_namespace(cluster, NS)
        status = start_scheduling(
            cluster, extender, scheduler, args.policy, args.seed, typical, args.model, ring_size=4 * len(sequence) + 64
        )
        result["served"] = rlstack.describe_policy(status)
        log(f"extender serves: {result['served']}; typical pods: {status['policy']['typicalPods']}")
        t0 = time.monotonic()
        real, secs = asyncio.run(replay(cluster, sequence, rlstack.SCHEDULER_NAME, args.pod_timeout))
        result["replaySeconds"] = round(time.monotonic() - t0, 1)
        result["podsPerSecond"] = round(n / (time.monotonic() - t0), 2)
        secs.sort()
        result["perPodMs"] = {
            "p50": round(1000 * secs[len(secs) // 2], 1),
            "p99": round(1000 * secs[int(0.99 * (len(secs) - 1))], 1),
        }
        result["decisions"] = extender.status()["policy"]["counters"]
        # The extender's own record of the first decisions (candidates, feasible, chosen, kept): what
        # to look at when the real stack parts from the simulator.
        records, cursor = [], 0
        while True:
            page = extender.decisions(cursor, 10_000)
            records += [r for r in page["records"] if r.get("kind") == "filter"]
            if not page["records"]:
                break
            cursor = page["next"]
        result["firstFilterRecords"] = [
            {k: r.get(k) for k in ("pod", "node", "kept", "candidates", "feasible", "servedBy", "topScores")}
            for r in records[:5]
        ]
        # How many nodes kube-scheduler handed the extender per pod, in arrival order (a short list
        # early on means nodes were still tainted not-ready, or kube-scheduler's own filters differ).
        cands = [int(r.get("candidates") or 0) for r in records]
        result["candidatesPer500Filters"] = [
            round(sum(cands[i : i + 500]) / len(cands[i : i + 500]), 1) for i in range(0, len(cands), 500)
        ]
    finally:
        scheduler.stop()
        extender.stop()
        session.close()

    k8s = {rlstack.k8s_name(nd.name): nd.name for nd in nodes}
    real = [None if o is None else (k8s[o[0]], tuple(o[1])) for o in real]
    curves = {
        "real": account(nodes, sequence, real, typical),
        "sim-by-name": account(nodes, sequence, by_name, typical),
        "sim-seeded": mine,
    }
    same = sum(a == b for a, b in zip(real, by_name, strict=False))
    first_diff = next((i for i, (a, b) in enumerate(zip(real, by_name, strict=False)) if a != b), None)
    u = args.until
    result.update(
        {
            "unallocatedAt": {k: round(c.unallocated_at(u), 4) for k, c in curves.items()},
            "tiebreakSpread": {k: round(v, 4) for k, v in spread.items()},
            "failed": {k: c.failed for k, c in curves.items()},
            "placementsEqualToSimByName": same,
            "firstDifference": None
            if first_diff is None
            else {
                "index": first_diff,
                "pod": sequence[first_diff].name,
                "real": real[first_diff],
                "sim": by_name[first_diff],
            },
            "infeasibleRealPlacements": curves["real"].problems[:10],
        }
    )
    result["differenceRealVsSimByNamePP"] = round(
        result["unallocatedAt"]["real"] - result["unallocatedAt"]["sim-by-name"], 4
    )
    result["differenceRealVsSimSeededPP"] = round(
        result["unallocatedAt"]["real"] - result["unallocatedAt"]["sim-seeded"], 4
    )
    print(json.dumps(result, indent=1))
    if args.json:
        out = dict(
            result,
            outcomes={"real": real, "simByName": by_name, "simSeeded": sim_seeded},
            sequence=[p.name for p in sequence],
        )
        write_json(args.json, json.dumps(out))
    return exit_status(
        len(curves["real"].problems), same, len(sequence), args.allow_differences, result["firstDifference"]
    )


def write_json(path: str | Path, text: str) -> None:
    """``--json``: the file, in a folder made if missing (``runs/bench/…`` on a fresh clone)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def exit_status(infeasible: int, same: int, total: int, allow_differences: bool, first: object = None) -> int:
    """1 when a real placement is impossible in the simulator's model, or (unless allowed) differs from
    the simulator's; 0 when the real stack placed every pod as the simulator did."""
    if infeasible:
        return 1
    if same != total and not allow_differences:
        print(
            f"replay: {total - same} of {total} placements differ from the simulator's (first: {first})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
