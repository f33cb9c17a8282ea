"""The operator's rebalancer on the real stack: kube-apiserver, kube-controller-manager (ReplicaSets,
the disruption controller), kube-scheduler with the rl-scheduler profile, the extender, the operator.

Four kwok nodes with one card each (model ``RBTEST``, which no other test uses; every pod here asks
for it) and four ReplicaSets of one 500-milli pod, one per node — a fragmented cluster: four half-used
cards where two would do. ``rb-a``, ``rb-b`` and ``rb-d`` opt in (label ``rlsched.io/rebalance:
"true"``), ``rb-c`` does not. Pods are put on their nodes by a nodeSelector that is then removed from
the template, so a replacement is placed by kube-scheduler and the extender like any pod.

In file order, sharing the served policy ``<namespace>/default`` (``intervalSeconds: 10``, the
operator's tick 1 s): dry-run reports moves and changes nothing → a PodDisruptionBudget refuses one
eviction, the rebalancer counts it and evicts the next → the evicted pod's replacement comes back
through kube-scheduler and our extender (where the planner intended, or the difference is printed)
→ the pod that did not opt in was never touched → a burst of new candidates cannot exceed the
hourly budget.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

NS = f"rlsched-rb-{uuid.uuid4().hex[:6]}"
GROUP, VERSION, PLURAL = "rlsched.io", "v1alpha1", "schedulingpolicies"
MODEL = "RBTEST"
PREFIX = f"rb-{uuid.uuid4().hex[:4]}"
NODES = [f"{PREFIX}-g{i}" for i in range(4)]
OPTED_IN = {"rb-a", "rb-b", "rb-d"}

_spec = importlib.util.spec_from_file_location("rlstack", Path(__file__).resolve().parents[2] / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]
free_port, wait_for = rlstack.free_port, rlstack.wait_for


class Stack:
    """The extender (directory sink), kube-scheduler's profile, the operator with the rebalancer."""

    def __init__(self, cluster: Any, tmp: Path):
        import kubernetes

        self.cluster, self.tmp = cluster, tmp
        self.policy_dir, self.dlog = tmp / "policy", tmp / "decisions"
        self.policy_dir.mkdir()
        (self.policy_dir / "policy.yaml").write_text("{}\n")
        self.port, self.status_port = free_port(), free_port()
        self.status_url = f"http://127.0.0.1:{self.status_port}"
        self.token_file = rlstack.service_account_token(
            rlstack.LocalCluster(cluster.state_dir), rlstack.OPERATOR_IDENTITY
        )
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
        api = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        self.policy_api = kubernetes.client.PolicyV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.procs: list[subprocess.Popen] = []
        self.operator_log = tmp / "operator.log"

    def start(self) -> None:
        cfg = self.tmp / "extender.yaml"
        cfg.write_text(yaml.safe_dump({"policyPollS": 0.3, "log": {"format": "text"}}))
        log = open(self.tmp / "extender.log", "ab")
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rlsched.operator.testing",
                    "extender",
                    "--config",
                    str(cfg),
                    "--kubeconfig",
                    str(self.cluster.kubeconfig),
                    "--port",
                    str(self.port),
                    "--status-port",
                    str(self.status_port),
                    "--status-host",
                    "127.0.0.1",
                    "--policy-file",
                    str(self.policy_dir / "policy.yaml"),
                    "--no-strict-model",
                    "--fallback",
                    "fgd",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        wait_for(self.extender_status, 60, "the extender's /status")
        from rlsched.extender.scheduler_config import scheduler_config

        conf = scheduler_config(url=f"http://127.0.0.1:{self.port}", scheduler_name="rl-scheduler", kubeconfig=None)
        conf["leaderElection"] = {"leaderElect": False}
        path = self.tmp / "scheduler.yaml"
        path.write_text(yaml.safe_dump(conf))
        self.cluster.scheduler(path)
        settings = self.tmp / "operator.yaml"
        self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
        endpoint = self.metrics_url.removeprefix("http://").removesuffix("/metrics")
        settings.write_text(yaml.safe_dump({"rebalancer": {"tickS": 1}, "metricsEndpoint": endpoint}))
        log = open(self.operator_log, "ab")
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rlsched.cli",
                    "operator",
                    "--config",
                    str(settings),
                    "--kubeconfig",
                    str(self.cluster.kubeconfig),
                    "--install-crds",
                    "--namespace",
                    NS,
                    "--policy",
                    f"{NS}/default",
                    "--sink",
                    "directory",
                    "--directory",
                    str(self.policy_dir),
                    "--extender-url",
                    self.status_url,
                    "--decision-log",
                    str(self.dlog),
                    "--extender-token-file",
                    str(self.token_file),
                    "--rollout-timeout",
                    "15",
                    "--status-interval",
                    "5",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        wait_for(lambda: "operator started" in self.operator_log.read_text(), 60, "the operator to start")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()

    # -- reads ------------------------------------------------------------------------------------
    def extender_status(self) -> dict:
        request = urllib.request.Request(
            f"{self.status_url}/status", headers={"Authorization": f"Bearer {self.token_file.read_text().strip()}"}
        )
        with urllib.request.urlopen(request, timeout=3) as resp:
            return json.loads(resp.read())["policy"]

    def counter(self, result: str) -> float:
        """``rlsched_operator_rebalance_evictions_total{result}`` from the operator's /metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=3) as resp:
            text = resp.read().decode()
        key = f'rlsched_operator_rebalance_evictions_total{{result="{result}"}} '
        return sum(float(line[len(key) :]) for line in text.splitlines() if line.startswith(key))

    def status(self) -> dict:
        policy = self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "default")
        return (policy.get("status") or {}).get("rebalance") or {}

    def pods(self, app: str) -> list[Any]:
        items = self.core.list_namespaced_pod(NS, label_selector=f"app={app}").items
        return [p for p in items if p.metadata.deletion_timestamp is None]

    def running(self, app: str) -> Any:
        """The one running, bound pod of ``app`` (None while there is none)."""
        pods = [p for p in self.pods(app) if p.status.phase == "Running" and p.spec.node_name]
        return pods[0] if len(pods) == 1 else None

    def events(self, pod_name: str) -> list[str]:
        items = self.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={pod_name}").items
        return [e.reason for e in items]

    # -- writes -----------------------------------------------------------------------------------
    def apply_policy(self, rebalance: dict) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SchedulingPolicy",
            "metadata": {"name": "default", "namespace": NS},
            "spec": {"mode": "off", "fallback": "fgd", "topK": 1, "rebalance": rebalance},
        }
        try:
            self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "default")
        except Exception:  # noqa: BLE001 - not there yet
            self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        else:
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                NS,
                PLURAL,
                "default",
                [{"op": "replace", "path": "/spec", "value": body["spec"]}],
                _content_type="application/json-patch+json",
            )

    def replica_set(self, app: str, node: str, opt_in: bool) -> None:
        """One 500-milli pod of model RBTEST on ``node``; the pin is dropped from the template once it runs."""
        pod = rlstack.pod_manifest(
            app, 100, 64, num_gpu=1, gpu_milli=500, gpu_models=[MODEL], share_as_annotation=True, namespace=NS
        )
        labels = {"app": app, **({"rlsched.io/rebalance": "true"} if opt_in else {})}
        template = {
            "metadata": {"labels": labels, "annotations": pod["metadata"]["annotations"]},
            "spec": {**pod["spec"], "nodeSelector": {"kubernetes.io/hostname": node}},
        }
        self.apps.create_namespaced_replica_set(
            NS,
            {
                "metadata": {"name": app},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}}, "template": template},
            },
        )
        wait_for(lambda: self.running(app), 60, f"{app} running on {node}")
        assert self.running(app).spec.node_name == node
        self.apps.patch_namespaced_replica_set(app, NS, {"spec": {"template": {"spec": {"nodeSelector": None}}}})


def wait_cycle(stack: Stack, after: str | None, timeout: float = 40) -> dict:
    """The first cycle whose ``lastCycle`` is later than ``after``."""

    def fresh() -> dict | None:
        st = stack.status()
        return st if st.get("lastCycle") and (after is None or st["lastCycle"] > after) else None

    result: dict = wait_for(fresh, timeout, f"a rebalancing cycle after {after}", interval=0.5)
    return result


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    s = Stack(cluster, tmp_path_factory.mktemp("rebalancer-e2e"))
    cluster.kubectl("create", "namespace", NS, check=False)
    nodes = [rlstack.kwok_node(n, 8000, 16384, gpus=1, model=MODEL) for n in NODES]
    for n in nodes:
        s.core.create_node(n)
    try:
        s.start()
        s.uids: dict[str, str] = {}
        for app, node in zip(("rb-a", "rb-b", "rb-c", "rb-d"), NODES, strict=True):
            s.replica_set(app, node, app in OPTED_IN)
            s.uids[app] = s.running(app).metadata.uid
        yield s
    finally:
        cluster.kubectl("delete", "schedulingpolicies", "--all", "-n", NS, "--timeout=30s", check=False, timeout=60)
        s.stop()
        for name in cluster.kubectl("get", "schedulingpolicies", "-n", NS, "-o", "name", check=False).stdout.split():
            cluster.kubectl(
                "patch", "-n", NS, name, "--type", "merge", "-p", '{"metadata":{"finalizers":null}}', check=False
            )
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        for n in NODES + [f"{PREFIX}-g{i}" for i in range(4, 8)]:
            cluster.kubectl("delete", "node", n, "--wait=false", check=False)
        cluster.scheduler(None)


def test_dry_run_reports_moves_and_changes_nothing(stack: Stack) -> None:
    stack.apply_policy(
        {
            "enabled": True,
            "dryRun": True,
            "intervalSeconds": 10,
            "minPodAgeSeconds": 0,
            "budget": {"maxMovesPerCycle": 2, "maxMovesPerHour": 3},
        }
    )
    st = wait_for(
        lambda: (s := stack.status()).get("outcome") == "planned" and s, 60, "a dry-run cycle with moves", interval=0.5
    )
    assert st["dryRun"] is True and st["moves"], st
    assert {m["result"] for m in st["moves"]} == {"dry_run"}, st
    moved = {m["pod"].split("/")[1] for m in st["moves"]}
    assert moved <= {stack.running(a).metadata.name for a in OPTED_IN}, st
    assert st["skipped"]["not-opted-in"] >= 1 and st["candidates"] == 3, st
    time.sleep(2)
    for app, uid in stack.uids.items():
        assert stack.running(app).metadata.uid == uid, f"{app} was replaced in dry-run"
    name = next(iter(moved))
    wait_for(lambda: "RebalanceDryRun" in stack.events(name), 20, f"a RebalanceDryRun event on {name}")
    assert st.get("totals", {}).get("evicted", 0) == 0
    stack.first = st["moves"][0]["pod"].split("/")[1].rsplit("-", 1)[0]


def test_a_pdb_blocks_one_eviction_and_the_next_move_is_made(stack: Stack) -> None:
    before = stack.status().get("lastCycle")
    first = stack.first  # the planner's first move in dry-run: protect it
    stack.policy_api.create_namespaced_pod_disruption_budget(
        NS, {"metadata": {"name": "protect"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": first}}}}
    )
    wait_for(
        lambda: (
            (stack.policy_api.read_namespaced_pod_disruption_budget("protect", NS).status.observed_generation or 0) >= 1
        ),
        30,
        "the disruption controller to observe the PDB",
    )
    stack.apply_policy(
        {
            "enabled": True,
            "dryRun": False,
            "intervalSeconds": 10,
            "minPodAgeSeconds": 0,
            "budget": {"maxMovesPerCycle": 2, "maxMovesPerHour": 3},
        }
    )
    st = wait_cycle(stack, before)
    while st.get("dryRun"):  # the cycle that was due before the change
        st = wait_cycle(stack, st["lastCycle"])
    results = {m["pod"].split("/")[1].rsplit("-", 1)[0]: m["result"] for m in st["moves"]}
    print("moves:", st["moves"])
    assert results.get(first) == "blocked_by_pdb", st
    assert "evicted" in results.values(), st
    assert st["totals"].get("blocked_by_pdb", 0) >= 1 and st["totals"].get("evicted", 0) >= 1, st
    assert stack.counter("blocked_by_pdb") >= 1 and stack.counter("evicted") >= 1
    assert stack.counter("dry_run") >= 2
    assert stack.running(first).metadata.uid == stack.uids[first]
    assert "RebalanceBlocked" in stack.events(stack.running(first).metadata.name)
    stack.moved = st["moves"]


def test_evicted_pods_come_back_through_our_scheduler(stack: Stack) -> None:
    (move,) = [m for m in stack.moved if m["result"] == "evicted"]
    app = move["pod"].split("/")[1].rsplit("-", 1)[0]
    wait_for(
        lambda: (p := stack.running(app)) is not None and p.metadata.uid != stack.uids[app] and p,
        60,
        f"the replacement of {move['pod']} running",
    )
    pod = stack.running(app)
    assert pod.spec.scheduler_name == "rl-scheduler"
    ann = pod.metadata.annotations or {}
    # The extender's bind wrote the cards: the pod went through kube-scheduler and our extender.
    assert ann.get("rlsched.io/gpu-node") == pod.spec.node_name and ann.get("rlsched.io/gpu-cards") == "0", ann
    landed = pod.spec.node_name
    print(f"{move['pod']}: from {move['from']}, intended {move['to']}, landed on {landed}")
    assert landed != move["from"]
    # Wherever it went, it shares a card: fewer half-used cards than the four before.
    used = {p.spec.node_name for p in stack.core.list_namespaced_pod(NS).items if p.status.phase == "Running"}
    assert len(used & set(NODES)) <= 3, used


def test_the_pod_that_did_not_opt_in_was_never_touched(stack: Stack) -> None:
    assert stack.running("rb-c").metadata.uid == stack.uids["rb-c"]
    reasons = stack.events(stack.running("rb-c").metadata.name)
    assert not [r for r in reasons if r.startswith("Rebalance")], reasons
    # By pod name, not by substring: namespace and node names are random and may contain "rb-c".
    moved = [m["pod"].split("/", 1)[-1] for m in stack.status().get("moves") or []]
    assert not [name for name in moved if name.startswith("rb-c-")], moved


def test_the_budget_holds_under_a_burst(stack: Stack) -> None:
    stack.policy_api.delete_namespaced_pod_disruption_budget("protect", NS)
    # Dry-run while the burst is set up, so the count read below cannot change meanwhile.
    before = stack.status()["lastCycle"]
    stack.apply_policy({"enabled": True, "dryRun": True, "intervalSeconds": 10, "minPodAgeSeconds": 0})
    st = wait_cycle(stack, before)
    while not st.get("dryRun"):
        st = wait_cycle(stack, st["lastCycle"])
    # Four more half-used cards, all opted in: many candidates at once.
    extra = [f"{PREFIX}-g{i}" for i in range(4, 8)]
    for n in extra:
        stack.core.create_node(rlstack.kwok_node(n, 8000, 16384, gpus=1, model=MODEL))
    for i, n in enumerate(extra):
        stack.replica_set(f"rb-burst{i}", n, True)
    recent = len(stack.status().get("recent") or [])
    evicted_before = stack.status()["totals"].get("evicted", 0)
    before = stack.status()["lastCycle"]
    stack.apply_policy(
        {
            "enabled": True,
            "dryRun": False,
            "intervalSeconds": 10,
            "minPodAgeSeconds": 0,
            "budget": {"maxMovesPerCycle": 5, "maxMovesPerHour": recent + 1},
        }
    )
    st = wait_cycle(stack, before)
    for _ in range(2):  # three cycles in all
        st = wait_cycle(stack, st["lastCycle"])
    assert st["totals"].get("evicted", 0) == evicted_before + 1, st
    assert st["outcome"] == "budget_exhausted" and len(st["recent"]) == recent + 1, st
