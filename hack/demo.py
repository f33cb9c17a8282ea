#!/usr/bin/env python3
"""The demo's workload and report (``hack/demo.sh`` runs it once the stack is up).

On the local cluster (``$RLSCHED_CLUSTER_DIR``, default ``.cache/cluster``) with the stack of
``hack/rlstack.py`` running: creates 8 kwok GPU nodes of three card models, applies the
SchedulingPolicy the operator serves (the bundled living-cluster model, trained with live node load,
when installed; else the FGD heuristic), makes one node hot (the load exporter publishes 95 % CPU for
it: a noisy neighbour), waits (at most ``$RLSCHED_DEMO_LOAD_WAIT_S``, default 90 s) until the
extender has fresh node load from Prometheus for the demo nodes (the load exporter's series need a
scrape or two; past the limit it says so plainly), submits ~20 pods — whole cards, shares of a card
(by resource and by annotation), a model-constrained pod, CPU-only pods, two that cannot fit, one for
the default scheduler — waits, and prints where each pod went with its cards, why the others did not,
the GPU allocation per node and cluster-wide, the node load the extender had when it placed them (from
its decision records, not from the wait: the extender keeps polling Prometheus, so load still missing
at submission can arrive before placement; per load column, and for one pod the load it saw on the
node it chose), and the decisions where load changed the choice (the extender's ``explainLoad``
decides each pod a second time with load unknown).
Idempotent: a second run replaces the demo's pods.
"""

from __future__ import annotations

import calendar
import importlib.util
import json
import os
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("rlstack", REPO_ROOT / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]

NS = "rlsched-demo"
LABEL = "rlsched.io/demo"
NODES = [  # name, cpu milli, memory MiB, cards, model
    *[(f"demo-v100-{i}", 64000, 262144, 8, "V100M16") for i in range(3)],
    *[(f"demo-t4-{i}", 32000, 131072, 4, "T4") for i in range(3)],
    *[(f"demo-a100-{i}", 96000, 524288, 8, "A100") for i in range(2)],
]
# name, cpu milli, memory MiB, whole cards, milli per card, models, scheduler, share by annotation
PODS: list[tuple[str, int, int, int, int, tuple[str, ...], str, bool]] = [
    ("train-8gpu", 32000, 131072, 8, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("train-4gpu-a", 16000, 65536, 4, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("train-4gpu-b", 16000, 65536, 4, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("train-2gpu-a", 8000, 32768, 2, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("train-2gpu-b", 8000, 32768, 2, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("a100-finetune", 12000, 65536, 2, 1000, ("A100",), rlstack.SCHEDULER_NAME, False),
    ("infer-1gpu-a", 4000, 16384, 1, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("infer-1gpu-b", 4000, 16384, 1, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("infer-1gpu-c", 4000, 16384, 1, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-500-a", 2000, 8192, 1, 500, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-500-b", 2000, 8192, 1, 500, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-500-c", 2000, 8192, 1, 500, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-250-a", 1000, 4096, 1, 250, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-250-b", 1000, 4096, 1, 250, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-250-c", 1000, 4096, 1, 250, (), rlstack.SCHEDULER_NAME, False),
    ("notebook-300-annot", 1000, 4096, 1, 300, (), rlstack.SCHEDULER_NAME, True),
    ("t4-share-400", 2000, 8192, 1, 400, ("T4",), rlstack.SCHEDULER_NAME, False),
    ("etl-cpu-a", 8000, 32768, 0, 0, (), rlstack.SCHEDULER_NAME, False),
    ("etl-cpu-b", 4000, 16384, 0, 0, (), rlstack.SCHEDULER_NAME, False),
    ("too-big-16gpu", 8000, 32768, 16, 1000, (), rlstack.SCHEDULER_NAME, False),
    ("h100-only", 4000, 16384, 1, 1000, ("H100",), rlstack.SCHEDULER_NAME, False),
    ("web-default-sched", 1000, 2048, 0, 0, (), "default-scheduler", False),
]
UNFIT = {"too-big-16gpu", "h100-only"}
HOT_NODE, HOT_CPU = "demo-v100-0", 0.95
"""The node the demo makes hot, and the CPU utilization the load exporter publishes for it."""
LOAD_WAIT_S = float(os.environ.get("RLSCHED_DEMO_LOAD_WAIT_S", "90"))
"""How long to wait for the extender's first fresh node load before submitting the pods."""


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def served_model() -> Path | None:
    """The bundled living-cluster model (trained with live node load, so load can change its
    choice), else the bundled default model, else None (the FGD heuristic serves)."""
    default = rlstack.bundled_model()
    if default is None:
        return None
    living = default.parent / "ppo-openb-dynamic.npz"
    return living if living.is_file() else default


def apply_policy(cluster: Any) -> dict:
    model = served_model()
    spec: dict[str, Any] = {"mode": "active", "fallback": "fgd", "topK": 1}
    if model is not None:
        spec["model"] = {"path": str(model)}
    cluster.apply(
        [
            {
                "apiVersion": "rlsched.io/v1alpha1",
                "kind": "SchedulingPolicy",
                "metadata": {"name": "default", "namespace": NS},
                "spec": spec,
            }
        ]
    )
    return spec


def policy_status(cluster: Any) -> dict:
    out = cluster.kubectl("get", "schedulingpolicy", "default", "-n", NS, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def conditions(pol: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (pol.get("status") or {}).get("conditions") or []}


def status_problem(exc: Exception, stack: Any) -> str:
    """What a failed read of the extender's /status means, in one line (with what to do about it)."""
    code = getattr(exc, "code", None)
    token = getattr(stack.extender, "token_path", None)
    if code == 401:
        return (
            f"HTTP 401: the extender refused the stack's token ({token or 'none'}); the tokens expire "
            "(kubectl create token) and hack/rlstack.py up renews them: run hack/demo.sh again"
        )
    if code == 403:
        return (
            f"HTTP 403: the token's ServiceAccount ({rlstack.IDENTITY_NAMESPACE}/{rlstack.STACK_IDENTITY}) may not "
            f"read /status (ClusterRole {rlstack.READER_ROLE}): run hack/demo.sh again"
        )
    return str(exc)


def main() -> int:
    cluster = rlstack.LocalCluster.from_env()
    stack = rlstack.Stack.load(cluster)
    if not stack.extender.alive() or not stack.scheduler.alive():
        log("the stack is not running: start it with hack/demo.sh")
        return 1
    try:
        stack.extender.status()
    except Exception as exc:  # noqa: BLE001 - said plainly, not as a traceback
        log(f"the extender's /status does not answer: {status_problem(exc, stack)}")
        return 1

    log(f"creating {len(NODES)} kwok GPU nodes (V100M16, T4, A100)")
    created = time.monotonic()  # the nodes' load series start about now
    rlstack.create_nodes(
        cluster,
        [rlstack.kwok_node(n, cpu, mem, cards, model, labels={LABEL: "1"}) for n, cpu, mem, cards, model in NODES],
    )
    rlstack.ensure_namespace(cluster, NS)

    if stack.operator.alive():
        spec = apply_policy(cluster)
        log(f"SchedulingPolicy {NS}/default: {json.dumps(spec)}; waiting for the operator's rollout")
        gen = None
        try:

            def rolled() -> Any:
                pol = policy_status(cluster)
                c = conditions(pol)
                nonlocal gen
                gen = pol.get("metadata", {}).get("generation")
                if pol.get("status", {}).get("observedGeneration") == gen and ("Ready" in c or "Degraded" in c):
                    return c
                return None

            conds = rlstack.wait_for(rolled, 90, "the SchedulingPolicy to be rolled out")
            ready = conds.get("Ready", {})
            log(f"policy Ready={ready.get('status')} ({ready.get('reason')}: {cut(ready.get('message', ''), 160)})")
        except AssertionError as exc:
            log(f"the operator did not report a rollout: {exc}")

    # Idempotent: replace the demo's pods.
    gone = cluster.kubectl(
        "delete",
        "pods",
        "-n",
        NS,
        "-l",
        "app=rlsched-demo",
        "--grace-period=0",
        "--wait=true",
        "--timeout=60s",
        check=False,
    )
    if gone.stdout.strip():
        time.sleep(2.5)  # the load exporter's next refresh (every 2 s) no longer counts them

    if stack.exporter.alive():
        stack.exporter.pin(HOT_NODE, cpu=HOT_CPU)
        log(f"{HOT_NODE} made hot: the load exporter publishes {HOT_CPU:.0%} CPU for it (a noisy neighbour)")
    # Prometheus finds a new node's target on its next file_sd refresh and scrape (~10 s here)
    load_wait = wait_for_load(stack, LOAD_WAIT_S, settled_at=created + rlstack.LOCAL_RATE_WINDOW_S + 15)
    log(f"submitting {len(PODS)} pods")
    for name, cpu, mem, cards, milli, models, scheduler, annot in PODS:
        body = rlstack.pod_manifest(
            name,
            cpu,
            mem,
            cards,
            milli,
            models,
            scheduler_name=scheduler,
            namespace=NS,
            labels={"app": "rlsched-demo"},
            node_selector={LABEL: "1"},
            share_as_annotation=annot,
        )
        cluster.apply([body])

    def settled() -> Any:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app=rlsched-demo", "-o", "json").stdout)[
            "items"
        ]
        by = {p["metadata"]["name"]: p for p in pods}
        if len(by) < len(PODS):
            return None
        for name, *_ in PODS:
            p = by[name]
            if name in UNFIT:
                if not any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions") or []):
                    return None
            elif not p["spec"].get("nodeName"):
                return None
        return by

    pods = rlstack.wait_for(settled, 120, "every pod to be placed (or found unschedulable)", interval=1)
    time.sleep(1)
    report(cluster, stack, pods, load_wait)
    return 0


class LoadWait:
    """What the extender knew of node load when the pods were submitted."""

    def __init__(self, columns: dict[str, dict] | None, waited_s: float, known: bool, why: str = ""):
        self.columns = columns  # /status load.columns; None: the extender reads no Prometheus
        self.waited_s = waited_s
        self.known = known  # every configured column fresh for every demo node
        self.why = why
        self.published: dict[str, dict[str, float]] = {}  # the load exporter's values at that moment


def fresh_counts(columns: dict[str, dict]) -> str:
    """``cpu 8/8, memory 8/8, …``: per configured load column, demo-node count with a fresh value."""
    return ", ".join(
        f"{k} {min(v['freshNodes'], len(NODES))}/{len(NODES)}" for k, v in columns.items() if v["configured"]
    )


def wait_for_load(stack: Any, timeout: float, settled_at: float = 0.0) -> LoadWait:
    """:func:`await_load`, with what the load exporter publishes at the end (the truth the extender's
    values can be compared with)."""
    out = await_load(stack, timeout, settled_at)
    try:
        out.published = stack.exporter.loads() if stack.exporter.alive() else {}
    except Exception:  # noqa: BLE001 - an optional detail of the report
        out.published = {}
    return out


def await_load(stack: Any, timeout: float, settled_at: float = 0.0) -> LoadWait:
    """Wait until the extender's /status reports fresh load for every demo node in every configured
    column (the exporter's series must be scraped by Prometheus, rates need two scrapes, and the
    extender polls Prometheus every few seconds), and until ``settled_at`` (``time.monotonic()``; the
    nodes' series then span a whole rate window, so rates read true). Progress on stderr; never silent
    when it gives up."""
    start = time.monotonic()
    try:
        columns = (stack.extender.status().get("load") or {}).get("columns")
    except Exception as exc:  # noqa: BLE001 - said plainly; the demo goes on without node load
        why = f"unknown: the extender's /status does not answer ({status_problem(exc, stack)})"
        log(f"node load {why}; the pods are submitted WITHOUT node load known")
        return LoadWait(None, 0.0, False, why)
    if columns is None:
        why = "none: the extender reads no Prometheus (no prometheus.url)"
        log(f"node load {why}; the pods are placed WITHOUT node load")
        return LoadWait(None, 0.0, False, why)
    exporter = "" if stack.exporter.alive() else " (no load exporter runs: hack/rlstack.py up --load-exporter)"
    log(f"waiting up to {timeout:.0f} s for the extender to see node load from Prometheus{exporter}")
    last_line, last_log = "", start
    while True:
        try:
            columns = stack.extender.status()["load"]["columns"]
        except Exception as exc:  # noqa: BLE001 - keep waiting; the extender may be busy
            log(f"  extender /status: {exc}")
        configured = [c for c in columns.values() if c["configured"]]
        waited = time.monotonic() - start
        if configured and all(c["freshNodes"] >= len(NODES) for c in configured):
            if time.monotonic() >= settled_at or waited >= timeout:
                log(f"node load known after {waited:.0f} s: {fresh_counts(columns)} demo nodes fresh")
                return LoadWait(columns, waited, True)
            if last_line != "settling":
                log(f"  {waited:3.0f} s: every demo node fresh; waiting for their rates to span a whole window")
                last_line = "settling"
            time.sleep(1)
            continue
        line = fresh_counts(columns)
        if waited >= timeout:
            if any(c["freshNodes"] for c in configured):
                why = f"known only in part after {waited:.0f} s ({line} demo nodes fresh)"
                log(f"node load {why}: the pods are placed with what is known")
            else:
                errors = "; ".join(f"{k}: {v['lastError']}" for k, v in columns.items() if v.get("lastError"))
                why = f"not known yet: no fresh value from Prometheus after {waited:.0f} s" + (
                    f" (last errors: {cut(errors, 200)})" if errors else ""
                )
                log(
                    f"node load {why}; the pods are submitted WITHOUT node load known (the extender keeps "
                    "polling Prometheus: the report says which placements saw it)"
                )
            return LoadWait(columns, waited, False, why)
        if line != last_line or time.monotonic() - last_log >= 10:
            log(f"  {waited:3.0f} s: {line} demo nodes with fresh load")
            last_line, last_log = line, time.monotonic()
        time.sleep(1)


def cut(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters; a longer one ends at a word boundary with "…"."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    return (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(" ,;:") + "…"


def table(rows: list[tuple[str, ...]], right: frozenset[int] = frozenset()) -> str:
    """Columns as wide as their widest cell (8 cards, "0,1,2,3,4,5,6,7", stay in line); the last unpadded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        " ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        )
        + "  "
        + row[-1]
        for row in rows
    )


def bar(milli: int) -> str:
    full = round(milli / 100)
    return "█" * full + "·" * (10 - full)


def report(cluster: Any, stack: Any, pods: dict[str, dict], load_wait: LoadWait) -> None:
    status = stack.extender.status()
    nodes = {n: (cards, model) for n, _, _, cards, model in NODES}
    print()
    print(f"Policy serving (extender /status): {rlstack.describe_policy(status)}")
    pol = policy_status(cluster)
    if pol:
        c = conditions(pol)
        model = (pol.get("status") or {}).get("model") or {}
        print(
            f"SchedulingPolicy {NS}/default: Ready={c.get('Ready', {}).get('status')} "
            f"({c.get('Ready', {}).get('reason')}), model {model.get('version') or 'none (heuristic)'}"
        )
    print()
    rows = [("POD", "SCHEDULER", "NODE", "MODEL", "CARDS", "MILLI/CARD", "WANTED")]
    used: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for name, cpu, _mem, cards, milli, models, scheduler, _annot in PODS:
        p = pods[name]
        node = p["spec"].get("nodeName") or "-"
        a = rlstack.card_assignment(p)
        card_txt = ",".join(map(str, a[1])) if a and a[1] else "-"
        per = str(a[2]) if a and a[1] else "-"
        if a and a[1]:
            for c in a[1]:
                used[node][c] += a[2]
        elif node != "-" and cards:  # default-scheduler GPU pods: counted, card unknown
            used[node][-1] += cards * milli
        want = f"{cards} card(s)" if milli == 1000 else f"{milli} milli" if cards else "cpu only"
        want += f" {'|'.join(models)}" if models else ""
        want += f", {cpu // 1000} cpu"
        model = nodes.get(node, ("", "-"))[1] if node != "-" else "-"
        rows.append((name, scheduler, node, model, card_txt, per, want))
    print(table(rows, right=frozenset({5})))
    print()
    for name in sorted(UNFIT):
        evs = json.loads(
            cluster.kubectl(
                "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name}", "-o", "json"
            ).stdout
        )["items"]
        msg = next((e.get("message", "") for e in reversed(evs) if e.get("reason") == "FailedScheduling"), "")
        print(f"{name} is pending: {cut(msg, 400)}")
    print()
    print("GPU allocation per node (each bar is one card, █ = 100 milli):")
    total_used = total_cap = free_cards = 0
    for node, (cards, model) in nodes.items():
        row = used.get(node, {})
        alloc = sum(row.values())
        cap = cards * 1000
        total_used += alloc
        total_cap += cap
        free = sum(1 for c in range(cards) if row.get(c, 0) == 0)
        free_cards += free
        bars = " ".join(bar(row.get(c, 0)) for c in range(cards))
        print(f"  {node:13} {model:8} {alloc:5}/{cap:5} milli {100 * alloc / cap:5.1f} %  {free} free card(s)  {bars}")
    cache = status["cache"]
    print(
        f"Cluster-wide (demo nodes): {total_used}/{total_cap} GPU milli allocated "
        f"({100 * total_used / total_cap:.1f} %), "
        f"{free_cards} cards entirely free; the extender's own count over all nodes: "
        f"{cache['gpuMilliAllocated']}/{cache['gpuMilliCapacity']} milli"
    )
    print()
    report_load(cluster, stack, status, pods, load_wait)


def decisions_by_pod(stack: Any, pods: dict[str, dict]) -> dict[str, dict]:
    """Per demo pod placed by our scheduler, the extender's last filter record that chose its node."""
    uids = {p["metadata"]["uid"]: name for name, p in pods.items()}
    out: dict[str, dict] = {}
    after = 0
    while True:
        page = stack.extender.decisions(after=after)
        for r in page["records"]:
            name = uids.get((r.get("pod") or {}).get("uid"))
            node = r.get("node")
            if name and node and r.get("kind") == "filter" and node == pods[name]["spec"].get("nodeName"):
                out[name] = r
        if not page["records"] or page["next"] <= after:
            return out
        after = page["next"]


def prose(text: str, first: str = "", rest: str = "") -> str:
    """``text`` wrapped to 110 columns, the first line indented by ``first``, the others by ``rest``."""
    return textwrap.fill(text, 110, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def fmt_load(load: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {'unknown' if v is None else f'{100 * v:.0f} %'}" for k, v in load.items())


def node_ages(cluster: Any, at: float) -> dict[str, float]:
    """Seconds each demo node had existed at wall time ``at`` (its series are about that old)."""
    out = cluster.kubectl("get", "nodes", "-l", LABEL, "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    ages = {}
    for n in json.loads(out.stdout)["items"]:
        created = time.strptime(n["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        ages[n["metadata"]["name"]] = at - calendar.timegm(created)
    return ages


def saw_load(record: dict) -> bool:
    """Whether a decision record saw any load column of the node it chose."""
    load = ((record.get("features") or {}).get("node") or {}).get("load") or {}
    return any(v is not None for v in load.values())


def placement_verdict(records: dict[str, dict], known: bool) -> str:
    """Whether the pods were placed with node load, from the extender's decision records (not from the
    state at submission: the extender keeps polling Prometheus, so load can arrive before placement).
    Empty when load was known at submission and every placement saw it: nothing to add."""
    n = len(records)
    saw = sum(1 for r in records.values() if saw_load(r))
    if n == 0:
        return "Whether the placements saw node load is unknown: the extender has no decision record of them."
    if saw == 0:
        return f"None of the {n} placements saw the chosen node's load: the pods were placed WITHOUT node load."
    if saw == n:
        if known:
            return ""
        return (
            f"All {n} placements saw the chosen node's load: the pods were placed WITH it (the extender keeps "
            "polling Prometheus, and the load reached it before the placements)."
        )
    rest = n - saw
    were = "was" if rest == 1 else "were"
    return f"{saw} of {n} placements saw the chosen node's load; {rest} {were} placed WITHOUT it."


def report_load(cluster: Any, stack: Any, status: dict, pods: dict[str, dict], load_wait: LoadWait) -> None:
    """Node load as the extender had it when it placed the pods, and what the policy makes of it."""
    if load_wait.columns is None:
        print(f"Node load when the pods were submitted: {load_wait.why}")
    elif load_wait.known:
        print(
            f"Node load when the pods were submitted (extender /status): {fresh_counts(load_wait.columns)} "
            + (
                f"demo nodes fresh — waited {load_wait.waited_s:.0f} s for Prometheus' first scrapes"
                if load_wait.waited_s >= 1
                else "demo nodes fresh, no wait needed"
            )
        )
    else:
        print(f"Node load when the pods were submitted: {load_wait.why}")
        now = ((status.get("load") or {}).get("columns")) or {}
        print(f"  ({fresh_counts(load_wait.columns)} demo nodes fresh then; now {fresh_counts(now) or 'unknown'})")
    try:
        records = decisions_by_pod(stack, pods)
    except Exception as exc:  # noqa: BLE001 - the report goes on without the decision log
        print(f"  (extender /decisions: {exc})")
        records = {}
    verdict = placement_verdict(records, load_wait.known)
    if verdict:
        print(prose(verdict))
    seen = [(name, r, ((r.get("features") or {}).get("node") or {}).get("load") or {}) for name, r in records.items()]
    if any(saw_load(r) for r in records.values()):
        cols = list(next(ld for *_, ld in seen if ld))
        counts = ", ".join(f"{k} {sum(1 for *_, ld in seen if ld.get(k) is not None)}/{len(seen)}" for k in cols)
        print(f"Placements that saw the chosen node's load (extender /decisions): {counts}")
        # The first pod submitted: nothing was placed yet, so the exporter's values then are the truth.
        name, rec, ld = next((n, r, ld) for n, r, ld in seen if any(v is not None for v in ld.values()))
        node = rec["node"]
        text = f"e.g. {name} -> {node}: the extender saw {fmt_load(ld)} on that node"
        truth = load_wait.published.get(node)
        if truth:
            text += f"; the load exporter published {fmt_load(truth)} for it before the pods."
        age = node_ages(cluster, float(rec["time"])).get(node)
        rates = [k for k in ("cpu", "network", "disk") if ld.get(k) is not None]
        window = rlstack.LOCAL_RATE_WINDOW_S
        if age is not None and age < window + 10 and rates:
            text += (
                f" Memory, a gauge, is right from the first scrape; {', '.join(rates)} are rates over {window} s, "
                f"and this node's series were {age:.0f} s old: until {window} s are scraped, Prometheus reads cpu "
                "too high and network and disk too low (docs/e2e.md)."
            )
        print(prose(text, "  ", "       "))
    report_load_choices(records, load_wait)


def report_load_choices(records: dict[str, dict], load_wait: LoadWait) -> None:
    """The decisions where load changed the choice: the extender's ``explainLoad`` decided each pod a
    second time with load unknown (``withoutLoad`` in its record)."""
    explained = {name: r["withoutLoad"] for name, r in records.items() if "node" in (r.get("withoutLoad") or {})}
    if not explained:
        print(
            prose(
                "No placement was explained: the extender decides a pod a second time without load only "
                "while load is known and explainLoad is on (hack/rlstack.py up --explain-load)."
            )
        )
        return
    changed = {name: w for name, w in explained.items() if w["changed"]}
    print(
        f"Where load changed the choice (explainLoad: each pod decided again with load unknown): "
        f"{len(changed)} of {len(explained)} placements"
    )

    def cpu(node: str | None) -> str:
        value = (load_wait.published.get(node or "") or {}).get("cpu")
        return "" if value is None else f" (cpu {100 * value:.0f} %)"

    for name, w in sorted(changed.items()):
        node = records[name]["node"]
        print(f"  {name} -> {node}{cpu(node)}; with load unknown it would have gone to {w['node']}{cpu(w['node'])}")
    if not changed:
        print(
            prose(
                "  Load did not change any of these choices: the served policy ranked the same node first with "
                "and without it (a model trained without load, or a heuristic that scores no load, never will).",
                "",
                "  ",
            )
        )
    print(prose("Policies trained with load, and what load buys at cluster scale: docs/dynamic.md."))


if __name__ == "__main__":
    sys.exit(main())
