"""The local cluster: the state folder ``hack/local-cluster.sh up`` leaves (ports, PKI, kubeconfig, pid
files, logs) and kubectl against it."""

from __future__ import annotations

import os
import ssl
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .common import REPO_ROOT, TOOLS_BIN, recorded_process_alive


@dataclass
class LocalCluster:
    """A cluster started by ``hack/local-cluster.sh up`` (its state folder)."""

    state_dir: Path
    tools_bin: Path = TOOLS_BIN

    @classmethod
    def from_env(cls, state_dir: str | Path | None = None) -> LocalCluster:
        state = Path(state_dir or os.environ.get("RLSCHED_CLUSTER_DIR") or REPO_ROOT / ".cache" / "cluster")
        return cls(state.resolve())

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def stack_dir(self) -> Path:
        """Files of this module's processes (configs, policy folder, decision log)."""
        return self.state_dir / "rlstack"

    def ports(self) -> dict[str, int]:
        path = self.state_dir / "ports.env"
        if not path.exists():
            raise RuntimeError(f"no cluster state in {self.state_dir}: run hack/local-cluster.sh up")
        out = {}
        for line in path.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = int(v)
        return out

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports()['APISERVER_PORT']}"

    @property
    def prometheus_url(self) -> str | None:
        """The cluster's Prometheus if it runs (``up`` without ``--no-prometheus``; its pid file names a live
        Prometheus, not only exists)."""
        if not recorded_process_alive(self.run_dir, "prometheus"):
            return None
        return f"http://127.0.0.1:{self.ports()['PROMETHEUS_PORT']}"

    @property
    def prometheus_targets_dir(self) -> Path:
        return self.state_dir / "prometheus" / "targets"

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            RLSCHED_CLUSTER_DIR=str(self.state_dir),
            PATH=f"{self.tools_bin}:{os.environ.get('PATH', '')}",
        )

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(self.tools_bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def apply(self, objects: Iterable[Mapping[str, Any]], server_side: bool = False) -> None:
        docs = list(objects)
        if not docs:
            return
        args = ["apply", "-f", "-"] + (["--server-side", "--force-conflicts"] if server_side else [])
        self.kubectl(*args, input=yaml.safe_dump_all(docs), timeout=600)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS to the API server as the admin user (client certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx
