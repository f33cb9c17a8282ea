"""Our kube-scheduler: its configuration pointed at the local cluster, the lease grant a second scheduler
needs, and the process (health, metrics, Go CPU profiles)."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import yaml

from .cluster import LocalCluster
from .common import LEASE_NAME, LEASE_NAMESPACE, SCHEDULER_NAME, free_port, http_get
from .process import Proc


def rl_scheduler_config(
    cluster: LocalCluster,
    extender_url: str | None,
    *,
    scheduler_name: str = SCHEDULER_NAME,
    leader_elect: bool = True,
    lease_name: str = LEASE_NAME,
    qps: float | None = None,
    burst: int | None = None,
    default_profile: bool = False,
    tls: Any = None,
    percentage_of_nodes_to_score: int = 0,
) -> dict[str, Any]:
    """Our KubeSchedulerConfiguration (``rlsched.extender.scheduler_config``) pointed at this cluster.

    ``extender_url`` None drops the extender (the benchmark's baseline); ``default_profile`` replaces our
    profile by a stock one (every plugin, default percentageOfNodesToScore) under ``scheduler_name``.
    ``qps``/``burst`` set ``clientConnection`` (kube-scheduler's defaults are 50/100);
    ``percentage_of_nodes_to_score`` as in ``scheduler_config``. ``tls``: a
    :class:`rlsched.extender.scheduler_config.ClientTls` — call the extender over mutual TLS (https URL).
    """
    from rlsched.extender.scheduler_config import scheduler_config

    conf = scheduler_config(
        url=extender_url or "http://127.0.0.1:1",
        scheduler_name=scheduler_name,
        lease_name=lease_name,
        leader_elect=leader_elect,
        tls=tls,
        kubeconfig=str(cluster.state_dir / "kubeconfigs" / "kube-scheduler.kubeconfig"),
        percentage_of_nodes_to_score=percentage_of_nodes_to_score,
    )
    if extender_url is None:
        del conf["extenders"]
    if default_profile:
        conf["profiles"] = [{"schedulerName": scheduler_name}]
        conf.pop("percentageOfNodesToScore", None)
    if qps is not None:
        conf["clientConnection"]["qps"] = qps
    if burst is not None:
        conf["clientConnection"]["burst"] = burst
    return conf


def lease_rbac(
    lease: str = LEASE_NAME, namespace: str = LEASE_NAMESPACE, user: str = "system:kube-scheduler"
) -> list[dict]:
    """The grant a second scheduler needs for its own lease (the built-in ``system:kube-scheduler``
    role may only get/update the lease named ``kube-scheduler``; create is already allowed)."""
    name = f"{lease}-leader-election"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [lease],
                    "verbs": ["get", "update"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]


class KubeScheduler(Proc):
    """A kube-scheduler of our own next to the cluster's (which keeps ``default-scheduler``)."""

    def __init__(self, cluster: LocalCluster, name: str = "rl-kube-scheduler"):
        super().__init__(cluster, name)
        self.port: int | None = None
        self.config: dict[str, Any] | None = None

    def start_with(
        self,
        config: Mapping[str, Any],
        port: int | None = None,
        verbosity: int = 2,
        timeout: float = 120,
        profiling: bool = False,
    ) -> None:
        """``profiling``: also serve ``/debug/pprof/*`` without authorization (loopback only), for
        :meth:`cpu_profile`."""
        c = self.cluster
        c.stack_dir.mkdir(parents=True, exist_ok=True)
        path = c.stack_dir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        if config.get("leaderElection", {}).get("leaderElect"):
            le = config["leaderElection"]
            c.apply(lease_rbac(le.get("resourceName", LEASE_NAME), le.get("resourceNamespace", LEASE_NAMESPACE)))
        self.port = port or free_port()
        self.require_free_ports(self.port)
        self.config = dict(config)
        kc = c.state_dir / "kubeconfigs" / "kube-scheduler.kubeconfig"
        self.start(
            [
                str(c.tools_bin / "kube-scheduler"),
                "--config",
                str(path),
                "--authentication-kubeconfig",
                str(kc),
                "--authorization-kubeconfig",
                str(kc),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(self.port),
                "--tls-cert-file",
                str(c.pki / "kube-scheduler-serving.crt"),
                "--tls-private-key-file",
                str(c.pki / "kube-scheduler-serving.key"),
                "--authorization-always-allow-paths",
                "/healthz,/readyz,/livez,/metrics" + (",/debug/pprof/*" if profiling else ""),
                f"--v={verbosity}",
            ]
        )
        ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
        self.wait_ready(
            lambda: http_get(f"https://127.0.0.1:{self.port}/healthz", context=ctx)[0] == 200, timeout, "/healthz"
        )

    def metrics(self) -> str:
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        status, body = http_get(f"https://127.0.0.1:{self.port}/metrics", timeout=10, context=ctx)
        if status != 200:
            raise RuntimeError(f"{self.name} /metrics: HTTP {status}")
        return body.decode()

    def cpu_profile(self, seconds: float) -> bytes:
        """A Go CPU profile (pprof format) over the next ``seconds``; needs ``start_with(profiling=True)``."""
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        url = f"https://127.0.0.1:{self.port}/debug/pprof/profile?seconds={seconds:g}"
        status, body = http_get(url, timeout=seconds + 30, context=ctx)
        if status != 200:
            raise RuntimeError(f"{self.name} {url}: HTTP {status}")
        return body
