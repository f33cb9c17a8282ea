"""Shared fixtures of the end-to-end tests: one real control plane per test session.

``cluster`` runs ``hack/local-cluster.sh up`` (etcd, kube-apiserver, kube-controller-manager, kwok
with fake nodes, kube-scheduler; no Prometheus) in a private state folder with free ports, yields
a :class:`Cluster` and runs ``down`` at the end. Tests that need another KubeSchedulerConfiguration
call :meth:`Cluster.scheduler`. Every e2e test is skipped (with the reason) when the control-plane
binaries are missing: ``hack/build-tools.sh`` builds them.

Env: ``RLSCHED_E2E_CLUSTER_DIR`` reuses a running cluster's state folder (no up/down) — handy
while iterating: ``RLSCHED_CLUSTER_DIR=/tmp/c hack/local-cluster.sh up --fake-nodes 4``.

Prometheus: the cluster runs the Debian ``prometheus`` when it is installed
(``hack/install-system-deps.sh``) so that the extender's load path is exercised
(tests/e2e/test_extender_e2e.py); ``RLSCHED_E2E_PROMETHEUS=0`` turns it off. ``Cluster.prometheus_url``
is None without it.

Any cluster (``hack/kind-e2e.sh``): ``RLSCHED_E2E_KUBECONFIG=FILE`` runs against that cluster instead
of starting one; only tests marked ``kind`` run (the rest need local processes: they are skipped, with
the reason), and ``Cluster.external`` is True.

``RLSCHED_E2E_REQUIRE=1`` (set by hack/test.sh): missing control-plane binaries fail the run instead of
skipping the e2e tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "hack" / "local-cluster.sh"
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
FAKE_NODES = 4


EXTERNAL_KUBECONFIG = os.environ.get("RLSCHED_E2E_KUBECONFIG")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kind: an e2e test that also runs against any cluster with the chart installed "
        "(RLSCHED_E2E_KUBECONFIG, hack/kind-e2e.sh)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/e2e carries the ``e2e`` marker; against an external cluster only the
    ``kind`` ones run."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if EXTERNAL_KUBECONFIG and item.get_closest_marker("kind") is None:
                item.add_marker(
                    pytest.mark.skip(
                        reason="needs the local control plane and local processes (RLSCHED_E2E_KUBECONFIG is set)"
                    )
                )


@dataclass
class Cluster:
    """A running local control plane."""

    state_dir: Path
    kubeconfig: Path
    env: dict[str, str]
    """The process environment with KUBECONFIG, RLSCHED_CLUSTER_DIR and PATH (kubectl) set."""

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """``hack/local-cluster.sh ARGS`` against this cluster."""
        return subprocess.run(
            [str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=check
        )

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def scheduler(self, config: Path | None) -> None:
        """(Re)start kube-scheduler with ``config`` (None: the default profile only)."""
        args = ["scheduler", "start"] + (["--scheduler-config", str(config)] if config else [])
        done = self.run(*args, check=False, timeout=180)
        assert done.returncode == 0, f"scheduler start failed:\n{done.stderr[-3000:]}"

    def log(self, component: str) -> str:
        path = self.state_dir / "logs" / f"{component}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    external: bool = False
    """True for a cluster given by RLSCHED_E2E_KUBECONFIG (no local processes, no state folder)."""

    def ports(self) -> dict[str, int]:
        """The ports hack/local-cluster.sh chose (ports.env)."""
        path = self.state_dir / "ports.env"
        if self.external or not path.exists():
            return {}
        return {k: int(v) for k, v in (line.split("=", 1) for line in path.read_text().split() if "=" in line)}

    @property
    def prometheus_url(self) -> str | None:
        """The cluster's Prometheus, when it runs (None with --no-prometheus or an external cluster)."""
        if self.external or not (self.state_dir / "run" / "prometheus.pid").exists():
            return None
        return f"http://127.0.0.1:{self.ports()['PROMETHEUS_PORT']}"

    @property
    def prometheus_targets_dir(self) -> Path:
        """Prometheus reads file_sd target files from here (every 5 s)."""
        return self.state_dir / "prometheus" / "targets"


def want_prometheus() -> bool:
    flag = os.environ.get("RLSCHED_E2E_PROMETHEUS", "auto").lower()
    if flag in ("0", "false", "no", "off"):
        return False
    return shutil.which("prometheus") is not None


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if EXTERNAL_KUBECONFIG:
        kc = Path(EXTERNAL_KUBECONFIG).resolve()
        env = dict(os.environ, KUBECONFIG=str(kc), PATH=f"{TOOLS_BIN}:{os.environ.get('PATH', '')}")
        yield Cluster(
            state_dir=Path(tempfile.mkdtemp(prefix="rlsched-e2e-external-")), kubeconfig=kc, env=env, external=True
        )
        return
    missing = [
        b
        for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
        if not (TOOLS_BIN / b).exists()
    ]
    if missing:
        why = f"control-plane binaries missing in {TOOLS_BIN}: {', '.join(missing)} (run hack/build-tools.sh)"
        if os.environ.get("RLSCHED_E2E_REQUIRE") == "1":  # hack/test.sh: CI must not pass by skipping
            pytest.fail(why)
        pytest.skip(why)
    reuse = os.environ.get("RLSCHED_E2E_CLUSTER_DIR")
    state = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="rlsched-e2e-"))
    env = dict(os.environ, RLSCHED_CLUSTER_DIR=str(state), PATH=f"{TOOLS_BIN}:{os.environ.get('PATH', '')}")
    for var in (
        "RLSCHED_ETCD_PORT",
        "RLSCHED_ETCD_PEER_PORT",
        "RLSCHED_APISERVER_PORT",
        "RLSCHED_KCM_PORT",
        "RLSCHED_SCHEDULER_PORT",
        "RLSCHED_KWOK_PORT",
        "RLSCHED_PROMETHEUS_PORT",
    ):
        env.pop(var, None)  # let the script pick free ports: other clusters may run on this machine
    c = Cluster(state_dir=state, kubeconfig=state / "kubeconfig", env=dict(env, KUBECONFIG=str(state / "kubeconfig")))
    if not reuse:
        prometheus = [] if want_prometheus() else ["--no-prometheus"]
        done = subprocess.run(
            [str(SCRIPT), "up", *prometheus, "--fake-nodes", str(FAKE_NODES)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, timeout=120)
            pytest.fail(f"hack/local-cluster.sh up failed:\n{done.stderr[-4000:]}")
    try:
        yield c
    finally:
        if not reuse:
            subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, timeout=180)
            shutil.rmtree(state, ignore_errors=True)
