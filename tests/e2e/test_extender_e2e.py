"""The extender behind the real kube-scheduler, on the real API server, with kwok GPU nodes.

One stack for the module (``hack/rlstack.py``, the same code ``hack/demo.sh`` runs): ``rlsched
extender`` as a local process (the bundled model when installed, else the FGD fallback), a second
kube-scheduler with the configuration from ``rlsched.extender.scheduler_config`` (profile
``rl-scheduler``, the extender on loopback, leader election on its own lease ``kube-system/rl-scheduler``
with the RBAC grant the chart makes), the cluster's own kube-scheduler serving ``default-scheduler``,
and ``hack/load_exporter.py`` feeding the cluster's Prometheus, which the extender queries.

kwok nodes of this module carry the label ``rlsched.io/e2e=<suite>`` and a pool label; every pod
selects its pool, so other modules' nodes and pods never mix in. What is checked:

- pods asking whole cards, shares (resource and annotation), a card model, or no GPU land on nodes
  that fit, with card ids written at bind that match the node, the request and the model, and no
  card is ever oversubscribed (and whole cards are never shared); the decision ring agrees;
- pods that cannot fit stay pending with a ``FailedScheduling`` event that says why;
- pods of the default scheduler are not touched by the extender, but their cards are counted;
- the extender killed with SIGKILL while pods stream in, then restarted: every pod is placed, nothing
  is double-booked, and the restarted extender's accounting equals the annotations;
- node load comes from Prometheus (node-exporter series of the load exporter) into the extender;
- our kube-scheduler holds its own lease; /status says which policy serves.

Tests marked ``kind`` also run against a cluster with the chart installed (``hack/kind-e2e.sh``:
``RLSCHED_E2E_KUBECONFIG``); the others need the local processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.utils import parse_quantity

REPO_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rlstack", REPO_ROOT / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]

SUITE = f"ext-{uuid.uuid4().hex[:6]}"
NS = f"rlsched-e2e-{SUITE}"
SUITE_LABEL = "rlsched.io/e2e"
POOL_LABEL = "rlsched.io/e2e-pool"
SCHEDULER = os.environ.get("RLSCHED_E2E_SCHEDULER_NAME", rlstack.SCHEDULER_NAME)

# pool → [(kind, count, cpu milli, memory MiB, cards, model)]
POOLS: dict[str, list[tuple[str, int, int, int, int, str]]] = {
    "main": [
        ("a100", 2, 32000, 131072, 4, "A100"),
        ("v100", 3, 64000, 262144, 8, "V100M16"),
        ("t4", 2, 16000, 65536, 2, "T4"),
        ("cpu", 1, 32000, 131072, 0, ""),
    ],
    "shared": [("t4", 1, 16000, 65536, 2, "T4")],
    "restart": [("v100", 4, 64000, 262144, 8, "V100M16")],
}


def node_name(pool: str, kind: str, i: int) -> str:
    return f"{SUITE}-{pool}-{kind}-{i}"


def all_nodes() -> list[dict[str, Any]]:
    out = []
    for pool, kinds in POOLS.items():
        for kind, count, cpu, mem, cards, model in kinds:
            for i in range(count):
                out.append(
                    rlstack.kwok_node(
                        node_name(pool, kind, i), cpu, mem, cards, model, labels={SUITE_LABEL: SUITE, POOL_LABEL: pool}
                    )
                )
    return out


def wait_for(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    return rlstack.wait_for(fn, timeout, what, interval)


# -- the environment -------------------------------------------------------------------------------


class Env:
    """Kubernetes access for the tests, plus the local stack (None against an external cluster)."""

    def __init__(self, cluster: Any):
        import kubernetes

        self.cluster = cluster
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
        self.client = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.coord = kubernetes.client.CoordinationV1Api(self.client)
        self.stack: Any = None
        self.nodes = {n["metadata"]["name"]: n for n in all_nodes()}

    # nodes and pods as plain JSON (what the extender sees)
    def raw_pods(self, label_selector: str | None = None) -> list[dict]:
        r = self.core.list_namespaced_pod(NS, label_selector=label_selector, _preload_content=False)
        return json.loads(r.data)["items"]

    def all_pods(self) -> list[dict]:
        r = self.core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False
        )
        return json.loads(r.data)["items"]

    def create_nodes(self) -> None:
        from kubernetes.client.exceptions import ApiException

        for name, body in self.nodes.items():
            try:
                self.core.create_node(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            self.core.patch_node_status(name, {"status": body["status"]})

        def ready() -> bool:
            items = json.loads(
                self.core.list_node(label_selector=f"{SUITE_LABEL}={SUITE}", _preload_content=False).data
            )["items"]
            return sum(
                any(c["type"] == "Ready" and c["status"] == "True" for c in i["status"].get("conditions") or [])
                for i in items
            ) == len(self.nodes)

        wait_for(ready, 120, f"{len(self.nodes)} kwok nodes Ready")

    def delete_nodes(self) -> None:
        self.core.delete_collection_node(label_selector=f"{SUITE_LABEL}={SUITE}")

    def submit(self, pods: Iterable[dict]) -> list[str]:
        names = []
        for p in pods:
            self.core.create_namespaced_pod(NS, p)
            names.append(p["metadata"]["name"])
        return names

    def pod(self, name: str) -> dict:
        return json.loads(self.core.read_namespaced_pod(name, NS, _preload_content=False).data)

    def wait_bound(self, names: Iterable[str], timeout: float = 120) -> dict[str, dict]:
        want = set(names)

        def bound() -> dict[str, dict] | None:
            pods = {p["metadata"]["name"]: p for p in self.raw_pods() if p["metadata"]["name"] in want}
            missing = [n for n in want if not pods.get(n, {}).get("spec", {}).get("nodeName")]
            return pods if not missing else None

        try:
            return wait_for(bound, timeout, f"{len(want)} pods to be bound")
        except AssertionError:
            pending = [
                p["metadata"]["name"]
                for p in self.raw_pods()
                if p["metadata"]["name"] in want and not p["spec"].get("nodeName")
            ]
            raise AssertionError(
                f"not bound after {timeout:.0f}s: {pending[:10]}; events: {[self.events(n)[-1:] for n in pending[:3]]}"
            ) from None

    def events(self, name: str) -> list[dict]:
        r = self.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}", _preload_content=False)
        items = json.loads(r.data)["items"]
        items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return [
            {
                "reason": e.get("reason"),
                "message": e.get("message") or e.get("note") or "",
                "source": (e.get("source") or {}).get("component") or e.get("reportingComponent") or "",
            }
            for e in items
        ]


def pod(
    name: str,
    pool: str = "main",
    cpu: int = 1000,
    mem: int = 2048,
    gpus: int = 0,
    milli: int = 0,
    models: tuple[str, ...] = (),
    scheduler: str | None = None,
    annotation_share: bool = False,
    hostname: str | None = None,
    extra_resources: dict[str, str] | None = None,
) -> dict:
    selector = {POOL_LABEL: pool, SUITE_LABEL: SUITE}
    if hostname:
        selector["kubernetes.io/hostname"] = hostname
    body = rlstack.pod_manifest(
        name,
        cpu,
        mem,
        gpus,
        milli if gpus else 0,
        models,
        scheduler_name=scheduler or SCHEDULER,
        labels={"suite": SUITE, "pool": pool},
        node_selector=selector,
        share_as_annotation=annotation_share,
    )
    if extra_resources:
        for section in ("requests", "limits"):
            body["spec"]["containers"][0]["resources"].setdefault(section, {}).update(extra_resources)
    return body


# -- the one consistency check ---------------------------------------------------------------------


def check_consistent(
    pods: Iterable[dict], nodes: dict[str, dict], our_scheduler: str = SCHEDULER
) -> dict[str, dict[int, int]]:
    """Every bound pod fits its node; card annotations agree with node, request and model; no card is
    oversubscribed and a whole card is never shared. Returns node → card → milli taken."""
    cards_used: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    whole_owner: dict[tuple[str, int], str] = {}
    cpu_used: dict[str, int] = defaultdict(int)
    mem_used: dict[str, int] = defaultdict(int)
    problems = []
    for p in pods:
        name, node = p["metadata"]["name"], p["spec"].get("nodeName")
        if not node or node not in nodes:
            continue
        n = nodes[node]
        res = p["spec"]["containers"][0]["resources"].get("requests", {})
        ann = p["metadata"].get("annotations") or {}
        cpu_used[node] += int(parse_quantity(res.get("cpu", "0")) * 1000)
        mem_used[node] += int(parse_quantity(res.get("memory", "0")) / 2**20)
        whole = int(res.get(rlstack.GPU_RESOURCE, 0))
        share = int(res.get(rlstack.GPU_MILLI_RESOURCE, ann.get(rlstack.GPU_MILLI_ANNOTATION, 0)))
        node_cards = int(n["status"]["allocatable"].get(rlstack.GPU_RESOURCE, 0))
        model = n["metadata"]["labels"].get(rlstack.GPU_MODEL_LABEL, "")
        assignment = rlstack.card_assignment(p)
        if p["spec"].get("schedulerName") != our_scheduler:
            if assignment is not None:
                problems.append(f"{name}: pod of {p['spec'].get('schedulerName')} carries card annotations {ann}")
            continue
        if not (whole or share):
            if assignment is not None and assignment[1]:
                problems.append(f"{name}: CPU pod got cards {assignment}")
            continue
        if assignment is None:
            problems.append(f"{name}: GPU pod bound to {node} without {rlstack.CARDS_ANNOTATION}")
            continue
        a_node, cards, milli = assignment
        if a_node != node:
            problems.append(f"{name}: cards recorded for {a_node} but bound to {node}")
        allowed = [m for m in (ann.get(rlstack.GPU_MODELS_ANNOTATION, "").replace(",", "|").split("|")) if m]
        if allowed and model not in allowed:
            problems.append(f"{name}: model {model} not in {allowed}")
        want = (whole, 1000) if whole else (1, share)
        if (len(cards), milli) != want or len(set(cards)) != len(cards):
            problems.append(f"{name}: cards {cards} × {milli} milli, wanted {want[0]} × {want[1]}")
        for c in cards:
            if not 0 <= c < node_cards:
                problems.append(f"{name}: card {c} outside 0..{node_cards - 1} on {node}")
            cards_used[node][c] += milli
            if milli == 1000:
                if (node, c) in whole_owner:
                    problems.append(f"{name}: whole card {node}/{c} also held by {whole_owner[node, c]}")
                whole_owner[node, c] = name
    for node, cards in cards_used.items():
        for c, m in cards.items():
            if m > 1000:
                problems.append(f"{node} card {c}: {m} milli taken (> 1000)")
    for node in cpu_used:
        alloc = nodes[node]["status"]["allocatable"]
        if (
            cpu_used[node] > parse_quantity(alloc["cpu"]) * 1000
            or mem_used[node] > parse_quantity(alloc["memory"]) / 2**20
        ):
            problems.append(f"{node}: cpu {cpu_used[node]}m / memory {mem_used[node]}Mi over allocatable {alloc}")
    assert not problems, "\n".join(problems)
    return cards_used


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(cluster: Any) -> Any:
    e = Env(cluster)
    from kubernetes.client.exceptions import ApiException

    try:
        e.core.create_namespace({"metadata": {"name": NS}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    wait_for(
        lambda: e.core.read_namespaced_service_account("default", NS), 60, "the namespace's default ServiceAccount"
    )
    e.create_nodes()
    try:
        if not cluster.external:
            local = rlstack.LocalCluster(Path(cluster.state_dir))
            # The cluster's own kube-scheduler must serve default-scheduler (another module may have
            # left it with another configuration).
            conf_path = Path(cluster.state_dir) / "kube-scheduler.yaml"
            conf = conf_path.read_text() if conf_path.exists() else ""
            running = (Path(cluster.state_dir) / "run" / "kube-scheduler.pid").exists()
            if not running or "schedulerName: default-scheduler" not in conf or "extenders" in conf:
                cluster.scheduler(None)
            stack = e.stack = rlstack.Stack(local)  # before up(): a failed start is still torn down
            stack.up(
                model="auto",
                load_exporter=local.prometheus_url is not None,
                exporter_selector=f"{SUITE_LABEL}={SUITE}",
                extender_settings={"prometheus": {"intervalS": 2.0}, "decisionRingSize": 8192},
            )
        yield e
    finally:
        try:
            e.core.delete_namespace(NS, grace_period_seconds=0)
        except Exception:  # noqa: BLE001 - best effort
            pass
        if e.stack is not None:
            for p in (e.stack.scheduler, e.stack.extender, e.stack.exporter):
                if p.log_path.exists():
                    print(f"--- tail of {p.log_path} ---\n{p.tail(15)}")
            e.stack.down()
        e.delete_nodes()


@pytest.fixture
def local(env: Env) -> Any:
    if env.stack is None:
        pytest.skip("needs the local stack (extender and kube-scheduler as local processes)")
    return env.stack


def bind_records(stack: Any) -> dict[str, dict]:
    """Pod name → its last ``kind: bind`` decision record (ok)."""
    out = {}
    for r in stack.extender.decisions(0, 8192)["records"]:
        if r["kind"] == "bind" and r["result"] == "ok":
            out[r["pod"]["name"]] = r
    return out


# -- tests ------------------------------------------------------------------------------------------


def test_our_scheduler_holds_its_own_lease(local: Any, env: Env) -> None:
    lease = wait_for(
        lambda: env.coord.read_namespaced_lease(rlstack.LEASE_NAME, rlstack.LEASE_NAMESPACE),
        30,
        "the lease kube-system/rl-scheduler",
    )
    assert lease.spec.holder_identity, lease
    age = time.time() - lease.spec.renew_time.timestamp()
    assert age < 30, f"lease not renewed for {age:.0f}s"
    assert "Successfully acquired lease" in local.scheduler.log_path.read_text()


def test_status_says_which_policy_serves(local: Any) -> None:
    status = local.extender.status()
    policy = status["policy"]
    served = rlstack.describe_policy(status)
    print(f"policy serving: {served}")
    bundled = rlstack.bundled_model()
    if bundled is not None:
        # Loaded and serving: a model that failed to load left the stack up on the fallback (the
        # extender runs with --no-strict-model), and "loaded or an error" passed for that too.
        assert policy["model"]["path"] == str(bundled)
        assert policy["model"]["loaded"] and policy["model"]["error"] is None, policy["model"]
        assert policy["model"]["version"] and policy["mode"] == "active", policy
    else:
        assert policy["model"]["path"] is None and not policy["model"]["loaded"]
        assert policy["fallback"] == "fgd" and served.startswith("heuristic fgd")


MIXED = [
    # name, kwargs of pod(). The model-constrained pods come first: kube-scheduler takes pods in
    # creation order, so they find their models free whatever the policy did with the rest (the whole
    # batch asks ~29 of the pool's 36 cards).
    ("a100-only-a", dict(gpus=1, milli=1000, models=("A100",))),
    ("a100-only-b", dict(gpus=2, milli=1000, models=("A100",))),
    ("v100-or-t4-share", dict(gpus=1, milli=400, models=("V100M16", "T4"))),
    ("t4-only", dict(gpus=1, milli=1000, models=("T4",))),
    ("whole-8", dict(cpu=8000, mem=32768, gpus=8, milli=1000)),  # only a V100 node has 8 cards
    ("whole-4", dict(cpu=4000, mem=16384, gpus=4, milli=1000)),
    ("whole-2-a", dict(gpus=2, milli=1000)),
    ("whole-2-b", dict(gpus=2, milli=1000)),
    ("whole-1-a", dict(gpus=1, milli=1000)),
    ("whole-1-b", dict(gpus=1, milli=1000)),
    ("whole-1-c", dict(gpus=1, milli=1000)),
    ("whole-1-d", dict(gpus=1, milli=1000)),
    ("share-250-a", dict(gpus=1, milli=250)),
    ("share-250-b", dict(gpus=1, milli=250)),
    ("share-250-c", dict(gpus=1, milli=250)),
    ("share-250-d", dict(gpus=1, milli=250)),
    ("share-500-a", dict(gpus=1, milli=500)),
    ("share-500-b", dict(gpus=1, milli=500)),
    ("share-500-c", dict(gpus=1, milli=500)),
    ("share-700-a", dict(gpus=1, milli=700)),
    ("share-700-b", dict(gpus=1, milli=700)),
    ("share-300-annotation-a", dict(gpus=1, milli=300, annotation_share=True)),
    ("share-300-annotation-b", dict(gpus=1, milli=300, annotation_share=True)),
    ("cpu-a", dict(cpu=4000)),
    ("cpu-b", dict(cpu=2000)),
    ("cpu-c", dict(cpu=500)),
]


@pytest.mark.kind
def test_pods_land_on_fitting_nodes_with_consistent_cards(env: Env) -> None:
    names = env.submit(pod(n, **kw) for n, kw in MIXED)
    pods = env.wait_bound(names, timeout=120)
    used = check_consistent(pods.values(), env.nodes)
    kinds = {n: pods[n]["spec"]["nodeName"].split("-main-")[1].split("-")[0] for n in names}
    assert kinds["whole-8"] == "v100"
    assert kinds["a100-only-a"] == kinds["a100-only-b"] == "a100"
    assert kinds["t4-only"] == "t4" and kinds["v100-or-t4-share"] in ("v100", "t4")
    assert all(pods[n]["spec"]["schedulerName"] == SCHEDULER for n in names)
    # Shares were packed onto cards rather than each taking a fresh one (any sane policy does).
    share_cards = {
        (pods[n]["spec"]["nodeName"], rlstack.card_assignment(pods[n])[1][0]) for n in names if n.startswith("share")
    }
    assert len(share_cards) < sum(1 for n in names if n.startswith("share")), share_cards
    print("GPU milli per node/card:", {n: dict(c) for n, c in used.items()})
    if env.stack is not None:
        # The decision ring: every bind followed the policy's choice and recorded the same cards.
        records = bind_records(env.stack)
        # ... and the policy made each choice: "followedPolicy" compares with filter's choice, which
        # the fallback makes when the model fails.
        filters = {
            r["pod"]["name"]: r
            for r in env.stack.extender.decisions(0, 8192)["records"]
            if r["kind"] == "filter" and r.get("node")
        }
        for n in names:
            r = records[n]
            a = rlstack.card_assignment(pods[n])
            assert filters[n]["servedBy"] == "policy" and filters[n]["fallbackReason"] is None, filters[n]
            assert r["node"] == pods[n]["spec"]["nodeName"] and r["followedPolicy"], r
            if a is not None:
                assert tuple(r["cards"]) == a[1], (n, r, a)


@pytest.mark.kind
def test_pods_that_cannot_fit_stay_pending_and_say_why(env: Env) -> None:
    cases = {
        "too-many-cards": (dict(gpus=16, milli=1000), ["Insufficient nvidia.com/gpu"]),
        "unknown-model": (dict(gpus=1, milli=1000, models=("H100",)), ["GPU model", "not allowed"]),
        "whole-and-share": (
            dict(gpus=1, milli=1000, extra_resources={rlstack.GPU_MILLI_RESOURCE: "500"}),
            ["whole card", "share of 500 milli"],
        ),
        "share-too-large": (dict(extra_resources={rlstack.GPU_MILLI_RESOURCE: "1500"}), ["1..1000"]),
        "too-much-cpu": (dict(cpu=200000), ["Insufficient cpu"]),
    }
    env.submit(pod(n, **kw) for n, (kw, _) in cases.items())

    def explained(name: str, words: list[str]) -> Callable[[], Any]:
        def check() -> Any:
            evs = [e for e in env.events(name) if e["reason"] == "FailedScheduling"]
            return evs if evs and all(w in evs[-1]["message"] for w in words) else None

        return check

    for name, (_, words) in cases.items():
        evs = wait_for(explained(name, words), 60, f"a FailedScheduling event for {name} saying {words}")
        print(f"{name}: {evs[-1]['message'][:300]}")
    for name in cases:
        p = env.pod(name)
        assert not p["spec"].get("nodeName") and rlstack.card_assignment(p) is None, p["metadata"]
    env.core.delete_collection_namespaced_pod(
        NS, label_selector="suite", grace_period_seconds=0, field_selector="status.phase=Pending"
    )


@pytest.mark.kind
def test_default_scheduler_pods_are_untouched_but_counted(env: Env) -> None:
    host = node_name("shared", "t4", 0)
    env.submit([pod("default-gpu", pool="shared", gpus=1, milli=1000, scheduler="default-scheduler")])
    bound = env.wait_bound(["default-gpu"], timeout=60)["default-gpu"]
    assert bound["spec"]["nodeName"] == host
    assert rlstack.card_assignment(bound) is None, bound["metadata"].get("annotations")
    # kube-scheduler records its Scheduled event after the binding, asynchronously: wait for it
    scheduled = wait_for(
        lambda: [e for e in env.events("default-gpu") if e["reason"] == "Scheduled"] or None,
        30,
        "the Scheduled event of default-gpu",
    )
    assert scheduled and scheduled[-1]["source"] == "default-scheduler", scheduled
    # Our scheduler sees the card as taken: one card is left on the 2-card node, so two whole cards
    # do not fit there, while a share does — on the other card.
    env.submit(
        [pod("ours-two-cards", pool="shared", gpus=2, milli=1000), pod("ours-share", pool="shared", gpus=1, milli=600)]
    )
    share = env.wait_bound(["ours-share"], timeout=60)["ours-share"]
    assert share["spec"]["nodeName"] == host
    assert rlstack.card_assignment(share)[1] == (1,), "the default scheduler's pod is counted on card 0 (lowest free)"
    time.sleep(2)
    assert not env.pod("ours-two-cards")["spec"].get("nodeName")
    if env.stack is not None:
        recorded = {r["pod"]["name"] for r in env.stack.extender.decisions(0, 8192)["records"]}
        assert "default-gpu" not in recorded
        assert "ours-share" in recorded
    env.core.delete_namespaced_pod("ours-two-cards", NS, grace_period_seconds=0)


def test_extender_killed_mid_stream_then_restarted_places_everything_once(local: Any, env: Env) -> None:
    # ~70 % of the pool's 32 cards: shares of 200..600 milli, single and double whole cards.
    shapes = (
        [dict(gpus=1, milli=200 + 100 * (i % 5)) for i in range(16)]
        + [dict(gpus=1, milli=1000) for _ in range(10)]
        + [dict(gpus=2, milli=1000) for _ in range(3)]
        + [dict(cpu=2000) for _ in range(3)]
    )
    bodies = [pod(f"stream-{i:02d}", pool="restart", **kw) for i, kw in enumerate(shapes)]
    epoch_before = local.extender.decisions(0, 1)["epoch"]
    created: list[str] = []

    def submit() -> None:
        for b in bodies:
            env.submit([b])
            created.append(b["metadata"]["name"])
            time.sleep(0.15)

    t = threading.Thread(target=submit)
    t.start()
    wait_for(
        lambda: sum(1 for p in env.raw_pods("pool=restart") if p["spec"].get("nodeName")) >= 8,
        60,
        "the first pods of the stream to be bound",
    )
    local.extender.kill()
    killed_at = time.monotonic()
    bound_at_kill = sum(1 for p in env.raw_pods("pool=restart") if p["spec"].get("nodeName"))
    time.sleep(3)
    assert not local.extender.alive()
    local.extender.restart()
    restarted_after = time.monotonic() - killed_at
    t.join()
    pods = env.wait_bound([b["metadata"]["name"] for b in bodies], timeout=120)
    print(
        f"killed with {bound_at_kill}/{len(bodies)} bound; back after {restarted_after:.1f}s; all bound "
        f"{time.monotonic() - killed_at:.1f}s after the kill"
    )
    assert bound_at_kill < len(bodies), "the kill came too late to test anything"
    check_consistent(pods.values(), env.nodes)
    assert local.extender.decisions(0, 1)["epoch"] != epoch_before
    # The restarted extender rebuilt its card map from the annotations: its total equals theirs.
    status = local.extender.status()
    expected = 0
    for p in env.all_pods():
        node = p["spec"].get("nodeName")
        if not node:
            continue
        res = p["spec"]["containers"][0].get("resources", {}).get("requests", {})
        ann = p["metadata"].get("annotations") or {}
        if rlstack.GPU_RESOURCE in res:
            expected += 1000 * int(res[rlstack.GPU_RESOURCE])
        elif rlstack.GPU_MILLI_RESOURCE in res or rlstack.GPU_MILLI_ANNOTATION in ann:
            expected += int(res.get(rlstack.GPU_MILLI_RESOURCE, ann.get(rlstack.GPU_MILLI_ANNOTATION, 0)))
    wait_for(
        lambda: local.extender.status()["cache"]["gpuMilliAllocated"] == expected,
        20,
        f"the extender's gpuMilliAllocated to equal the pods' {expected}",
    )
    assert status["cache"]["gpuMilliCapacity"] > 0
    # kube-scheduler kept going: the failed attempts were retried, nothing was bound by anyone else.
    assert all(p["spec"]["schedulerName"] == SCHEDULER for p in pods.values())


def test_node_load_comes_from_prometheus(local: Any, env: Env) -> None:
    if env.cluster.prometheus_url is None:
        pytest.skip("the cluster runs without Prometheus (install it with hack/install-system-deps.sh)")
    suite_nodes = set(env.nodes)
    host = node_name("main", "cpu", 0)
    local.exporter.pin(host, memory=0.42, cpu=0.5)

    def fresh() -> Any:
        load = local.extender.status()["load"]["columns"]
        ok = all(c["freshNodes"] >= len(suite_nodes) and c["lastError"] is None for c in load.values())
        return load if ok else None

    load = wait_for(fresh, 90, "fresh load for every suite node in every column")
    print({k: (v["freshNodes"], v["ageSeconds"]) for k, v in load.items()})
    metrics = local.extender.metrics()
    line = next(ln for ln in metrics.splitlines() if ln.startswith('rlsched_extender_load_fresh_nodes{column="cpu"}'))
    assert float(line.split()[-1]) >= len(suite_nodes)
    # Memory is a gauge, so the pinned value shows up at the next scrape + poll: a pod pinned to that
    # node carries it in its decision record.
    from rlsched.extender.settings import DEFAULT_QUERIES

    def prom_memory() -> Any:
        res = rlstack.prometheus_query(env.cluster.prometheus_url, DEFAULT_QUERIES["memory"])
        vals = [float(r["value"][1]) for r in res if r["metric"].get("instance") == host]
        return vals if vals and abs(vals[0] - 0.42) < 1e-3 else None

    wait_for(prom_memory, 30, "Prometheus to return the pinned memory load")
    confirmed = time.monotonic()

    def polled_since() -> bool:
        # A poll that finished ≥ 0.5 s after Prometheus answered with the pinned value was sent after
        # it (a query takes milliseconds): waiting for one, not a fixed sleep, holds on a loaded machine.
        age = local.extender.status()["load"]["columns"]["memory"]["ageSeconds"]
        return age is not None and age < time.monotonic() - confirmed - 0.5

    wait_for(polled_since, 30, "an extender poll after Prometheus returned the pinned load")
    env.submit([pod("load-probe", cpu=1000, hostname=host)])
    env.wait_bound(["load-probe"], timeout=60)
    rec = wait_for(
        lambda: next(
            (
                r
                for r in local.extender.decisions(0, 8192)["records"]
                if r["kind"] == "filter" and r["pod"]["name"] == "load-probe"
            ),
            None,
        ),
        10,
        "the probe's decision record",
    )
    node_load = rec["features"]["node"]["load"]
    assert abs(node_load["memory"] - 0.42) < 0.01, node_load
    assert node_load["cpu"] is not None and 0 <= node_load["cpu"] <= 1, node_load
