"""Image references from values files, and what NOTES.txt tells a user to run.

- A tag written unquoted in a values file reaches the templates as a number (`tag: 0.2` is a float64):
  the image must still read `repo:0.2`, not `repo:%!s(float64=0.2)`.
- NOTES.txt's way to read /status: a dedicated ServiceAccount allowed exactly `get` on /status, not the
  operator's token (which may patch pods). The kubectl lines it prints run offline
  (`--dry-run=client -o yaml`) and the RBAC they create is checked against the SubjectAccessReview
  the extender's authenticator really sends; its token is made for the status port's audience
  (extender.auth.audience), which the extender's rendered settings accept.

`helm template` leaves NOTES.txt out, and `helm install --dry-run` wants a cluster: the test renders it
through `tpl` in a copy of the chart.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
import sys
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
KUBECTL = (Path(HELM).parent / "kubectl") if HELM else None
if KUBECTL is None or not KUBECTL.exists():
    KUBECTL = Path(shutil.which("kubectl") or "/nonexistent/kubectl")


def template(tmp_path: Path, chart: Path, values_yaml: str = "", *extra: str) -> list[dict]:
    args = [str(HELM), "template", "rl-scheduler", str(chart), "--namespace", "rlsched-system", *extra]
    if values_yaml:
        f = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        f.write_text(values_yaml)  # as written: yaml.safe_dump would not say how a tag is quoted
        args += ["--values", str(f)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def images(objs: list[dict]) -> dict[str, str]:
    out = {}
    for o in objs:
        if o["kind"] == "Deployment":
            spec = o["spec"]["template"]["spec"]
            out |= {c["name"]: c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
    return out


@needs_helm
@pytest.mark.parametrize(
    ("written", "reads"),
    [("0.2", "0.2"), ("7", "7"), ("20240101", "20240101"), ('"1.10"', "1.10"), ("v0.2.0", "v0.2.0")],
)
def test_image_tags_render_as_written(tmp_path: Path, written: str, reads: str) -> None:
    values = f"image:\n  tag: {written}\nscheduler:\n  image:\n    tag: {written}\n"
    got = images(template(tmp_path, CHART, values))
    assert got["extender"] == got["operator"] == f"localhost/rl-scheduler:{reads}", got
    assert got["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{reads}", got


@needs_helm
def test_image_tags_set_on_the_command_line_render_as_given(tmp_path: Path) -> None:
    got = images(template(tmp_path, CHART, "", "--set", "image.tag=12", "--set", "scheduler.image.tag=v1.36.0"))
    assert got["extender"] == "localhost/rl-scheduler:12" and got["kube-scheduler"].endswith(":v1.36.0"), got


def rendered_notes(tmp_path: Path, values_yaml: str = "", chart: Path = CHART) -> str:
    copy = tmp_path / "chart"
    shutil.copytree(chart, copy)
    (copy / "templates" / "NOTES.txt").rename(copy / "NOTES.in")
    (copy / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rendered-notes}\n"
        'data:\n  notes: {{ tpl (.Files.Get "NOTES.in") . | toYaml | indent 4 | trim }}\n'
    )
    (cm,) = [
        o
        for o in template(tmp_path, copy, values_yaml, "--show-only", "templates/zz-notes.yaml")
        if o["kind"] == "ConfigMap"
    ]
    return cm["data"]["notes"]


def status_section(notes: str) -> str:
    start = notes.index("\n3. ")
    end = notes.find("\n4. ", start)
    return notes[start : end if end > 0 else None]


class RbacApi:
    """TokenReview: the token names the ServiceAccount. SubjectAccessReview: evaluated against the
    ClusterRoles and ClusterRoleBindings given (non-resource rules only, as the extender asks)."""

    def __init__(self, objects: list[dict], token_user: str, token_audience: str | None = None):
        self.objects, self.token_user, self.token_audience = objects, token_user, token_audience
        self.reviews: list[dict] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if path.endswith("/tokenreviews"):
            # A token made with --audience is valid for that audience only (kube-apiserver's answer).
            asked = body["spec"].get("audiences") or ["https://kubernetes.default.svc.cluster.local"]
            mine = [self.token_audience] if self.token_audience else ["https://kubernetes.default.svc.cluster.local"]
            if not set(asked) & set(mine):
                return {"status": {"authenticated": False, "error": "token audiences are invalid"}}
            ns = self.token_user.split(":")[2]
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
            user = {"username": self.token_user, "groups": groups}
            return {"status": {"authenticated": True, "user": user, "audiences": sorted(set(asked) & set(mine))}}
        spec = body["spec"]
        self.reviews.append(spec)
        attrs = spec["nonResourceAttributes"]
        roles = {o["metadata"]["name"]: o for o in self.objects if o["kind"] == "ClusterRole"}
        for b in (o for o in self.objects if o["kind"] == "ClusterRoleBinding"):
            bound = any(
                s["kind"] == "ServiceAccount" and spec["user"] == f"system:serviceaccount:{s['namespace']}:{s['name']}"
                for s in b["subjects"]
            )
            role = roles.get(b["roleRef"]["name"]) if bound else None
            for rule in (role or {}).get("rules", []):
                if attrs["path"] in rule.get("nonResourceURLs", []) and attrs["verb"] in rule.get("verbs", []):
                    return {"status": {"allowed": True}}
        return {"status": {"allowed": False}}


@needs_helm
def test_notes_read_status_with_a_read_only_service_account(tmp_path: Path) -> None:
    if not KUBECTL.exists():
        pytest.skip("kubectl missing: run hack/build-tools.sh (.tools/bin/kubectl)")
    from rlsched.extender.auth import Authenticator
    from rlsched.extender.settings import load_settings

    section = status_section(rendered_notes(tmp_path))
    lines = [line.strip() for line in section.splitlines()]
    assert "rl-scheduler-operator" not in section, section  # the operator's token may patch pods
    creates = [shlex.split(line) for line in lines if line.startswith("kubectl ") and " create " in line]
    made = [c for c in creates if "token" not in c]
    assert [c[c.index("create") + 1] for c in made] == ["serviceaccount", "clusterrole", "clusterrolebinding"], made
    objects = []
    for argv in made:  # as printed, run offline
        done = subprocess.run(
            [str(KUBECTL), *argv[1:], "--dry-run=client", "-o", "yaml"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/dev/null", "HOME": str(tmp_path)},
        )
        assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr}"
        objects.append(yaml.safe_load(done.stdout))
    sa = objects[0]
    assert (sa["kind"], sa["metadata"]["namespace"]) == ("ServiceAccount", "rlsched-system")
    (curl,) = [line for line in lines if line.startswith("curl ")]
    token_cmd = f"kubectl -n rlsched-system create token {sa['metadata']['name']} --audience rlsched-extender"
    assert f"$({token_cmd})" in curl and curl.endswith("/status"), curl
    config = tmp_path / "extender.yaml"  # the extender's settings as the chart renders them
    (cm,) = [o for o in template(tmp_path, CHART) if o["kind"] == "ConfigMap" and "extender.yaml" in o.get("data", {})]
    config.write_text(cm["data"]["extender.yaml"])

    async def verdicts() -> tuple[dict[str, int], RbacApi]:
        api = RbacApi(objects, f"system:serviceaccount:rlsched-system:{sa['metadata']['name']}", "rlsched-extender")
        auth = Authenticator(api, load_settings(config).auth)
        got = {p: (await auth.check("Bearer some-token", p)).status for p in ("/status", "/decisions", "/metrics")}
        return got, api

    got, api = asyncio.run(verdicts())
    # Exactly enough: /status, nothing else the listener guards.
    assert got == {"/status": 200, "/decisions": 403, "/metrics": 403}, got
    assert {(r["nonResourceAttributes"]["path"], r["nonResourceAttributes"]["verb"]) for r in api.reviews} == {
        ("/status", "get"),
        ("/decisions", "get"),
        ("/metrics", "get"),
    }


@needs_helm
def test_two_releases_get_their_own_reader(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = status_section(rendered_notes(tmp_path / "a"))
    b = status_section(rendered_notes(tmp_path / "b", "fullnameOverride: other\n"))
    made = [line.strip() for line in a.splitlines() if line.strip().startswith("kubectl create cluster")]
    assert len(made) == 2 and not any(line in b for line in made), (made, b)
