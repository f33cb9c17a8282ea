"""The Helm chart against the real API server of hack/local-cluster.sh (kwok nodes, no kubelet).

One release goes through its whole life, in file order:

1. ``helm lint --strict``; ``helm template`` accepted by ``kubectl apply --dry-run=server`` (strict
   field validation, Pod Security "restricted" warnings count as failures);
2. ``helm install --wait`` onto a kwok node made for it (tainted; the chart's pods tolerate it and
   select it). kwok marks the pods Ready (no container runs), so Deployments become Available;
3. the chart's RBAC for real: the real kube-scheduler binary runs with the installed
   KubeSchedulerConfiguration and the scheduler ServiceAccount's token, the extender with the
   installed settings file and the same token, the operator with its own ServiceAccount's token;
   a pod of the release's scheduler gets GPU cards and is bound, kube-scheduler takes the chart's
   Lease, a SchedulingPolicy with the served model in a ConfigMap is rolled out (a thread plays the
   kubelet: it copies the policy ConfigMap into the folder the extender reads), the extender reports
   that model's version and sha256 over its HTTPS status port (the chart's Secret; the operator
   verifies it with the Secret's CA), and the policy is deleted again — and no log says "forbidden";
4. ``helm upgrade`` changing a scheduler-config value rolls the scheduler pod (new ReplicaSet), not
   the operator's, and keeps what the operator wrote into the policy ConfigMaps, and the status
   port's certificate (lookup);
5. ``helm uninstall`` leaves nothing of the release in the namespace, in kube-system, or cluster-wide
   — except the CRDs, which Helm 3 never deletes (crds/ semantics; docs/install.md);
6. every switch on (ServiceMonitor, PrometheusRule, dashboard, peering, no native sidecar, Lease
   elsewhere): ``kubectl apply --dry-run=server`` still accepts it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
Cluster = Any  # tests/e2e/conftest.py's Cluster (conftest modules are not importable by name)

CHART = REPO_ROOT / "helm" / "rl-scheduler"
SERVED_MODEL = REPO_ROOT / "policy" / "models" / "ppo-openb-default-es.npz"
"""The model the chart serves (its image's default), rolled out here through a SchedulingPolicy."""
NS = "rlsched-helm-e2e"
RELEASE = "rl-e2e"
FULLNAME = f"{RELEASE}-rl-scheduler"
SCHEDULER = "rl-helm-e2e"
"""Not rl-scheduler: other e2e tests run kube-scheduler profiles of that name in the same cluster."""
NODE = "rlsched-helm-node"
TAINT = {"key": "rlsched.io/helm-e2e", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
CRDS = ("schedulingpolicies.rlsched.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")

pytestmark = pytest.mark.timeout(900)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - retried until the deadline; reported below
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


@dataclass
class Release:
    cluster: Cluster
    tmp: Path
    env: dict[str, str]
    ports: dict[str, int]
    crds_before: set[str]
    state: dict[str, Any] = field(default_factory=dict)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(TOOLS_BIN / "helm"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return self.cluster.kubectl(*args, input=input, check=check)

    def apply(self, obj: dict) -> None:
        """``kubectl apply`` of one object."""
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def values(self, **extra: Any) -> Path:
        """The values of this test: our scheduler name, free host ports (step 3 runs the processes
        here), and placement on the helm node."""
        placement = {"nodeSelector": {"rlsched.io/helm-e2e": "true"}, "tolerations": [TAINT]}
        values: dict[str, Any] = {
            "schedulerName": SCHEDULER,
            "extender": {"port": self.ports["verbs"], "statusPort": self.ports["status"]},
            "scheduler": dict(placement),
            "operator": dict(placement, healthPort=self.ports["health"]),
        }
        for key, value in extra.items():
            values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
        path = self.tmp / f"values-{len(list(self.tmp.glob('values-*')))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    def require(self, step: str) -> None:
        if not self.state.get(step):
            pytest.skip(f"needs the {step} step, which did not pass")


NODE_MANIFEST = f"""
apiVersion: v1
kind: Node
metadata:
  name: {NODE}
  annotations: {{kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}}
  labels: {{type: kwok, kubernetes.io/hostname: {NODE}, kubernetes.io/os: linux, kubernetes.io/arch: amd64,
           rlsched.io/helm-e2e: "true"}}
spec:
  taints: [{{key: rlsched.io/helm-e2e, value: "true", effect: NoSchedule}}]
status:
  capacity: {{cpu: "16", memory: 64Gi, pods: "110"}}
  allocatable: {{cpu: "16", memory: 64Gi, pods: "110"}}
"""

MONITORING_CRDS = """
# Stand-ins for the Prometheus Operator's CRDs (group, version, kind and scope as upstream; any
# fields): enough for the API server to accept the chart's ServiceMonitor and PrometheusRule.
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor, listKind: ServiceMonitorList}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: prometheusrules.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule, listKind: PrometheusRuleList}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@pytest.fixture(scope="module")
def release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Release:
    if not (TOOLS_BIN / "helm").exists():
        pytest.skip(f"helm missing in {TOOLS_BIN} (run hack/build-tools.sh)")
    tmp = tmp_path_factory.mktemp("helm")
    env = dict(
        cluster.env,
        HELM_CACHE_HOME=str(tmp / "cache"),
        HELM_CONFIG_HOME=str(tmp / "config"),
        HELM_DATA_HOME=str(tmp / "data"),
    )
    existing = {o["metadata"]["name"] for o in json.loads(cluster.kubectl("get", "crd", "-o", "json").stdout)["items"]}
    r = Release(
        cluster,
        tmp,
        env,
        {"verbs": free_port(), "status": free_port(), "health": free_port()},
        crds_before=existing & set(CRDS),
    )
    r.kubectl("apply", "-f", "-", input=NODE_MANIFEST)
    wait_for(
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in r.get("node", NODE).get("status", {}).get("conditions", [])
        ),
        60,
        "the kwok node",
    )
    r.kubectl("create", "namespace", NS)
    # Pod Security "restricted": the chart's pods must pass it (enforce), and its Deployments must not
    # even draw a warning (warn: kubectl prints "Warning:" for them).
    r.kubectl(
        "label",
        "namespace",
        NS,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    yield r
    if r.helm("status", RELEASE, "-n", NS, check=False).returncode == 0:
        r.helm("uninstall", RELEASE, "-n", NS, "--wait", check=False)
    r.kubectl("delete", "namespace", NS, "--wait=false", "--ignore-not-found", check=False)
    r.kubectl("delete", "node", NODE, "--ignore-not-found", check=False)
    r.kubectl("delete", "-f", "-", "--ignore-not-found", input=MONITORING_CRDS, check=False)
    created = set(CRDS) - r.crds_before
    if created:  # what this module's install created (Helm leaves CRDs behind by design)
        r.kubectl("delete", "crd", *sorted(created), "--ignore-not-found", check=False)


def dry_run(r: Release, rendered: str) -> subprocess.CompletedProcess:
    done = r.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=rendered, check=False)
    assert done.returncode == 0, f"the API server refused the chart:\n{done.stderr[-4000:]}"
    assert "Warning" not in done.stderr, f"the API server warned:\n{done.stderr}"
    return done


# -- 1 --------------------------------------------------------------------------------------------


def test_lint_and_server_side_dry_run(release: Release) -> None:
    r = release
    lint = r.helm("lint", "--strict", str(CHART), "-f", str(r.values()))
    assert "0 chart(s) failed" in lint.stdout and "[WARNING]" not in lint.stdout, lint.stdout
    rendered = r.helm("template", RELEASE, str(CHART), "-n", NS, "--include-crds", "-f", str(r.values())).stdout
    out = dry_run(r, rendered).stdout
    for kind, name in (
        ("deployment.apps", f"{FULLNAME}-scheduler"),
        ("deployment.apps", f"{FULLNAME}-operator"),
        ("customresourcedefinition.apiextensions.k8s.io", "schedulingpolicies.rlsched.io"),
        ("lease.coordination.k8s.io", SCHEDULER),
        ("configmap", f"{FULLNAME}-policy"),
    ):
        assert f"{kind}/{name} " in out, out  # created (or, for a CRD already there, unchanged)


# -- 2 --------------------------------------------------------------------------------------------


def test_install_wait(release: Release) -> None:
    r = release
    r.helm("install", RELEASE, str(CHART), "-n", NS, "-f", str(r.values()), "--wait", "--timeout", "180s")
    r.state["installed"] = True
    for name in (f"{FULLNAME}-scheduler", f"{FULLNAME}-operator"):
        dep = r.get("deployment", name, "-n", NS)
        assert dep["status"].get("availableReplicas") == 1, dep["status"]
    pods = r.get("pods", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    assert len(pods) == 2 and all(p["spec"]["nodeName"] == NODE for p in pods)
    sched = next(p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler")
    assert [c["name"] for c in sched["spec"]["initContainers"]] == ["extender"]
    assert sched["status"]["initContainerStatuses"][0]["started"] is True  # a native sidecar, running
    for name in CRDS:
        r.kubectl("get", "crd", name)  # from the chart's crds/ (or already there)
    policy = r.get("configmap", f"{FULLNAME}-policy", "-n", NS)
    assert policy["data"] == {"policy.yaml": "{}"}
    assert not r.get("configmap", f"{FULLNAME}-policy-last-good", "-n", NS).get("data")
    lease = r.get("lease", SCHEDULER, "-n", "kube-system")
    assert not lease.get("spec", {}).get("holderIdentity")
    notes = r.helm("get", "notes", RELEASE, "-n", NS).stdout
    assert f"schedulerName: {SCHEDULER}" in notes


# -- 3 --------------------------------------------------------------------------------------------


def token_kubeconfig(r: Release, service_account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a bound token from the API server); the
    token alone is written next to it (``<path>.token``, what the kubelet would mount)."""
    token = r.kubectl("create", "token", service_account, "-n", NS, "--duration", "3600s").stdout.strip()
    path.with_suffix(".token").write_text(token)
    admin = json.loads(r.kubectl("config", "view", "--raw", "--flatten", "-o", "json").stdout)
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [{"name": "local", "cluster": cluster}],
                "users": [{"name": service_account, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "local", "user": service_account, "namespace": NS}}],
            }
        )
    )
    return path


class Kubelet(threading.Thread):
    """What the kubelet does for a ConfigMap volume, roughly: the keys as files in a folder, updated
    when the ConfigMap changes (here every 0.3 s; the kubelet swaps all files at once, we rename each)."""

    def __init__(self, kubeconfig: Path, name: str, folder: Path):
        super().__init__(daemon=True)
        import kubernetes

        self.api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(kubeconfig)))
        self.name, self.folder = name, folder
        self.stopped = threading.Event()
        self.sync()

    def sync(self) -> None:
        cm = self.api.read_namespaced_config_map(self.name, NS)
        files = {k: v.encode() for k, v in (cm.data or {}).items()}
        files.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        self.folder.mkdir(parents=True, exist_ok=True)
        for key, data in files.items():
            target = self.folder / key
            if not target.exists() or target.read_bytes() != data:
                tmp = self.folder / f".{key}.tmp"
                tmp.write_bytes(data)
                tmp.replace(target)
        for stale in self.folder.iterdir():
            if stale.is_file() and not stale.name.startswith(".") and stale.name not in files:
                stale.unlink()

    def run(self) -> None:
        while not self.stopped.wait(0.3):
            try:
                self.sync()
            except Exception:  # noqa: BLE001 - a transient API error: next round
                pass


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=3, context=context) as resp:
        return resp.status == 200


def status_tls_files(r: Release, folder: Path) -> Path:
    """The status port's Secret (extender.statusTls) as the kubelet would mount it: tls.crt, tls.key, ca.crt."""
    secret = r.get("secret", f"{FULLNAME}-status-tls", "-n", NS)
    folder.mkdir()
    for key, value in secret["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return folder


def test_the_charts_rbac_runs_the_real_components(release: Release) -> None:
    r = release
    r.require("installed")
    work = r.tmp / "run"
    work.mkdir()
    config = r.get("configmap", f"{FULLNAME}-config", "-n", NS)["data"]
    operator_config = r.get("configmap", f"{FULLNAME}-operator", "-n", NS)["data"]["operator.yaml"]
    sched_kc = token_kubeconfig(r, f"{FULLNAME}-scheduler", work / "scheduler.kubeconfig")
    op_kc = token_kubeconfig(r, f"{FULLNAME}-operator", work / "operator.kubeconfig")

    # kube-scheduler: the installed configuration; only the credentials are added (in a pod they are
    # the in-cluster ones).
    sched_conf = yaml.safe_load(config["scheduler-config.yaml"])
    assert sched_conf["extenders"][0]["urlPrefix"] == f"http://127.0.0.1:{r.ports['verbs']}"
    sched_conf["clientConnection"] = {"kubeconfig": str(sched_kc)}
    (work / "scheduler.yaml").write_text(yaml.safe_dump(sched_conf))
    (work / "extender.yaml").write_text(config["extender.yaml"])
    (work / "operator.yaml").write_text(operator_config)
    policy_dir = work / "policy"
    kubelet = Kubelet(r.cluster.kubeconfig, f"{FULLNAME}-policy", policy_dir)
    kubelet.start()
    # The status port serves HTTPS with the Secret the chart made (its certificate names 127.0.0.1);
    # the settings file names the pod's mount, so the files are given here by flag.
    tls = status_tls_files(r, work / "status-tls")
    trusting = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    status = f"https://127.0.0.1:{r.ports['status']}"
    logs = {name: work / f"{name}.log" for name in ("extender", "kube-scheduler", "standby", "operator")}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["extender"] = start(
            [
                sys.executable,
                "-m",
                "rlsched.cli",
                "extender",
                "--config",
                str(work / "extender.yaml"),
                "--kubeconfig",
                str(sched_kc),
                "--policy-file",
                str(policy_dir / "policy.yaml"),
                "--status-host",
                "127.0.0.1",
                "--status-tls-cert-file",
                str(tls / "tls.crt"),
                "--status-tls-key-file",
                str(tls / "tls.key"),
                "--log-format",
                "text",
            ],
            logs["extender"],
        )
        wait_for(lambda: http_ok(f"{status}/readyz", trusting), 120, "the extender's /readyz")
        procs["kube-scheduler"] = start(
            [
                str(TOOLS_BIN / "kube-scheduler"),
                "--config",
                str(work / "scheduler.yaml"),
                "--authentication-kubeconfig",
                str(sched_kc),
                "--authorization-kubeconfig",
                str(sched_kc),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port()),
                "--v",
                "2",
            ],
            logs["kube-scheduler"],
        )
        procs["operator"] = start(
            [
                sys.executable,
                "-m",
                "rlsched.cli",
                "operator",
                "--config",
                str(work / "operator.yaml"),
                "--kubeconfig",
                str(op_kc),
                "--extender-url",
                status,
                "--extender-ca-file",
                str(tls / "ca.crt"),
                "--mount-path",
                str(policy_dir),
                "--extender-token-file",
                str(op_kc.with_suffix(".token")),
                "--decision-log",
                str(work / "decisions"),
                "--rollout-timeout",
                "60",
                "--status-interval",
                "2",
                "--liveness",
                f"http://127.0.0.1:{r.ports['health']}/healthz",
            ],
            logs["operator"],
        )
        # kube-scheduler takes the chart's Lease (the Role allows get/update of exactly that one).
        holder = wait_for(
            lambda: r.get("lease", SCHEDULER, "-n", "kube-system")["spec"].get("holderIdentity"),
            90,
            "kube-scheduler to take its Lease",
        )
        assert holder
        # A second replica (what a rolling update starts) is ready while it waits for the Lease: the
        # chart's readiness probe (/readyz) cannot deadlock a rollout with maxUnavailable 0.
        standby_port = free_port()
        procs["standby"] = start(
            [
                str(TOOLS_BIN / "kube-scheduler"),
                "--config",
                str(work / "scheduler.yaml"),
                "--authentication-kubeconfig",
                str(sched_kc),
                "--authorization-kubeconfig",
                str(sched_kc),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(standby_port),
            ],
            work / "standby.log",
        )
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # its self-signed serving cert
        for path in ("/readyz", "/livez"):
            wait_for(
                lambda path=path: (
                    urllib.request.urlopen(f"https://127.0.0.1:{standby_port}{path}", context=context, timeout=3).status
                    == 200
                ),
                60,
                f"the standby's {path}",
            )
        assert r.get("lease", SCHEDULER, "-n", "kube-system")["spec"]["holderIdentity"] == holder
        stop(procs.pop("standby"))
        # A pod of this scheduler: filtered, bound and annotated by the extender with the SA's RBAC.
        r.kubectl("apply", "-f", "-", input=yaml.safe_dump(restricted_pod("share", {"rlsched.io/gpu-milli": "300"})))
        pod = wait_for(
            lambda: (p := r.get("pod", "share", "-n", NS))["spec"].get("nodeName") and p,
            90,
            "the pod to be bound by the release's scheduler",
        )
        annotations = pod["metadata"]["annotations"]
        assert (
            annotations["rlsched.io/gpu-card-milli"] == "300"
            and annotations["rlsched.io/gpu-node"] == pod["spec"]["nodeName"]
        )
        # The operator, with its own RBAC: roll out a SchedulingPolicy through the policy ConfigMap,
        # with the model the chart serves, from a ConfigMap as a user would publish it (the real
        # loader: the extender must report the model's own version and the file's sha256).
        wait_for(lambda: http_ok(f"http://127.0.0.1:{r.ports['health']}/healthz"), 90, "the operator's liveness")
        model = SERVED_MODEL.read_bytes()
        model_sha = hashlib.sha256(model).hexdigest()
        r.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "models", "namespace": NS},
                "binaryData": {"served.npz": base64.b64encode(model).decode()},
            }
        )
        r.apply(
            {
                "apiVersion": "rlsched.io/v1alpha1",
                "kind": "SchedulingPolicy",
                "metadata": {"name": "default", "namespace": NS},
                "spec": {
                    "mode": "shadow",
                    "fallback": "bestfit",
                    "model": {"configMapKeyRef": {"name": "models", "key": "served.npz"}, "sha256": model_sha},
                },
            }
        )

        def ready() -> bool:
            conditions = r.get("schedulingpolicy", "default", "-n", NS).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for(ready, 120, "the SchedulingPolicy to be rolled out (Ready=True)")
        # The status port as the chart configures it: no token 401, a token without the grant 403 (the
        # scheduler's own ServiceAccount), the operator's token 200; probes stay open.
        op_token = op_kc.with_suffix(".token").read_text()

        def get(path: str, token: str | None) -> int:
            request = urllib.request.Request(
                f"{status}{path}", headers={"Authorization": f"Bearer {token}"} if token else {}
            )
            try:
                with urllib.request.urlopen(request, timeout=5, context=trusting) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code

        sched_token = sched_kc.with_suffix(".token").read_text()
        assert [get(p, None) for p in ("/decisions", "/status", "/metrics", "/healthz", "/readyz")] == [
            401,
            401,
            401,
            200,
            200,
        ]
        assert get("/decisions", sched_token) == 403 and get("/decisions", op_token) == 200
        served = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(f"{status}/status", headers={"Authorization": f"Bearer {op_token}"}),
                timeout=3,
                context=trusting,
            ).read()
        )
        assert served["statusTls"]["enabled"] and served["statusTls"]["reloadError"] is None, served["statusTls"]
        served = served["policy"]
        assert (served["mode"], served["fallback"]) == ("shadow", "bestfit"), served
        version = json.loads(SERVED_MODEL.with_suffix(".json").read_text())["version"]
        assert served["model"]["loaded"] and served["model"]["version"] == version, served
        assert served["model"]["digest"] == model_sha, served
        rolled = r.get("schedulingpolicy", "default", "-n", NS)["status"]["model"]
        assert (rolled["version"], rolled["digest"]) == (version, model_sha), rolled
        assert "mode: shadow" in r.get("configmap", f"{FULLNAME}-policy", "-n", NS)["data"]["policy.yaml"]
        assert r.get("configmap", f"{FULLNAME}-policy-last-good", "-n", NS).get("data")
        # Deleting it: the operator publishes an empty policy, clears last-good and drops its finalizer.
        r.kubectl("delete", "schedulingpolicy", "default", "-n", NS, "--timeout=90s")
        r.kubectl("delete", "configmap", "models", "-n", NS)  # the user's, not the release's
        r.kubectl("delete", "pod", "share", "-n", NS, "--timeout=60s")
    finally:
        for name in ("operator", "standby", "kube-scheduler", "extender"):
            stop(procs.get(name))
        kubelet.stopped.set()
    for name, path in logs.items():
        text = path.read_text(errors="replace")
        assert "forbidden" not in text.lower(), (
            f"{name} was refused something by RBAC:\n"
            + "\n".join(line for line in text.splitlines() if "forbidden" in line.lower())[:4000]
        )
    r.state["ran"] = True


def restricted_pod(name: str, limits: dict[str, str]) -> dict:
    """A pod that passes Pod Security "restricted", for the release's scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": SCHEDULER,
            "tolerations": [TAINT],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi", **limits}},
                }
            ],
        },
    }


# -- 4 --------------------------------------------------------------------------------------------


def template_hash(r: Release, component: str) -> str:
    dep = r.get("deployment", f"{FULLNAME}-{component}", "-n", NS)
    return dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def live_hashes(r: Release, component: str) -> set[str]:
    pods = r.get(
        "pods", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    )
    return {
        p["metadata"]["labels"]["pod-template-hash"]
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


def test_upgrade_changing_the_scheduler_config_rolls_the_scheduler_pod(release: Release) -> None:
    r = release
    r.require("installed")
    # What the operator would have published (policy file, bundle, model) and its rollback slot.
    published = {
        "data": {"policy.yaml": "mode: shadow\nfallback: bestfit\n", "bundle.json": '{"generation": 7}'},
        "binaryData": {"model-0123456789abcdef.npz": base64.b64encode(b"not really a model").decode()},
    }
    r.kubectl("patch", "configmap", f"{FULLNAME}-policy", "-n", NS, "--type=merge", "-p", json.dumps(published))
    last_good = f"{FULLNAME}-policy-last-good"
    if r.kubectl("get", "configmap", last_good, "-n", NS, check=False).returncode == 0:
        r.kubectl("patch", "configmap", last_good, "-n", NS, "--type=merge", "-p", json.dumps(published))
    else:  # deleted by the operator when step 3 retired its policy; it creates it anew (no Helm metadata)
        r.kubectl(
            "create",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    **published,
                    "metadata": {
                        "name": last_good,
                        "namespace": NS,
                        "labels": {"app.kubernetes.io/managed-by": "rlsched-operator", "rlsched.io/slot": "last-good"},
                    },
                }
            ),
        )
    before = {c: (template_hash(r, c), live_hashes(r, c)) for c in ("scheduler", "operator")}
    # The status port's certificate is made once: the upgrade finds it (lookup) and keeps it.
    tls_before = r.get("secret", f"{FULLNAME}-status-tls", "-n", NS)["data"]
    values = r.values()
    r.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "-f",
        str(values),
        "--set",
        "scheduler.config.weight=500",
        "--wait",
        "--timeout",
        "180s",
    )
    r.kubectl("rollout", "status", f"deployment/{FULLNAME}-scheduler", "-n", NS, "--timeout=120s")
    assert template_hash(r, "scheduler") != before["scheduler"][0]
    hashes = wait_for(
        lambda: (h := live_hashes(r, "scheduler")) and h.isdisjoint(before["scheduler"][1]) and h,
        60,
        "the old scheduler pod to go",
    )
    assert len(hashes) == 1  # one new ReplicaSet's pod, the old one gone
    assert (template_hash(r, "operator"), live_hashes(r, "operator")) == before["operator"]  # untouched
    conf = yaml.safe_load(r.get("configmap", f"{FULLNAME}-config", "-n", NS)["data"]["scheduler-config.yaml"])
    assert conf["extenders"][0]["weight"] == 500
    assert r.get("secret", f"{FULLNAME}-status-tls", "-n", NS)["data"] == tls_before
    for name in (f"{FULLNAME}-policy", f"{FULLNAME}-policy-last-good"):
        cm = r.get("configmap", name, "-n", NS)
        assert cm["data"] == published["data"] and cm["binaryData"] == published["binaryData"], name
    # The same values again: nothing rolls.
    after = template_hash(r, "scheduler")
    r.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "-f",
        str(values),
        "--set",
        "scheduler.config.weight=500",
        "--wait",
        "--timeout",
        "180s",
    )
    assert template_hash(r, "scheduler") == after and live_hashes(r, "scheduler") == hashes
    r.state["upgraded"] = True


# -- 5 --------------------------------------------------------------------------------------------


def leftovers(r: Release) -> list[str]:
    kinds = r.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]  # runtime records, expire by TTL
    found = r.kubectl("get", ",".join(kinds), "-n", NS, "-o", "name", "--ignore-not-found").stdout.split()
    expected = {"serviceaccount/default", "configmap/kube-root-ca.crt"}  # every namespace has these
    left = [o for o in found if o not in expected]
    labelled = f"app.kubernetes.io/instance={RELEASE}"
    for scope in (
        ["clusterroles,clusterrolebindings,clusterkopfpeerings.kopf.dev"],
        ["roles,rolebindings,leases,configmaps", "-n", "kube-system"],
    ):
        left += r.kubectl("get", *scope, "-l", labelled, "-o", "name", "--ignore-not-found").stdout.split()
    left += [
        o for o in r.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout.split() if FULLNAME in o
    ]
    return left


def test_uninstall_leaves_nothing_behind_but_the_crds(release: Release) -> None:
    r = release
    r.require("installed")
    r.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
    r.state["installed"] = False
    # Pods and ReplicaSets go through the garbage collector after their Deployment: give it a moment.
    deadline = time.monotonic() + 90
    while (left := leftovers(r)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not left, f"left behind by helm uninstall: {left}"
    assert RELEASE not in r.helm("list", "-n", NS, "-q").stdout
    for name in CRDS:  # Helm 3 installs crds/ once and never deletes them (docs/install.md)
        r.kubectl("get", "crd", name)


# -- 6 --------------------------------------------------------------------------------------------


def test_every_switch_on_is_accepted_by_the_api_server(release: Release) -> None:
    r = release
    r.kubectl("apply", "-f", "-", input=MONITORING_CRDS)
    r.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
        "--timeout=60s",
    )
    # The peering CRDs must exist for the KopfPeering to be accepted.
    r.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    values = r.values(
        networkPolicy={
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
        metrics={
            "serviceMonitor": {"enabled": True, "scrapeScheduler": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
        },
        operator={
            "peering": {"enabled": True},
            "watchNamespaces": [NS],
            "healthPort": r.ports["health"],
            "decisionLog": {"persistence": {"enabled": True}},
        },
        extender={"nativeSidecar": False, "port": r.ports["verbs"], "statusPort": r.ports["status"]},
        scheduler={
            "replicas": 2,
            "priorityClassName": "system-cluster-critical",
            "config": {"leaseNamespace": "", "keepScorePlugins": True},
        },
    )
    rendered = r.helm("template", RELEASE, str(CHART), "-n", NS, "-f", str(values)).stdout
    out = dry_run(r, rendered).stdout
    for kind in (
        "servicemonitor.monitoring.coreos.com",
        "prometheusrule.monitoring.coreos.com",
        "kopfpeering.kopf.dev",
        "persistentvolumeclaim",
        "lease.coordination.k8s.io",
        "networkpolicy.networking.k8s.io",
    ):
        assert f"{kind}/" in out, out


# -- 7 --------------------------------------------------------------------------------------------


def test_plain_manifests_install_and_go_away(release: Release) -> None:
    """manifests/ (the chart's default rendering) applied with kubectl: the pods come up (Pod Security
    "restricted" enforced by its Namespace), then deleting the files removes every object of them."""
    r = release
    files = sorted((REPO_ROOT / "manifests").glob("*.yaml"))
    assert [f.name for f in files][:2] == ["00-namespace.yaml", "01-crds.yaml"]
    namespace = "rlsched-system"
    if r.kubectl("get", "namespace", namespace, check=False).returncode == 0:
        pytest.skip(f"namespace {namespace} exists already in this cluster")
    # As docs/install.md says: the namespace, then the status port's Secret the manifests mount (its
    # certificate here from hack/stacklib's openssl helper; the docs' own commands run in
    # tests/unit/test_chart_status_tls.py), then everything.
    sys.path.insert(0, str(REPO_ROOT / "hack"))
    try:
        from stacklib.pki import tls_pki
    finally:
        sys.path.pop(0)
    pki = tls_pki(r.tmp / "manifests-pki")
    r.kubectl("apply", "--server-side", "-f", str(files[0]))
    r.kubectl(
        "-n",
        namespace,
        "create",
        "secret",
        "generic",
        "rl-scheduler-status-tls",
        "--type=kubernetes.io/tls",
        f"--from-file=tls.crt={pki['server_cert']}",
        f"--from-file=tls.key={pki['server_key']}",
        f"--from-file=ca.crt={pki['ca']}",
    )
    done = r.kubectl(
        "apply", "--server-side", "--force-conflicts", *[a for f in files for a in ("-f", str(f))], check=False
    )
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
    try:
        for name in ("rl-scheduler-scheduler", "rl-scheduler-operator"):
            r.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=120s")
    finally:
        others = [f for f in files if f.name != "01-crds.yaml"]  # the CRDs may serve others in this cluster
        r.kubectl(
            "delete",
            "--wait",
            "--ignore-not-found",
            *[a for f in reversed(others) for a in ("-f", str(f))],
            check=False,
        )
    wait_for(lambda: r.kubectl("get", "namespace", namespace, check=False).returncode != 0, 120, "the namespace to go")
    left = r.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout.split()
    left += r.kubectl("get", "roles,rolebindings,leases", "-n", "kube-system", "-o", "name").stdout.split()
    ours = [
        o
        for o in left
        if o.split("/", 1)[1].startswith(f"{namespace}-rl-scheduler")
        or (o.startswith("lease") and o.endswith("/rl-scheduler"))
    ]
    assert not ours, f"left behind by kubectl delete -f manifests/: {ours}"
