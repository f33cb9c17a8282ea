"""The release path end to end: hack/release.sh into a real OCI registry, then ``helm install oci://``.

A CNCF distribution registry (``registry``, built from Go modules by hack/build-tools.sh like the
control plane) serves plain HTTP on a free loopback port with its storage in a temporary folder.
``hack/release.sh 127.0.0.1:PORT --plain-http`` builds the image with hack/build-image.sh (the layers
test_image.py just built are in podman's cache, so this costs seconds after it), pushes it with podman,
packages the chart and pushes it with helm. Then:

1. the registry serves what was pushed: the image manifest, whose config is the local image (same
   digest) and whose every layer blob is there; the chart as a Helm OCI artifact whose layer is the
   packaged chart with the right version and appVersion;
2. the lines release.sh printed for the user (kubectl create/label namespace, ``helm install
   oci://127.0.0.1:PORT/charts/rl-scheduler --version X --plain-http``: no image setting, the pushed
   chart names its image), run as printed — only the namespace, the release name and a values file that
   puts the pods on a tainted kwok node are the test's own — install the chart onto the local cluster,
   and the pods reference the pushed image by its digest. kwok pulls nothing, so that the image is
   complete in the registry is what step 1 checks.

Skipped, saying why, without podman/runc (hack/install-system-deps.sh --containers); the registry
binary missing fails under RLSCHED_E2E_REQUIRE=1 (hack/test.sh) and skips otherwise.
``RLSCHED_E2E_IMAGE=IMAGE`` pushes that image instead of building (release.sh --image).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
CHART = yaml.safe_load((REPO_ROOT / "helm" / "rl-scheduler" / "Chart.yaml").read_text())
Cluster = Any  # tests/e2e/conftest.py's Cluster (conftest modules are not importable by name)


def _sibling(name: str) -> ModuleType:
    """Another e2e module, for its helpers (pytest has usually imported it already, under this name)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


helm_tests = _sibling("test_helm")  # Release (helm/kubectl with private Helm homes), the kwok node, wait_for
image_tests = _sibling("test_image")  # podman with the flags this host needs

NS = f"rlsched-release-e2e-{uuid.uuid4().hex[:6]}"
"""Its own each run: a namespace deleted by the run before may still be terminating."""
RELEASE = "rl-release"
SCHEDULER = "rl-release-e2e"  # its own Lease in kube-system: no clash with test_helm.py's release

pytestmark = pytest.mark.timeout(1800)

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


@dataclass
class Registry:
    host: str
    """127.0.0.1:PORT"""
    log: Path

    def get(self, path: str, accept: str = MANIFEST_TYPES, method: str = "GET") -> tuple[dict[str, str], bytes]:
        request = urllib.request.Request(f"http://{self.host}/v2/{path}", headers={"Accept": accept}, method=method)
        with urllib.request.urlopen(request, timeout=30) as resp:
            return dict(resp.headers), resp.read()

    def manifest(self, repository: str, reference: str) -> tuple[str, dict]:
        headers, body = self.get(f"{repository}/manifests/{reference}")
        return headers["Docker-Content-Digest"], json.loads(body)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    binary = TOOLS_BIN / "registry"
    if not binary.exists():
        why = f"the OCI registry is missing in {TOOLS_BIN}: hack/build-tools.sh registry builds it"
        if os.environ.get("RLSCHED_E2E_REQUIRE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("registry")
    port = helm_tests.free_port()
    config = tmp / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(tmp / "data")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    log = tmp / "registry.log"
    # OpenTelemetry: the registry exports traces over OTLP to localhost unless told not to.
    proc = helm_tests.start(["env", "OTEL_TRACES_EXPORTER=none", str(binary), "serve", str(config)], log)
    reg = Registry(f"127.0.0.1:{port}", log)

    def up() -> bool:
        assert proc.poll() is None, f"the registry exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        return reg.get("")[1] is not None

    try:
        helm_tests.wait_for(up, 30, "the registry's /v2/")
        yield reg
    finally:
        helm_tests.stop(proc)


@dataclass
class Released:
    registry: Registry
    stdout: str
    """What release.sh prints for the user (its tools' output goes to stderr)."""
    log: str
    local_image: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def released(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Released:
    env = image_tests.podman_env(tmp_path_factory)
    prebuilt = os.environ.get("RLSCHED_E2E_IMAGE")
    local_image = prebuilt or f"localhost/rl-scheduler:{CHART['appVersion']}"  # what release.sh builds
    done = subprocess.run(
        [str(REPO_ROOT / "hack" / "release.sh"), registry.host, "--plain-http"]
        + (["--image", prebuilt] if prebuilt else []),
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    pushed = f"{registry.host}/rl-scheduler:{CHART['appVersion']}"
    try:
        assert done.returncode == 0, f"hack/release.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        yield Released(registry, done.stdout, done.stderr, local_image, env)
    finally:  # the tag release.sh added, whose name carries this run's port
        image_tests.podman("untag", pushed, pushed, env=env, check=False)


def test_the_registry_serves_the_image(released: Released) -> None:
    reg = released.registry
    digest, manifest = reg.manifest("rl-scheduler", CHART["appVersion"])
    assert f"pushed {reg.host}/rl-scheduler:{CHART['appVersion']}@{digest}" in released.log  # podman's digest
    # The config blob is the local image's: the same image, not merely one of that name.
    image_id = image_tests.podman(
        "image", "inspect", "--format", "{{.Id}}", released.local_image, env=released.env
    ).stdout.strip()
    assert manifest["config"]["digest"] == f"sha256:{image_id}"
    _, config = reg.get(f"rl-scheduler/blobs/{manifest['config']['digest']}", accept="*/*")
    assert json.loads(config)["config"]["User"] == "65532:65532"
    assert len(manifest["layers"]) == len(json.loads(config)["rootfs"]["diff_ids"]) >= 2
    for layer in manifest["layers"]:  # every layer is there, at its size
        headers, _ = reg.get(f"rl-scheduler/blobs/{layer['digest']}", accept="*/*", method="HEAD")
        assert int(headers["Content-Length"]) == layer["size"], layer
    tags = json.loads(reg.get("rl-scheduler/tags/list", accept="application/json")[1])["tags"]
    assert CHART["appVersion"] in tags


def test_the_registry_serves_the_chart(released: Released) -> None:
    reg = released.registry
    _, manifest = reg.manifest("charts/rl-scheduler", CHART["version"])
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    _, config = reg.get(f"charts/rl-scheduler/blobs/{manifest['config']['digest']}", accept="*/*")
    assert (json.loads(config)["name"], json.loads(config)["appVersion"]) == ("rl-scheduler", CHART["appVersion"])
    (layer,) = (
        x for x in manifest["layers"] if x["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    )
    _, tgz = reg.get(f"charts/rl-scheduler/blobs/{layer['digest']}", accept="*/*")
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        names = tar.getnames()
        packaged = yaml.safe_load(tar.extractfile("rl-scheduler/Chart.yaml").read())  # type: ignore[union-attr]
    assert (packaged["version"], packaged["appVersion"]) == (CHART["version"], CHART["appVersion"])
    assert {"rl-scheduler/values.yaml", "rl-scheduler/crds/schedulingpolicy.yaml"} <= set(names)


def printed_commands(stdout: str) -> list[list[str]]:
    """The kubectl and helm lines release.sh printed for the user, as argv lists."""
    lines = [line.strip() for line in stdout.splitlines()]
    commands = [shlex.split(line) for line in lines if line.startswith(("kubectl ", "helm "))]
    assert [c[:2] for c in commands] == [["kubectl", "create"], ["kubectl", "label"], ["helm", "install"]], stdout
    return commands


def test_helm_install_from_the_registry_as_printed(released: Released, cluster: Cluster, tmp_path: Path) -> None:
    reg = released.registry
    create, label, install = printed_commands(released.stdout)
    assert install[3:6] == [f"oci://{reg.host}/charts/rl-scheduler", "--version", CHART["version"]], install
    assert not any("image." in a for a in install) and "--plain-http" in install  # the chart names its image
    # The test's own: namespace, release name, placement on a tainted kwok node, ports, scheduler name.
    printed_ns = install[install.index("-n") + 1]
    assert create[-1] == printed_ns and label[3] == printed_ns

    def ours(argv: list[str]) -> list[str]:
        return [NS if a == printed_ns else a for a in argv]

    r = helm_tests.Release(
        cluster,
        tmp_path,
        dict(
            cluster.env,
            HELM_CACHE_HOME=str(tmp_path / "cache"),
            HELM_CONFIG_HOME=str(tmp_path / "config"),
            HELM_DATA_HOME=str(tmp_path / "data"),
        ),
        {"verbs": helm_tests.free_port(), "status": helm_tests.free_port(), "health": helm_tests.free_port()},
        crds_before=set(),
    )
    existing = {o["metadata"]["name"] for o in r.get("crd")["items"]}
    r.kubectl("apply", "-f", "-", input=helm_tests.NODE_MANIFEST)
    try:
        for argv in (ours(create), ours(label)):
            done = r.kubectl(*argv[1:], check=False)
            assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stderr}"
        argv = ours(install)
        argv[2] = RELEASE
        r.helm(*argv[1:], "-f", str(r.values(schedulerName=SCHEDULER)), "--timeout", "180s")
        listed = json.loads(r.helm("list", "-n", NS, "-o", "json").stdout)
        assert [(x["name"], x["chart"], x["app_version"]) for x in listed] == [
            (RELEASE, f"rl-scheduler-{CHART['version']}", CHART["appVersion"])
        ]
        pods = r.get("pods", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        images = {
            (p["metadata"]["labels"]["app.kubernetes.io/component"], c["name"]): c["image"]
            for p in pods
            for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]
        }
        digest, _ = reg.manifest("rl-scheduler", CHART["appVersion"])
        pushed = f"{reg.host}/rl-scheduler@{digest}"  # pinned: the tag could be pushed over
        assert images[("scheduler", "extender")] == pushed and images[("operator", "operator")] == pushed, images
        assert images[("scheduler", "kube-scheduler")].startswith("registry.k8s.io/kube-scheduler:"), images
        assert all(p["status"]["phase"] == "Running" for p in pods), [p["status"] for p in pods]
    finally:
        if r.helm("status", RELEASE, "-n", NS, check=False).returncode == 0:
            r.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s", check=False)
        r.kubectl("delete", "namespace", NS, "--wait=false", "--ignore-not-found", check=False)
        r.kubectl("delete", "node", helm_tests.NODE, "--ignore-not-found", check=False)
        created = set(helm_tests.CRDS) - existing  # Helm leaves crds/ behind by design (docs/install.md)
        if created:
            r.kubectl("delete", "crd", *sorted(created), "--ignore-not-found", check=False)


def test_a_second_release_of_the_same_version_is_refused(released: Released) -> None:
    """The tag is there now: pushing over it would leave nodes that pulled it (IfNotPresent) on the old
    image. release.sh asks the real registry for its tags and stops before building or pushing."""
    done = subprocess.run(
        [
            str(REPO_ROOT / "hack" / "release.sh"),
            released.registry.host,
            "--plain-http",
            "--image",
            released.local_image,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=released.env,
    )
    assert done.returncode == 2, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "exists already" in done.stderr and "pushed " not in done.stderr
