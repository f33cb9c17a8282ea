"""The container image (Dockerfile), built and run with podman — no Docker engine, no registry.

hack/build-image.sh builds it the way that works without a Docker engine or privileges: a base
image made by debootstrap (cached under ~/.cache/rlsched), chroot isolation, runc with host
networking. Then, as the image's non-root user: ``rlsched extender --help`` and ``rlsched operator
--help`` work, torch and the trainer's packages are absent, and the extender — with a read-only root
filesystem and a tmpfs at /tmp, as the chart runs it, and the chart's own settings file — starts
against the local control plane and turns ready. The image size is printed (``-s``) and bounded.

Skipped, saying why, when podman or runc is missing (hack/install-system-deps.sh --containers).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
Cluster = Any  # tests/e2e/conftest.py's Cluster (conftest modules are not importable by name)

IMAGE = os.environ.get("RLSCHED_E2E_IMAGE", "localhost/rl-scheduler:e2e")
MAX_SIZE_MB = 700
"""Measured 548 MB on the debootstrap bookworm base (176 MB of it the base; numba + llvmlite 194 MB,
the kubernetes client + pydantic 68 MB); the bound catches a training dependency creeping in."""

pytestmark = pytest.mark.timeout(1800)


def podman(
    *args: str, timeout: float = 120, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["podman", "--cgroup-manager=cgroupfs", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check:
        assert done.returncode == 0, (
            f"podman {' '.join(args[:3])}... failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    return done


def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment podman builds and runs in here (CONTAINERS_CONF without default rlimits, which
    runc cannot set on every host); skips the test, saying why, without podman or runc."""
    missing = [
        tool for tool in ("podman", "runc") if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()
    ]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: hack/install-system-deps.sh --containers installs podman, runc "
            "and debootstrap (docs/install.md, 'The image')"
        )
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return dict(os.environ, CONTAINERS_CONF=str(conf))


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = podman_env(tmp_path_factory)
    if not os.environ.get("RLSCHED_E2E_IMAGE"):
        done = subprocess.run(
            [str(REPO_ROOT / "hack" / "build-image.sh"), "--tag", IMAGE],
            capture_output=True,
            text=True,
            timeout=1500,
            env=env,
        )
        assert done.returncode == 0, f"hack/build-image.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return env


def run(
    env: dict, *args: str, entrypoint: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess:
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return podman(
        "run",
        "--rm",
        "--runtime",
        "/usr/sbin/runc",
        "--ulimit",
        "host",
        "--network",
        "host",
        *extra,
        IMAGE,
        *args,
        env=env,
        check=check,
        timeout=timeout,
    )


def test_runs_as_a_non_root_user(image) -> None:
    user = podman("image", "inspect", "--format", "{{.Config.User}}", IMAGE, env=image).stdout.strip()
    assert user == "65532:65532"
    assert run(image, "-u", entrypoint="id").stdout.strip() == "65532"


def test_both_commands_answer_help(image) -> None:
    for command in ("extender", "operator"):
        done = run(image, command, "--help")
        assert done.stdout.startswith(f"usage: rlsched {command}"), done.stdout[:300]
    assert "extender" in run(image).stdout  # the default command: rlsched --help


def test_no_torch_and_no_training_packages(image) -> None:
    code = (
        "import importlib.util as u, sys\n"
        "present = [m for m in ('torch', 'matplotlib', 'gymnasium', 'tqdm', 'pip') if u.find_spec(m)]\n"
        "print(present); sys.exit(1 if present else 0)"
    )
    done = run(image, "-c", code, entrypoint="python", check=False)
    assert done.returncode == 0, f"present in the image: {done.stdout.strip()} {done.stderr[-500:]}"
    failed = run(image, "-c", "import torch", entrypoint="python", check=False)
    assert failed.returncode != 0 and "No module named 'torch'" in failed.stderr


def test_bundled_models_are_where_the_chart_looks(image) -> None:
    shipped = sorted(p.name for p in (REPO_ROOT / "policy" / "models").glob("*.npz"))
    listing = run(image, "-c", "ls /opt/rlsched/models/ 2>/dev/null || true", entrypoint="sh").stdout.split()
    assert sorted(n for n in listing if n.endswith(".npz")) == shipped  # none yet is fine; then none inside


def test_image_size(image) -> None:
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE, env=image).stdout.strip())
    print(f"\n{IMAGE}: {size / 1e6:.0f} MB")
    assert size < MAX_SIZE_MB * 1e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_extender_container_turns_ready_against_the_control_plane(image, cluster: Cluster, tmp_path: Path) -> None:
    """Read-only root filesystem, tmpfs /tmp (NUMBA_CACHE_DIR), the chart's settings file, policy
    ConfigMap layout and status port certificate (HTTPS, verified with the chart's CA), host
    networking to reach the local API server."""
    helm = TOOLS_BIN / "helm"
    if not helm.exists():
        pytest.skip(f"helm missing in {TOOLS_BIN} (the chart renders the extender's settings): hack/build-tools.sh")
    status_port, verbs_port = free_port(), free_port()
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "img",
            str(REPO_ROOT / "helm" / "rl-scheduler"),
            "--set",
            f"extender.port={verbs_port}",
            "--set",
            f"extender.statusPort={status_port}",
            "--show-only",
            "templates/scheduler/configmap.yaml",
            "--show-only",
            "templates/scheduler/status-tls-secret.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    config_dir, policy_dir, tls_dir = tmp_path / "config", tmp_path / "policy", tmp_path / "status-tls"
    config_dir.mkdir()
    policy_dir.mkdir()
    tls_dir.mkdir()
    docs = {d["kind"]: d for d in yaml.safe_load_all(rendered) if d}
    (config_dir / "extender.yaml").write_text(docs["ConfigMap"]["data"]["extender.yaml"])
    for key, value in docs["Secret"]["data"].items():  # the status port's certificate, as the pod mounts it
        (tls_dir / key).write_bytes(base64.b64decode(value))
        (tls_dir / key).chmod(0o644)
    trusting = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    (policy_dir / "policy.yaml").write_text("{}")
    kubeconfig = tmp_path / "kubeconfig"  # self-contained (the state folder's key files are root-only)
    kubeconfig.write_text(cluster.kubectl("config", "view", "--raw", "--flatten").stdout)
    for path in (config_dir, policy_dir, tls_dir, tmp_path):
        path.chmod(0o755)
    for path in (config_dir / "extender.yaml", policy_dir / "policy.yaml", kubeconfig):
        path.chmod(0o644)
    name = f"rlsched-e2e-{os.getpid()}"
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--runtime",
        "/usr/sbin/runc",
        "--ulimit",
        "host",
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,size=256m,mode=1777",
        "-v",
        f"{config_dir}:/etc/rlsched/config:ro",
        "-v",
        f"{policy_dir}:/etc/rlsched/policy:ro",
        "-v",
        f"{tls_dir}:/etc/rlsched/status-tls:ro",
        "-v",
        f"{kubeconfig}:/etc/rlsched/kubeconfig:ro",
        IMAGE,
        "extender",
        "--config=/etc/rlsched/config/extender.yaml",
        "--kubeconfig=/etc/rlsched/kubeconfig",
        "--status-host=127.0.0.1",
        env=image,
    )
    try:
        deadline, ready = time.monotonic() + 180, False
        while time.monotonic() < deadline and not ready:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{status_port}/readyz", timeout=3, context=trusting
                ) as resp:
                    ready = resp.status == 200
            except OSError:
                state = podman("inspect", "--format", "{{.State.Running}}", name, env=image, check=False).stdout.strip()
                assert state != "false", (
                    "the extender container exited:\n" + podman("logs", name, env=image, check=False).stderr[-3000:]
                )
                time.sleep(1)
        logs = podman("logs", name, env=image, check=False)
        assert ready, f"/readyz never turned 200:\n{logs.stdout[-2000:]}{logs.stderr[-3000:]}"
        # The chart's settings check tokens (auth.mode kubernetes): read /status as a ServiceAccount allowed to.
        for args in (
            ("create", "serviceaccount", "rlsched-image-e2e", "-n", "default"),
            ("create", "clusterrole", "rlsched-image-e2e", "--non-resource-url=/status", "--verb=get"),
            (
                "create",
                "clusterrolebinding",
                "rlsched-image-e2e",
                "--clusterrole=rlsched-image-e2e",
                "--serviceaccount=default:rlsched-image-e2e",
            ),
        ):
            cluster.kubectl(*args, check=False)  # already there from an earlier run: fine
        token = cluster.kubectl("create", "token", "rlsched-image-e2e", "-n", "default").stdout.strip()
        request = urllib.request.Request(
            f"https://127.0.0.1:{status_port}/status", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=3, context=trusting) as resp:
            status = json.loads(resp.read())
        assert status["policy"]["mode"] == "active" and status["cache"]["nodes"] >= 1
        model = status["policy"]["model"]  # the image's own model, loaded from its read-only root
        assert model["path"].startswith("/opt/rlsched/models/") and model["loaded"] and model["error"] is None, model
        assert "Read-only file system" not in logs.stderr and "cannot cache" not in logs.stderr
    finally:
        podman("rm", "-f", "-t", "5", name, env=image, check=False)
