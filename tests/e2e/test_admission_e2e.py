"""The operator's least privilege against the real kube-apiserver: the chart's RBAC and its
ValidatingAdmissionPolicy (docs/security.md).

The chart is rendered with ``helm template`` (the operator's ServiceAccount, RBAC and admission
policy; ``operator.watchNamespaces`` set to the release namespace and one more) and applied. Then,
authenticated with a bound token of the operator's ServiceAccount:

- the operator's own patch call (``rlsched.operator.kube.Kube.patch_pod_annotations``, which writes
  the requeue and rejection annotations) passes;
- a change of a pod's image, of a label, a finalizer, or of another annotation (added, changed or
  removed) is denied by the admission policy, and the message names the policy;
- a pod in a namespace the operator does not watch cannot be patched or listed (RBAC: 403 before
  admission), nor can any pod's status be patched or a pod deleted;
- with RBAC widened by mistake (an extra ClusterRole granting delete and pods/status), the policy
  still denies deleting a pod and patching its status: it is the second wall.

- the whole operator, run with that token and the settings file the chart renders, watches, keeps
  its finalizer, publishes the policy ConfigMap and reports in the SchedulingPolicy's status with no
  request refused: the chart grants all it uses.

The cluster admin's patches of the same kinds pass: the policy binds the operator's identity only.
Requests as the operator go through the Kubernetes client, not kubectl: kubectl reads a pod before
patching it, and the operator has no ``get`` on pods (its watch lists them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
CHART = REPO_ROOT / "helm" / "rl-scheduler"
Cluster = Any  # tests/e2e/conftest.py's Cluster


@dataclass(frozen=True)
class Names:
    """The namespaces and chart names one module's fixture owns.

    Each module has its own: the API server's admission-policy informer can take minutes to
    enforce a policy re-created under the name of one that was just deleted.
    """

    prefix: str
    release: str

    @property
    def ns(self) -> str:
        return f"{self.prefix}-e2e"

    @property
    def watched(self) -> str:
        return f"{self.prefix}-watched"

    @property
    def unwatched(self) -> str:
        return f"{self.prefix}-unwatched"

    @property
    def sa(self) -> str:
        return f"{self.release}-rl-scheduler-operator"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.ns}:{self.sa}"

    @property
    def policy(self) -> str:
        return f"{self.ns}-{self.release}-rl-scheduler-operator-pods"

    @property
    def widened(self) -> str:
        """A ClusterRole (and binding) a test adds to show that the policy holds when RBAC is too generous."""
        return f"{self.prefix}-e2e-widened"


NAMES = Names("rlsched-adm", "rl-adm")
NS, WATCHED, UNWATCHED, RELEASE = NAMES.ns, NAMES.watched, NAMES.unwatched, NAMES.release
SA, USER, POLICY, WIDENED = NAMES.sa, NAMES.user, NAMES.policy, NAMES.widened
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
IMAGE = "registry.k8s.io/pause:3.10"

pytestmark = pytest.mark.timeout(300)


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def pod_manifest(namespace: str, name: str) -> str:
    # A scheduler nobody runs: the pod stays pending and nothing but this test changes it.
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app": "victim"},
                "annotations": {"team.example.com/owner": "ml"},
            },
            "spec": {"schedulerName": "rlsched-adm-nobody", "containers": [{"name": "c", "image": IMAGE}]},
        }
    )


class Env:
    """The applied chart parts; the admin's kubectl and the operator's API client."""

    def __init__(self, cluster: Cluster, tmp: Path, names: Names = NAMES):
        self.cluster, self.tmp, self.names = cluster, tmp, names
        self.operator_kubeconfig = tmp / "operator.kubeconfig"
        self.core: Any = None

    def admin(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return self.cluster.kubectl(*args, input=input, check=check)

    def pod(self, namespace: str, name: str) -> dict:
        return json.loads(self.admin("get", "pod", name, "-n", namespace, "-o", "json").stdout)

    def connect_as_operator(self) -> None:
        import kubernetes

        token = self.admin("create", "token", self.names.sa, "-n", self.names.ns, "--duration", "3600s").stdout.strip()
        admin = json.loads(self.admin("config", "view", "--raw", "--flatten", "-o", "json").stdout)
        self.operator_kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "operator",
                    "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
                    "users": [{"name": "operator", "user": {"token": token}}],
                    "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
                }
            )
        )
        self.core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(self.operator_kubeconfig)))

    def as_operator(self, method: str, *args: Any, **kwargs: Any) -> tuple[int, str]:
        """(HTTP status, message) of a CoreV1Api call with the operator's token; 200 and "" when it passed."""
        from kubernetes.client.exceptions import ApiException

        try:
            getattr(self.core, method)(*args, **kwargs)
            return 200, ""
        except ApiException as exc:
            try:
                return exc.status, json.loads(exc.body)["message"]
            except (TypeError, ValueError, KeyError):
                return exc.status, str(exc.body or exc.reason)

    def patch_pod(self, namespace: str, name: str, body: dict, content_type: str = MERGE) -> tuple[int, str]:
        return self.as_operator("patch_namespaced_pod", name, namespace, body, _content_type=content_type)


def rendered_chart_parts(values: Path, names: Names = NAMES) -> str:
    args = [str(TOOLS_BIN / "helm"), "template", names.release, str(CHART), "-n", names.ns, "-f", str(values)]
    for template in ("serviceaccount.yaml", "rbac.yaml", "admission-policy.yaml"):
        args += ["--show-only", f"templates/operator/{template}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def applied_chart(cluster: Cluster, tmp: Path, names: Names, values: dict, pods: dict[str, list[str]]) -> Iterator[Env]:
    """The chart's operator parts rendered with ``values`` and applied in ``names``' namespaces, the
    pods ``pods`` names (namespace → pod names) created, and the admission policy enforced; all of it
    removed afterwards."""
    env = Env(cluster, tmp, names)
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    manifest = rendered_chart_parts(values_file, names)
    kinds = {d["kind"] for d in yaml.safe_load_all(manifest) if d}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Role", "ClusterRole"} <= kinds, kinds
    for ns in (names.ns, names.watched, names.unwatched):  # an earlier run's namespaces may still be terminating
        wait_for(
            lambda ns=ns: env.admin("get", "namespace", ns, check=False).returncode != 0, 120, f"namespace {ns} to go"
        )
        env.admin("create", "namespace", ns)
    try:
        env.admin("apply", "-f", "-", input=manifest)
        for ns, pod_names in pods.items():  # pods need the namespace's default ServiceAccount (kube-controller-manager)
            wait_for(
                lambda ns=ns: env.admin("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
                60,
                f"the default ServiceAccount of {ns}",
            )
            for name in pod_names:
                env.admin("create", "-f", "-", input=pod_manifest(ns, name))
        env.admin("create", "-f", "-", input=pod_manifest(names.watched, "probe"))
        env.connect_as_operator()
        # The API server enforces a new policy once its policy source has loaded it (a refresh every
        # second or two): wait for a denial, on a pod of its own so that an early success changes
        # nothing the tests look at. Until then the probe's patch passes, so every probe sets a new
        # value: a repeated one would be no change, which the policy rightly allows.
        answers: list[tuple[int, str]] = []

        def enforced() -> bool:
            label = {"metadata": {"labels": {"probe": str(len(answers))}}}
            answers.append(env.patch_pod(names.watched, "probe", label))
            return names.policy in answers[-1][1]

        try:
            wait_for(enforced, 150, "the admission policy to be enforced")
        except AssertionError as exc:
            policies = env.admin("get", "validatingadmissionpolicy,validatingadmissionpolicybinding", check=False)
            last = answers[-1] if answers else None
            raise AssertionError(f"{exc}; the probe's last answer: {last}; {policies.stdout}") from None
        yield env
    finally:
        env.admin("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=manifest, check=False)
        env.admin("delete", "clusterrolebinding,clusterrole", names.widened, "--ignore-not-found", check=False)
        for ns in (names.ns, names.watched, names.unwatched):
            env.admin("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if not (TOOLS_BIN / "helm").exists():
        pytest.skip(f"helm missing in {TOOLS_BIN} (run hack/build-tools.sh)")
    values = {"operator": {"watchNamespaces": [NS, WATCHED]}}
    yield from applied_chart(
        cluster, tmp_path_factory.mktemp("admission"), NAMES, values, {WATCHED: ["victim"], UNWATCHED: ["victim"]}
    )


def denied_by_policy(answer: tuple[int, str], reason: str, policy: str = POLICY) -> None:
    status, message = answer
    assert status == 403, answer
    assert f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request" in message, message
    assert reason in message, message


def forbidden_by_rbac(answer: tuple[int, str], what: str, user: str = USER) -> None:
    status, message = answer
    assert status == 403, answer
    assert f'User "{user}" cannot {what}' in message and "ValidatingAdmissionPolicy" not in message, message


def test_policy_type_checks_against_the_pod_schema(env: Env) -> None:
    """The API server type-checks every expression against Pod's schema: no warning for any."""

    def checked() -> dict | None:
        policy = json.loads(env.admin("get", "validatingadmissionpolicy", POLICY, "-o", "json").stdout)
        return policy if policy.get("status", {}).get("observedGeneration") else None

    status = wait_for(checked, 60, "the policy's type checking")["status"]
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


def test_operators_own_annotation_patches_pass(env: Env) -> None:
    """The operator's real client call (merge patch, UID precondition) with its token."""
    from rlsched.operator.kube import Kube, load_configuration

    uid = env.pod(WATCHED, "victim")["metadata"]["uid"]
    kube = Kube(load_configuration(str(env.operator_kubeconfig), None))
    try:
        asyncio.run(kube.patch_pod_annotations(WATCHED, "victim", uid, {"rlsched.io/requeue-attempt": "1"}))
        asyncio.run(kube.patch_pod_annotations(WATCHED, "victim", uid, {"rlsched.io/policy-rejected": "too big"}))
    finally:
        kube.close()
    annotations = env.pod(WATCHED, "victim")["metadata"]["annotations"]
    assert annotations == {
        "team.example.com/owner": "ml",
        "rlsched.io/requeue-attempt": "1",
        "rlsched.io/policy-rejected": "too big",
    }
    # Removing its own annotation is allowed too.
    assert env.patch_pod(WATCHED, "victim", {"metadata": {"annotations": {"rlsched.io/policy-rejected": None}}}) == (
        200,
        "",
    )


def rendered_operator_settings(tmp: Path, names: Names = NAMES) -> dict:
    """The operator's settings file as the chart renders it for ``names`` (operator/configmap.yaml)."""
    values = tmp / "settings-values.yaml"
    values.write_text(yaml.safe_dump({"operator": {"watchNamespaces": [names.ns, names.watched]}}))
    args = [str(TOOLS_BIN / "helm"), "template", names.release, str(CHART), "-n", names.ns, "-f", str(values)]
    done = subprocess.run(
        [*args, "--show-only", "templates/operator/configmap.yaml"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(yaml.safe_load(done.stdout)["data"]["operator.yaml"])


def test_the_operator_runs_on_the_charts_rights_alone(env: Env, tmp_path: Path) -> None:
    """The whole operator (kopf's watches, the finalizer, the policy ConfigMap, the status) with the
    bound token of its ServiceAccount and the settings the chart renders: no request is refused, so
    the chart grants everything it uses (the rules without a use are gone: no ``get`` on
    SchedulingPolicies or their status). Runs before the test that widens the RBAC."""
    import socket

    # The chart's CRDs, created where missing and deleted again at the end: other modules (the helm
    # test's first install) expect a cluster without them.
    crds = [
        d
        for f in sorted((REPO_ROOT / "helm" / "rl-scheduler" / "crds").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    created = [
        d["metadata"]["name"] for d in crds if env.admin("get", "crd", d["metadata"]["name"], check=False).returncode
    ]
    for d in crds:
        if d["metadata"]["name"] in created:
            env.admin("create", "-f", "-", input=json.dumps(d))
    env.admin("wait", "--for=condition=Established", "crd/schedulingpolicies.rlsched.io", "--timeout=60s")
    settings = rendered_operator_settings(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings["decisionLog"]["path"] = str(tmp_path / "decisions")
    settings["extender"]["statusUrl"] = "http://127.0.0.1:9"  # nothing answers: the rollout fails and says so
    settings["extender"].pop("caFile", None)  # the chart's CA for its HTTPS status port: not with http://
    settings["extender"]["rolloutTimeoutS"] = 3
    settings["livenessEndpoint"] = f"http://127.0.0.1:{port}/healthz"
    (tmp_path / "operator.yaml").write_text(yaml.safe_dump(settings))
    token = tmp_path / "token"
    token.write_text("unused")  # the extender's status port would check it; nothing listens there
    policy = settings["policy"]
    manifest = {
        "apiVersion": "rlsched.io/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": policy["name"], "namespace": policy["namespace"]},
        "spec": {"fallback": "fgd"},
    }
    log_path = tmp_path / "operator.log"
    env_vars = {**os.environ, "PYTHONSAFEPATH": "1"}
    with open(log_path, "ab") as log:
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlsched.cli",
                "operator",
                "--config",
                str(tmp_path / "operator.yaml"),
                "--kubeconfig",
                str(env.operator_kubeconfig),
                "--extender-token-file",
                str(token),
            ],
            stdout=log,
            stderr=log,
            env=env_vars,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "operator started" in log_path.read_text(), 60, "the operator to start")
        env.admin("apply", "-f", "-", input=json.dumps(manifest))

        def reported() -> dict | None:
            got = json.loads(
                env.admin("get", "schedulingpolicy", policy["name"], "-n", policy["namespace"], "-o", "json").stdout
            )
            return got if (got.get("status") or {}).get("conditions") else None

        got = wait_for(reported, 90, "the operator to report on the SchedulingPolicy")
        assert got["metadata"].get("finalizers"), got["metadata"]
        configmap = settings["sink"]["configmap"]
        assert (
            env.admin("get", "configmap", configmap, "-n", settings["sink"]["namespace"], check=False).returncode == 0
        )
        env.admin("delete", "schedulingpolicy", policy["name"], "-n", policy["namespace"], "--timeout=60s")
        text = log_path.read_text()
        refused = [line for line in text.splitlines() if "403" in line or "Forbidden" in line or "forbidden" in line]
        assert not refused, "\n".join(refused[:10])
    finally:
        # A failed run must not leave the finalizer behind: the namespace could never go.
        env.admin(
            "patch", "schedulingpolicy", policy["name"], "-n", policy["namespace"], "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
        env.admin(
            "delete", "schedulingpolicy", policy["name"], "-n", policy["namespace"], "--ignore-not-found",
            "--wait=false", check=False,
        )  # fmt: skip
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
        for name in created:
            env.admin("delete", "crd", name, "--ignore-not-found", "--timeout=60s", check=False)


def test_image_label_finalizer_and_foreign_annotation_changes_are_denied(env: Env) -> None:
    denied_by_policy(
        env.patch_pod(
            WATCHED,
            "victim",
            {"spec": {"containers": [{"name": "c", "image": "registry.example.com/evil:1"}]}},
            STRATEGIC,
        ),
        "may not change a pod's spec",
    )
    metadata = "may not change a pod's metadata other than rlsched.io/ annotations"
    denied_by_policy(env.patch_pod(WATCHED, "victim", {"metadata": {"labels": {"app": "hijacked"}}}), metadata)
    denied_by_policy(env.patch_pod(WATCHED, "victim", {"metadata": {"labels": {"extra": "1"}}}), metadata)
    # One allowed key beside a forbidden change: the whole request is denied.
    denied_by_policy(
        env.patch_pod(
            WATCHED,
            "victim",
            {"metadata": {"annotations": {"rlsched.io/requeue-attempt": "2"}, "finalizers": ["example.com/hold"]}},
        ),
        metadata,
    )
    foreign = "may change only annotations whose key starts with rlsched.io/"
    for changed in (
        {"team.example.com/owner": "me"},
        {"team.example.com/owner": None},
        {"kopf.rlsched.io/x": "1"},
        {"rlsched.io.example.com/x": "1"},
    ):
        denied_by_policy(env.patch_pod(WATCHED, "victim", {"metadata": {"annotations": changed}}), foreign)
    pod = env.pod(WATCHED, "victim")
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    assert pod["metadata"]["labels"] == {"app": "victim"} and not pod["metadata"].get("finalizers")
    assert pod["metadata"]["annotations"] == {"team.example.com/owner": "ml", "rlsched.io/requeue-attempt": "1"}


def test_the_admin_is_not_affected(env: Env) -> None:
    env.admin("label", "pod", "victim", "-n", WATCHED, "app=relabelled", "--overwrite")
    env.admin("annotate", "pod", "victim", "-n", WATCHED, "team.example.com/owner=ops", "--overwrite")
    env.admin(
        "patch",
        "pod",
        "victim",
        "-n",
        WATCHED,
        "-p",
        '{"spec":{"containers":[{"name":"c","image":"registry.k8s.io/pause:3.9"}]}}',
    )
    pod = env.pod(WATCHED, "victim")
    assert pod["spec"]["containers"][0]["image"] == "registry.k8s.io/pause:3.9"
    assert pod["metadata"]["labels"]["app"] == "relabelled"
    assert pod["metadata"]["annotations"]["team.example.com/owner"] == "ops"


def test_unwatched_namespaces_pod_status_and_deletion_are_out_of_reach(env: Env) -> None:
    forbidden_by_rbac(
        env.patch_pod(UNWATCHED, "victim", {"metadata": {"annotations": {"rlsched.io/requeue-attempt": "1"}}}),
        f'patch resource "pods" in API group "" in the namespace "{UNWATCHED}"',
    )
    forbidden_by_rbac(env.as_operator("list_namespaced_pod", UNWATCHED), 'list resource "pods"')
    forbidden_by_rbac(
        env.as_operator("list_pod_for_all_namespaces"), 'list resource "pods" in API group "" at the cluster scope'
    )
    condition = {"status": {"conditions": [{"type": "rlsched.io/X", "status": "True"}]}}
    forbidden_by_rbac(
        env.as_operator("patch_namespaced_pod_status", "victim", WATCHED, condition, _content_type=STRATEGIC),
        'patch resource "pods/status"',
    )
    forbidden_by_rbac(env.as_operator("delete_namespaced_pod", "victim", WATCHED), 'delete resource "pods"')
    assert "rlsched.io/requeue-attempt" not in env.pod(UNWATCHED, "victim")["metadata"]["annotations"]
    # In the watched namespace the same patch passes.
    assert env.patch_pod(WATCHED, "victim", {"metadata": {"annotations": {"rlsched.io/requeue-attempt": "2"}}}) == (
        200,
        "",
    )


def test_the_policy_holds_when_rbac_is_widened_by_mistake(env: Env) -> None:
    env.admin(
        "create",
        "clusterrole",
        WIDENED,
        "--verb=delete,patch,update",
        "--resource=pods,pods/status,pods/ephemeralcontainers",
    )
    env.admin("create", "clusterrolebinding", WIDENED, f"--clusterrole={WIDENED}", f"--serviceaccount={NS}:{SA}")
    condition = {"status": {"conditions": [{"type": "rlsched.io/X", "status": "True"}]}}

    def past_rbac() -> tuple[int, str] | None:
        answer = env.as_operator("patch_namespaced_pod_status", "victim", WATCHED, condition, _content_type=STRATEGIC)
        return None if "cannot patch" in answer[1] else answer

    update_only = "may only update pods' rlsched.io/ annotations"
    denied_by_policy(wait_for(past_rbac, 30, "the widened RBAC to apply"), update_only)
    denied_by_policy(env.as_operator("delete_namespaced_pod", "victim", WATCHED), update_only)
    denied_by_policy(
        env.patch_pod(UNWATCHED, "victim", {"metadata": {"labels": {"app": "hijacked"}}}),
        "may not change a pod's metadata",
    )
    pod = env.pod(WATCHED, "victim")
    assert not pod["metadata"].get("deletionTimestamp")
    assert not [c for c in pod["status"].get("conditions", []) if c["type"] == "rlsched.io/X"]
