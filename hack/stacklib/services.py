"""The stack's own processes besides kube-scheduler: ``rlsched extender``, ``rlsched operator`` and the
load exporter (``hack/load_exporter.py``), plus a Prometheus query."""

from __future__ import annotations

import copy
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster
from .common import REPO_ROOT, free_port, http_get
from .identity import EXTENDER_AUDIENCE, OPERATOR_IDENTITY, STACK_IDENTITY, service_account_token
from .process import Proc


class StatusHttpError(RuntimeError):
    """The extender's status listener answered with an HTTP error (``code``: 401 when it refused the
    token, 403 when the token's ServiceAccount may not read the path)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class Extender(Proc):
    """``rlsched extender`` against this cluster (admin credentials), verbs and status on loopback.
    Reads of /status, /decisions and /metrics carry the token of :data:`STACK_IDENTITY`."""

    def __init__(self, cluster: LocalCluster, name: str = "rlsched-extender"):
        super().__init__(cluster, name)
        self.port: int | None = None
        self.status_port: int | None = None
        self.token_path: Path | None = None

    @property
    def token(self) -> str | None:
        """The reader token (None before :meth:`start_with` has made one)."""
        try:
            return self.token_path.read_text().strip() if self.token_path else None
        except OSError:
            return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.status_port}"

    def start_with(
        self,
        port: int | None = None,
        status_port: int | None = None,
        model: str | Path | None = None,
        policy_file: str | Path | None = None,
        prometheus_url: str | None = None,
        settings: Mapping[str, Any] | None = None,
        extra: Sequence[str] = (),
        timeout: float = 120,
    ) -> None:
        """Start and wait for /readyz. ``settings``: extender config-file keys (camelCase, nested)."""
        c = self.cluster
        c.stack_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or self.port or free_port()
        self.status_port = status_port or self.status_port or free_port()
        # The operator's token is made for EXTENDER_AUDIENCE (as in the chart); the harness's own reads
        # and Prometheus' still use tokens of the API server's audience.
        conf: dict[str, Any] = {"log": {"format": "json"}, "auth": {"audiences": [EXTENDER_AUDIENCE]}}
        for key, value in copy.deepcopy(dict(settings or {})).items():  # the caller's settings stay as they are
            if isinstance(value, Mapping) and isinstance(conf.get(key), dict):
                conf[key].update(value)
            else:
                conf[key] = value
        if prometheus_url:
            conf.setdefault("prometheus", {})["url"] = prometheus_url
        cfg = c.stack_dir / f"{self.name}.yaml"
        cfg.write_text(yaml.safe_dump(conf, sort_keys=False))
        self.token_path = service_account_token(c, STACK_IDENTITY)
        # RLSCHED_STACK_EXTENDER_LAUNCHER: another command instead of `python -m rlsched.cli` (experiments
        # with a patched extender that must not touch the working tree).
        launcher = os.environ.get("RLSCHED_STACK_EXTENDER_LAUNCHER", "").split() or [
            sys.executable,
            "-m",
            "rlsched.cli",
        ]
        argv = [
            *launcher,
            "extender",
            "--config",
            str(cfg),
            "--kubeconfig",
            str(c.kubeconfig),
            "--port",
            str(self.port),
            "--status-port",
            str(self.status_port),
            "--status-host",
            "127.0.0.1",
        ]
        if model:
            argv += ["--model", str(model), "--no-strict-model"]
        if policy_file:
            argv += ["--policy-file", str(policy_file)]
        argv += list(extra)
        # The extender reads RLSCHED_* from its environment: keep the caller's out of it (a shell
        # with `eval "$(hack/local-cluster.sh env)"` exports RLSCHED_PROMETHEUS_URL, for instance).
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_")}
        # The ports may be the ones stack.json recorded (or the caller's): taken by another process, its
        # /readyz would answer for an extender that cannot bind.
        self.require_free_ports(self.port, self.status_port)
        self.start(argv, env=env, cwd=REPO_ROOT)
        self.wait_ready(self._ready, timeout, "/readyz")

    def _ready(self) -> bool:
        return http_get(f"{self.status_url}/readyz")[0] == 200

    def restart(self, timeout: float = 120) -> None:
        """Start again with the same command line and ports (after :meth:`kill` or :meth:`stop`)."""
        if self.argv is None:
            raise RuntimeError(f"{self.name}: not started by this process")
        self.require_free_ports(self.port, self.status_port)
        self.start(self.argv, env=self.env, cwd=REPO_ROOT)
        self.wait_ready(self._ready, timeout, "/readyz")

    def status(self) -> dict[str, Any]:
        code, body = http_get(f"{self.status_url}/status", token=self.token)
        if code != 200:
            raise StatusHttpError(f"{self.name} /status: HTTP {code}: {body[:300]!r}", code)
        return json.loads(body)

    def decisions(self, after: int = 0, limit: int = 4096) -> dict[str, Any]:
        code, body = http_get(f"{self.status_url}/decisions?after={after}&limit={limit}", timeout=10, token=self.token)
        if code != 200:
            raise StatusHttpError(f"{self.name} /decisions: HTTP {code}: {body[:300]!r}", code)
        return json.loads(body)

    def metrics(self) -> str:
        return http_get(f"{self.status_url}/metrics", token=self.token)[1].decode()


def describe_policy(status: Mapping[str, Any]) -> str:
    """One line saying which policy serves, from the extender's /status."""
    p = status.get("policy", {})
    model = p.get("model") or {}
    if model.get("loaded") and p.get("mode") == "active":
        return (
            f"learned model {model.get('version')} ({model.get('path')}, sha256 {str(model.get('digest'))[:12]}…), "
            f"mode active, fallback {p.get('fallback')}"
        )
    why = (
        "no model configured"
        if not model.get("path")
        else f"model {model.get('path')} not loaded: {model.get('error')}"
    )
    if model.get("loaded"):
        why = f"model {model.get('version')} loaded but mode {p.get('mode')}"
    return f"heuristic {p.get('fallback')} (fallback: {why})"


class Operator(Proc):
    """``rlsched operator`` publishing into a folder the extender reads (``--sink directory``)."""

    def __init__(self, cluster: LocalCluster, name: str = "rlsched-operator"):
        super().__init__(cluster, name)

    def start_with(
        self,
        namespace: str,
        extender_status_url: str,
        policy_dir: Path,
        decision_log: Path | None = None,
        prometheus_url: str | None = None,
        extra: Sequence[str] = (),
        timeout: float = 120,
    ) -> None:
        policy_dir.mkdir(parents=True, exist_ok=True)
        start_len = self.log_path.stat().st_size if self.log_path.exists() else 0
        token = service_account_token(self.cluster, OPERATOR_IDENTITY, audience=EXTENDER_AUDIENCE)
        argv = [
            sys.executable,
            "-m",
            "rlsched.cli",
            "operator",
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--install-crds",
            "--namespace",
            namespace,
            "--policy",
            f"{namespace}/default",
            "--sink",
            "directory",
            "--directory",
            str(policy_dir),
            "--extender-url",
            extender_status_url,
            "--extender-token-file",
            str(token),
            "--status-interval",
            "5",
        ]
        if decision_log:
            argv += ["--decision-log", str(decision_log)]
        if prometheus_url:
            argv += ["--prometheus-url", prometheus_url]
        argv += list(extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_")}
        self.start(argv, env=env, cwd=REPO_ROOT)

        def started() -> bool:
            with open(self.log_path, "rb") as f:
                f.seek(start_len)
                return b"operator started" in f.read()

        self.wait_ready(started, timeout, "to start")


class LoadExporter(Proc):
    """``hack/load_exporter.py``: node-exporter series for the cluster's nodes, registered with Prometheus."""

    def __init__(self, cluster: LocalCluster, name: str = "rlsched-load-exporter"):
        super().__init__(cluster, name)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_with(
        self,
        port: int | None = None,
        node_selector: str | None = None,
        refresh_s: float = 2.0,
        targets_dir: Path | None = None,
        timeout: float = 60,
        extra: Sequence[str] = (),
    ) -> None:
        """Start and wait for /healthz. ``extra``: more arguments (``--usage-annotations``)."""
        self.port = port or free_port()
        argv = [
            sys.executable,
            str(REPO_ROOT / "hack" / "load_exporter.py"),
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--port",
            str(self.port),
            "--refresh",
            str(refresh_s),
        ]
        tdir = targets_dir or (self.cluster.prometheus_targets_dir if self.cluster.prometheus_url else None)
        if tdir:
            argv += ["--targets-dir", str(tdir)]
        if node_selector:
            argv += ["--node-selector", node_selector]
        argv += list(extra)
        self.require_free_ports(self.port)
        self.start(argv, cwd=REPO_ROOT)
        self.wait_ready(lambda: http_get(f"{self.url}/healthz")[0] == 200, timeout, "/healthz")

    def loads(self) -> dict[str, dict[str, float]]:
        """node → the utilizations it publishes now (cpu, memory, network, disk: 0..1)."""
        return json.loads(http_get(f"{self.url}/loads")[1])

    def pin(self, node: str, **values: float) -> None:
        """Fix a node's utilizations (``cpu=0.8``) instead of the pod-driven model."""
        req = urllib.request.Request(
            f"{self.url}/loads/{node}",
            data=json.dumps(values).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()


def prometheus_query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    code, body = http_get(f"{url}/api/v1/query?{q}", timeout=10)
    if code != 200:
        raise RuntimeError(f"Prometheus {url}: HTTP {code}: {body[:200]!r}")
    return json.loads(body)["data"]["result"]
