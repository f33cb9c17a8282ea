"""The operator against the real API server and kube-scheduler (hack/local-cluster.sh).

One stack for the module: the extender as a local process (``python -m rlsched.operator.testing
extender``: the real extender with test models) reading a folder the operator publishes into
(``--sink directory``), kube-scheduler with the rl-scheduler profile calling it, and ``rlsched
operator`` as a subprocess watching one namespace (``rlsched-e2e-<random>``). The tests run in
file order and share the served policy ``<namespace>/default``:

create → update → a model that fails to load (rollback, ``Degraded``) → a missing model source →
a delayed pod requeued and placed, a rejected pod → the decision log read back by the trainer's
reader → a policy that is not served → delete → an API-server restart (watches resume, no handler
twice) → graceful shutdown and resume.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlsched.operator.spec import SpecError, parse_spec
from rlsched.operator.testing import fake_model

NS = f"rlsched-e2e-{uuid.uuid4().hex[:6]}"
GROUP, VERSION, PLURAL = "rlsched.io", "v1alpha1", "schedulingpolicies"


_spec = importlib.util.spec_from_file_location("rlstack", Path(__file__).resolve().parents[2] / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]
free_port, wait_for = rlstack.free_port, rlstack.wait_for


class Stack:
    """The extender, kube-scheduler's profile and the operator for this module."""

    def __init__(self, cluster: Any, tmp: Path):
        import kubernetes

        self.cluster, self.tmp = cluster, tmp
        self.policy_dir, self.dlog = tmp / "policy", tmp / "decisions"
        self.policy_dir.mkdir()
        (self.policy_dir / "policy.yaml").write_text("{}\n")
        self.port, self.status_port = free_port(), free_port()
        self.status_url = f"http://127.0.0.1:{self.status_port}"
        # The extender's /status and /decisions need a token allowed to read them (auth.mode kubernetes,
        # its default): the operator's, which this test reads with too.
        self.token_file = rlstack.service_account_token(
            rlstack.LocalCluster(cluster.state_dir), rlstack.OPERATOR_IDENTITY
        )
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
        api = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
        self.extender: subprocess.Popen | None = None
        self.operator: subprocess.Popen | None = None
        self.operator_logs: list[Path] = []

    # -- processes ----------------------------------------------------------------------------------
    def start_extender(self) -> None:
        cfg = self.tmp / "extender.yaml"
        cfg.write_text(yaml.safe_dump({"policyPollS": 0.3, "log": {"format": "text"}}))
        log = open(self.tmp / "extender.log", "ab")
        self.extender = subprocess.Popen(
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
                "least-allocated",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_for(lambda: self.extender_status(), 60, "the extender's /status")

    def start_scheduler(self) -> None:
        from rlsched.extender.scheduler_config import scheduler_config

        conf = scheduler_config(url=f"http://127.0.0.1:{self.port}", scheduler_name="rl-scheduler", kubeconfig=None)
        conf["leaderElection"] = {"leaderElect": False}
        path = self.tmp / "scheduler.yaml"
        path.write_text(yaml.safe_dump(conf))
        self.cluster.scheduler(path)

    def start_operator(self, *extra: str) -> None:
        log_path = self.tmp / f"operator-{len(self.operator_logs)}.log"
        self.operator_logs.append(log_path)
        log = open(log_path, "ab")
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlsched.cli",
                "operator",
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
                "--drain-interval",
                "0.5",
                "--requeue-initial",
                "1",
                "--requeue-max",
                "4",
                "--rollout-timeout",
                "15",
                "--status-interval",
                "2",
                "--liveness",
                self.liveness_url,
                *extra,
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_for(lambda: "operator started" in log_path.read_text(), 60, "the operator to start")

    def stop_operator(self, timeout: float = 30) -> int:
        assert self.operator is not None
        self.operator.send_signal(signal.SIGTERM)
        code = self.operator.wait(timeout=timeout)
        self.operator = None
        return code

    def stop(self) -> None:
        for p in (self.operator, self.extender):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.operator_logs)

    # -- reads --------------------------------------------------------------------------------------
    def extender_status(self) -> dict:
        request = urllib.request.Request(
            f"{self.status_url}/status", headers={"Authorization": f"Bearer {self.token_file.read_text().strip()}"}
        )
        with urllib.request.urlopen(request, timeout=3) as resp:
            return json.loads(resp.read())["policy"]

    def policy(self, name: str = "default") -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)

    def condition(self, type_: str, name: str = "default") -> dict:
        for c in (self.policy(name).get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return c
        return {}

    def events(self, name: str, kind: str | None = None) -> list[dict]:
        items = self.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
        return [
            {"reason": e.reason, "message": e.message, "type": e.type, "kind": e.involved_object.kind}
            for e in sorted(
                items, key=lambda e: (e.first_timestamp or e.event_time or 0, e.metadata.creation_timestamp)
            )
            if kind is None or e.involved_object.kind == kind
        ]

    # -- writes -------------------------------------------------------------------------------------
    def model_configmap(self, name: str, models: dict[str, bytes]) -> None:
        body = {"metadata": {"name": name}, "binaryData": {k: base64.b64encode(v).decode() for k, v in models.items()}}
        try:
            self.core.create_namespaced_config_map(NS, body)
        except Exception:  # noqa: BLE001 - exists: replace
            self.core.replace_namespaced_config_map(name, NS, body)

    def apply_policy(self, spec: dict, name: str = "default") -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SchedulingPolicy",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }
        try:
            self.policy(name)
        except Exception:  # noqa: BLE001 - not there yet
            self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        else:
            # A JSON patch of .spec, as kubectl apply/edit do. (A PUT without the annotations would
            # drop kopf's bookkeeping: the change would then be handled as a creation — once.)
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                NS,
                PLURAL,
                name,
                [{"op": "replace", "path": "/spec", "value": spec}],
                _content_type="application/json-patch+json",
            )

    def rolled_out(self, generation: int, name: str = "default") -> Callable[[], bool]:
        def check() -> bool:
            status = self.policy(name).get("status") or {}
            ready = self.condition("Ready", name)
            return status.get("observedGeneration") == generation and ready.get("status") == "True"

        return check

    def policy_events_include(self, *reasons: str, name: str = "default") -> Callable[[], bool]:
        def check() -> bool:
            seen = {e["reason"] for e in self.events(name, "SchedulingPolicy")}
            return all(r in seen for r in reasons)

        return check

    def create_pod(self, name: str, cpu: str = "1", gpus: int = 1) -> None:
        res = {"cpu": cpu, "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        self.core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": "rl-scheduler",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.example.com/job:1",
                            "resources": {"requests": res, "limits": res},
                        }
                    ],
                },
            },
        )

    def pod(self, name: str) -> Any:
        return self.core.read_namespaced_pod(name, NS)


def restart_apiserver(cluster: Any) -> None:
    """Stop kube-apiserver (SIGTERM to its process group, SIGKILL after 10 s) and start it again with
    the same command (hack/local-cluster.sh records it in run/kube-apiserver.cmd)."""
    run = cluster.state_dir / "run"
    pid = int((run / "kube-apiserver.pid").read_text())
    command = (run / "kube-apiserver.cmd").read_text()
    os.killpg(pid, signal.SIGTERM)

    def gone() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return True
        return state == "Z"

    try:
        wait_for(gone, 10, "kube-apiserver to stop")
    except AssertionError:  # it drains long-running watches for up to a minute: don't wait for that
        os.killpg(pid, signal.SIGKILL)
        wait_for(gone, 10, "kube-apiserver to stop after SIGKILL")
    log = open(cluster.state_dir / "logs" / "kube-apiserver.log", "ab")
    p = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
    )
    # hack/local-cluster.sh counts a pid as its process only with the recorded start time: without
    # it the restarted kube-apiserver would be "another process", not stopped by `down`.
    from stacklib.common import process_start_time  # on sys.path once rlstack is loaded

    (run / "kube-apiserver.start").write_text(f"{process_start_time(p.pid)}\n")
    (run / "kube-apiserver.pid").write_text(str(p.pid))
    wait_for(
        lambda: cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 120, "kube-apiserver /readyz"
    )


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    s = Stack(cluster, tmp_path_factory.mktemp("operator-e2e"))
    cluster.kubectl("create", "namespace", NS, check=False)
    wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", NS, check=False).returncode == 0,
        60,
        "the namespace's default ServiceAccount",
    )
    try:
        s.start_extender()
        s.start_scheduler()
        s.start_operator()
        s.model_configmap(
            "models", {"v1.npz": fake_model("v1"), "v2.npz": fake_model("v2"), "bad.npz": b"\x00 truncated"}
        )
        yield s
    finally:
        # Policies carry the operator's finalizer: delete them while it runs, then strip what is left.
        cluster.kubectl("delete", "schedulingpolicies", "--all", "-n", NS, "--timeout=30s", check=False, timeout=60)
        s.stop()
        for name in cluster.kubectl("get", "schedulingpolicies", "-n", NS, "-o", "name", check=False).stdout.split():
            cluster.kubectl(
                "patch", "-n", NS, name, "--type", "merge", "-p", '{"metadata":{"finalizers":null}}', check=False
            )
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        cluster.scheduler(None)


def cm_model(key: str) -> dict:
    return {"configMapKeyRef": {"name": "models", "key": key}}


# -- the schema and the operator agree --------------------------------------------------------------

SPEC_CASES = [
    {},
    {"mode": "shadow", "fallback": "bestfit", "model": {"path": "/models/p.npz", "sha256": "0" * 64}},
    {"mode": "off", "deadlineMs": 20, "topK": 0, "extenderWeight": 5, "rewardWeights": {"placed": -1, "nodeLoad": 2}},
    {"model": {"url": "https://models.example.com/p.npz"}},
    {"mode": "sometimes"},
    {"mode": False},
    {"fallback": "FGD"},
    {"fallback": "fgd-plus"},
    {"model": {}},
    {"model": {"path": "/a", "url": "https://b/c"}},
    {"model": {"path": "relative.npz"}},
    {"model": {"url": "ftp://host/p.npz"}},
    {"model": {"configMapKeyRef": {"name": "m"}}},
    {"model": {"configMapKeyRef": {"name": "m", "key": "a/b"}}},
    {"model": {"path": "/p", "sha256": "ABC"}},
    {"deadlineMs": 0},
    {"deadlineMs": 6000},
    {"topK": -1},
    {"topK": 1.5},
    {"extenderWeight": 0},
    {"rewardWeights": {"evicted": -1}},
    {"rewardWeights": {"speed": 1}},
    {"modelPath": "/old-style"},
    {"objective": {"beta": 0.2, "slaWeight": 3, "latencyScaleSeconds": 60, "slaCpuThreshold": 1}},
    {"objective": {"beta": 1.5}},
    {"objective": {"slaCpuThreshold": 0}},
    {"objective": {"latencyScaleSeconds": 0.001}},
    {"objective": {"strandedWeight": -1}},
    {"objective": {"gamma": 1}},
    {"objective": {"beta": "half"}},
    {
        "rebalance": {
            "weights": {"latencySensitiveHot": -0.5, "latencySensitive": -2, "podGpu": 0.1, "destinationLoad": -3}
        }
    },
    {"rebalance": {"weights": {"hot": 0.5, "latencySensitiveHot": -1}}},
    {"rebalance": {"weights": {"latencySensitiveHot": -1}}},
    {"rebalance": {"weights": {"podGpu": 101}}},
]


def test_schema_and_operator_validation_agree(stack: Stack) -> None:
    """Every spec above is accepted by both the API server and parse_spec, or rejected by both."""
    from kubernetes.client import ApiException

    disagree = []
    for i, spec in enumerate(SPEC_CASES):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SchedulingPolicy",
            "metadata": {"name": f"case-{i}", "namespace": NS},
            "spec": spec,
        }
        try:
            stack.custom.create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, body, dry_run="All", field_validation="Strict"
            )
            server, why = True, ""
        except ApiException as exc:
            server, why = False, json.loads(exc.body).get("message", "")
            assert exc.status in (400, 422), exc.body
        try:
            parse_spec(spec)
            operator = True
        except SpecError:
            operator = False
        if server != operator:
            disagree.append(
                f"{spec}: API server {'accepts' if server else 'rejects (' + why + ')'}, "
                f"the operator {'accepts' if operator else 'rejects'}"
            )
    assert not disagree, "\n".join(disagree)


def test_schema_rejection_says_what_to_fix(stack: Stack) -> None:
    from kubernetes.client import ApiException

    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "two", "namespace": NS},
        "spec": {"model": {"path": "/a", "url": "https://b/c"}},
    }
    with pytest.raises(ApiException) as err:
        stack.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    assert "set exactly one of spec.model.configMapKeyRef, spec.model.path or spec.model.url" in err.value.body


def test_configmap_sink_against_the_api_server(stack: Stack) -> None:
    """The in-cluster sink: create then replace, binaryData round trip, the 1 MiB limit."""
    import asyncio

    from rlsched.operator.kube import Kube, load_configuration
    from rlsched.operator.sink import CURRENT, LAST_GOOD, Bundle, ConfigMapSink, ModelTooLarge

    async def go() -> None:
        kube = Kube(load_configuration(str(stack.cluster.kubeconfig), None))
        try:
            sink = ConfigMapSink(kube, NS, "policy-sink", max_model_bytes=1 << 20)
            model = os.urandom(1_000_000)  # near the limit: the API server counts decoded bytes
            b = Bundle(
                {"mode": "shadow", "modelPath": sink.model_path("model-0123456789abcdef.npz")},
                "model-0123456789abcdef.npz",
                model,
                {"digest": "d", "generation": 3},
            )
            await sink.write(CURRENT, b)
            await sink.write(CURRENT, b)  # replace
            await sink.write(LAST_GOOD, b)
            got = await sink.read(CURRENT)
            assert got.model == model and got.settings["mode"] == "shadow" and got.meta["generation"] == 3
            with pytest.raises(ModelTooLarge):
                await sink.write(CURRENT, Bundle({"mode": "active"}, "model-big.npz", os.urandom(1_100_000), {}))
            await sink.clear(LAST_GOOD)
            assert await sink.read(LAST_GOOD) is None
        finally:
            kube.close()

    asyncio.run(go())


# -- the lifecycle of the served policy ---------------------------------------------------------------


def test_create_rolls_out_and_reports_what_the_extender_loaded(stack: Stack) -> None:
    stack.apply_policy({"mode": "active", "fallback": "least-allocated", "model": cm_model("v1.npz")})
    wait_for(stack.rolled_out(1), 60, "generation 1 rolled out")
    status = stack.policy()["status"]
    ext = stack.extender_status()
    assert status["model"]["version"] == "v1" == ext["model"]["version"]
    assert status["model"]["digest"] == ext["model"]["digest"] and status["lastGood"]["generation"] == 1
    assert ext["mode"] == "active" and ext["fallback"] == "least-allocated"
    assert stack.condition("Degraded")["status"] == "False"
    # kopf posts events from a background queue, so they may land after the status: wait for them.
    wait_for(stack.policy_events_include("RollingOut", "RolledOut"), 30, "the RollingOut and RolledOut events")


def test_update_switches_model_and_mode_without_restart(stack: Stack) -> None:
    pid = stack.extender.pid
    stack.apply_policy({"mode": "shadow", "fallback": "least-allocated", "model": cm_model("v2.npz")})
    wait_for(stack.rolled_out(2), 60, "generation 2 rolled out")
    ext = stack.extender_status()
    assert ext["mode"] == "shadow" and ext["model"]["version"] == "v2"
    assert (
        stack.policy()["status"]["model"]["version"] == "v2"
        and stack.extender.pid == pid
        and stack.extender.poll() is None
    )


def test_model_that_fails_to_load_rolls_back_and_degrades(stack: Stack) -> None:
    stack.apply_policy({"mode": "active", "fallback": "least-allocated", "model": cm_model("bad.npz")})

    def degraded() -> bool:
        d = stack.condition("Degraded")
        return stack.policy()["status"].get("observedGeneration") == 3 and d.get("status") == "True"

    wait_for(degraded, 60, "Degraded after the bad model")
    d = stack.condition("Degraded")
    assert d["reason"] == "ModelLoadFailed", d
    assert "could not load the model" in d["message"] and "rolled back to model v2 (generation 2)" in d["message"]
    assert stack.condition("Ready")["status"] == "False"
    ext = stack.extender_status()
    assert ext["model"]["version"] == "v2" and ext["mode"] == "shadow"  # the last good bundle, settings included
    status = stack.policy()["status"]
    assert status["model"]["version"] == "v2" and status["lastGood"]["generation"] == 2
    wait_for(stack.policy_events_include("RolledBack"), 30, "the RolledBack event")


def test_missing_model_source_is_reported_then_recovers(stack: Stack) -> None:
    stack.apply_policy(
        {
            "mode": "active",
            "fallback": "least-allocated",
            "model": {"configMapKeyRef": {"name": "later", "key": "m.npz"}},
        }
    )
    wait_for(lambda: stack.condition("Degraded").get("reason") == "ModelSourceNotFound", 60, "ModelSourceNotFound")
    assert (
        f"kubectl -n {NS} create configmap later --from-file=m.npz=model.npz" in stack.condition("Degraded")["message"]
    )
    # Active with a model that delays the first three decisions (for the requeue test next).
    stack.model_configmap(
        "later", {"m.npz": fake_model("v3", delay_first=3, retry_after_s=1.0, reject_cpu_milli_above=16000)}
    )
    wait_for(stack.rolled_out(4), 60, "generation 4 rolled out once the ConfigMap exists")
    assert stack.extender_status()["model"]["version"] == "v3"


# -- pods ---------------------------------------------------------------------------------------------


def test_delayed_pod_is_requeued_and_placed(stack: Stack) -> None:
    stack.create_pod("delayed")
    wait_for(lambda: stack.pod("delayed").spec.node_name, 90, "the delayed pod to be bound")
    pod = stack.pod("delayed")
    attempts = int(pod.metadata.annotations.get("rlsched.io/requeue-attempt", "0"))
    # kube-scheduler records events asynchronously (a broadcaster), so "Scheduled" can land a moment
    # after the binding itself: wait for it rather than read the list once.
    wait_for(lambda: "Scheduled" in [e["reason"] for e in stack.events("delayed", "Pod")], 30, "the Scheduled event")
    events = stack.events("delayed", "Pod")
    reasons = [e["reason"] for e in events]
    scheduler = [r for r in reasons if r in ("FailedScheduling", "Scheduled")]
    # Three delays: kube-scheduler retries the first by itself (its own status update); the
    # identical later ones only come back because the operator bumped the annotation.
    assert scheduler.count("FailedScheduling") == 3 and scheduler[-1] == "Scheduled", reasons
    assert attempts >= 1, "the operator never requeued the pod"
    # Why and until when: the policy's reason with an absolute time in kube-scheduler's events, and
    # the operator's own event for each requeue it schedules.
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    failed = [e["message"] for e in events if e["reason"] == "FailedScheduling"]
    assert all(re.search(rf"delayed by policy rl-scheduler until {stamp} \(retry in \d+s\)", m) for m in failed), failed
    requeues = [e["message"] for e in events if e["reason"] == "DelayedByPolicy"]
    assert requeues and all(re.search(rf"requeues it at {stamp} \(in \d+s; requeue \d+ of", m) for m in requeues), (
        requeues
    )
    assert f"requeued delayed pod {NS}/delayed" in stack.log()


def test_rejected_pod_gets_an_event_and_an_annotation(stack: Stack) -> None:
    stack.create_pod("too-big", cpu="20")

    def annotation() -> str | None:
        return (stack.pod("too-big").metadata.annotations or {}).get("rlsched.io/policy-rejected")

    message = wait_for(annotation, 60, "the rlsched.io/policy-rejected annotation")
    assert "more than this policy places" in message
    assert "RejectedByPolicy" in [e["reason"] for e in stack.events("too-big", "Pod")]
    assert not stack.pod("too-big").spec.node_name


def test_decision_log_is_written_and_read_back_by_the_trainer(stack: Stack) -> None:
    from rlsched.policy.decision_dataset import load_examples, summarize

    uid = stack.pod("delayed").metadata.uid

    def examples() -> list:
        everything = load_examples(stack.dlog)
        found = [e for e in everything if e.pod_uid == uid]
        complete = any(e.action == "place" and e.outcome.bound_node for e in found) and any(
            e.action == "reject" for e in everything
        )
        return found if complete else []

    found = wait_for(examples, 30, "the delayed pod's decisions and outcome in the log")
    assert [e.action for e in found] == ["delay", "delay", "delay", "place"]
    placed = found[-1]
    assert placed.followed and placed.model_version == "v3" and placed.outcome.pending_seconds is not None
    assert placed.features["pod"]["numGpu"] == 1 and placed.scores
    _, summary = summarize(stack.dlog)
    assert summary.rejects >= 1 and summary.bound >= 1 and summary.stats.bad_lines == 0
    from rlsched.policy.decision_dataset import prepare_fine_tune
    from rlsched.policy.trace import load_pods

    trace, _ = prepare_fine_tune(stack.dlog, stack.tmp / "train")  # what `rlsched train --from-decisions` trains on
    assert any(p.num_gpu == 1 and p.cpu_milli == 1000 for p in load_pods(trace))
    policies = [
        json.loads(line)
        for seg in sorted(stack.dlog.glob("segment-*.jsonl"))
        for line in seg.read_text().splitlines()
        if '"type":"policy"' in line
    ]
    assert [p["generation"] for p in policies if p["ok"]][-1] == 4


def test_a_policy_that_is_not_served_says_so(stack: Stack) -> None:
    stack.apply_policy({"mode": "off"}, name="other")
    wait_for(lambda: stack.condition("Ready", "other").get("reason") == "NotServed", 30, "NotServed")
    assert f"serves the SchedulingPolicy {NS}/default" in stack.condition("Ready", "other")["message"]
    stack.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "other")


def test_delete_returns_the_extender_to_its_own_settings(stack: Stack) -> None:
    stack.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "default")

    def gone() -> bool:
        try:
            stack.policy()
        except Exception:  # noqa: BLE001 - 404: the finalizer was removed
            return True
        return False

    wait_for(gone, 60, "the policy's deletion (finalizer removed)")
    assert yaml.safe_load((stack.policy_dir / "policy.yaml").read_text()) == {}
    wait_for(lambda: not stack.extender_status()["model"]["loaded"], 20, "the extender to unload the model")
    assert stack.extender_status()["mode"] == "active"


# -- restarts -----------------------------------------------------------------------------------------


def handler_runs(log: str) -> dict[tuple[str, str], int]:
    """(generation, cause) → how often the operator logged that the rollout handler ran."""
    out: dict[tuple[str, str], int] = {}
    for line in log.splitlines():
        if f"policy {NS}/default generation" in line and "handler runs" in line:
            words = line.split(f"policy {NS}/default generation ", 1)[1].split()
            key = (words[0].rstrip(":"), words[1])
            out[key] = out.get(key, 0) + 1
    return out


def test_survives_an_apiserver_restart_without_running_a_handler_twice(stack: Stack) -> None:
    mark = len(stack.log())
    stack.apply_policy({"mode": "active", "fallback": "least-allocated", "model": cm_model("v1.npz")})
    wait_for(stack.rolled_out(1), 60, "the new policy rolled out")
    restart_apiserver(stack.cluster)
    # The watches reconnect (kopf re-lists and sees nothing new): an update made after the restart
    # is handled, and each change exactly once.
    stack.apply_policy({"mode": "shadow", "fallback": "least-allocated", "model": cm_model("v2.npz")})
    wait_for(stack.rolled_out(2), 120, "generation 2 rolled out after the API-server restart")
    time.sleep(3)  # room for a duplicate to show up
    assert stack.operator.poll() is None, "the operator exited"
    assert handler_runs(stack.log()[mark:]) == {("1", "create"): 1, ("2", "update"): 1}
    assert stack.extender_status()["model"]["version"] == "v2"


def test_graceful_shutdown_and_resume(stack: Stack) -> None:
    with urllib.request.urlopen(stack.liveness_url, timeout=15) as resp:  # kopf's liveness with our probe
        assert resp.status == 200 and "decisionsDrained" in json.loads(resp.read())["rlsched"]
    before = [e["reason"] for e in stack.events("default", "SchedulingPolicy")].count("RolledOut")
    assert stack.stop_operator() == 0
    assert "operator stopped (decision log closed)" in stack.log()
    stack.start_operator()
    wait_for(lambda: "nothing to roll out" in stack.operator_logs[-1].read_text(), 30, "the resume handler")
    assert "generation 2: resume handler runs" in stack.operator_logs[-1].read_text()
    time.sleep(2)
    assert [e["reason"] for e in stack.events("default", "SchedulingPolicy")].count("RolledOut") == before


def test_peering_mode(stack: Stack) -> None:
    """With --peering the operator coordinates through a KopfPeering (v1 CRD from operator/crds)."""
    assert stack.stop_operator() == 0
    stack.custom.create_namespaced_custom_object(
        "kopf.dev",
        "v1",
        NS,
        "kopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "rlsched"}},
    )
    stack.start_operator("--peering", "rlsched")
    stack.apply_policy({"mode": "off", "fallback": "least-allocated"})
    wait_for(stack.rolled_out(3), 60, "generation 3 rolled out by the peering operator")
    peering = stack.custom.get_namespaced_custom_object("kopf.dev", "v1", NS, "kopfpeerings", "rlsched")
    assert peering.get("status"), "the operator did not announce itself in the KopfPeering"
    assert stack.extender_status()["mode"] == "off"
