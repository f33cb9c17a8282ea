#!/usr/bin/env python3
"""The rl-scheduler stack as local processes on a ``hack/local-cluster.sh`` cluster.

``hack/local-cluster.sh`` runs the control plane (etcd, kube-apiserver, kube-controller-manager,
kwok, the default kube-scheduler, Prometheus). This module adds what a Helm install would add, as
plain processes on loopback, each with pid files (the pid and its start time) in ``<state>/run/`` and a
log in ``<state>/logs/`` (so that ``down`` — or anyone reading the pid files — can stop exactly what was
started, and never a process that got the pid later):

- ``rl-kube-scheduler``: a **second** kube-scheduler (same binary) with the configuration rendered
  by :func:`rlsched.extender.scheduler_config.scheduler_config` — profile ``rl-scheduler``, our
  extender on loopback, leader election on its own lease ``kube-system/rl-scheduler`` (the RBAC grant
  the chart makes is applied here too). The cluster's own kube-scheduler keeps serving
  ``default-scheduler``: kube-scheduler's ``extenders:`` apply to every profile of a process, so the
  two profiles cannot share one process without the default one calling our extender too.
- ``rlsched-extender``: ``rlsched extender`` serving the model the chart serves when it is installed
  (:data:`rlsched.policy.learned.SERVED_MODEL`), the FGD fallback otherwise. Its /status and
  /decisions need a bearer token (``auth.mode: kubernetes``, the extender's default); it runs with
  the admin kubeconfig (group system:masters), which may create the TokenReviews and
  SubjectAccessReviews that checking takes (in a cluster: the ClusterRole system:auth-delegator).
- ``rlsched-operator`` (optional): ``rlsched operator`` publishing a SchedulingPolicy into a folder the
  extender reads, sending the token of the ServiceAccount ``kube-system/rlsched-operator``.

Who reads the status listener: the ServiceAccounts :data:`STACK_IDENTITY` (this module's
``Extender.status()``/``decisions()``, the demo) and :data:`OPERATOR_IDENTITY`, bound to the ClusterRole
:data:`READER_ROLE` (``get`` on the non-resource URLs /status, /decisions, /metrics); their tokens come
from the TokenRequest API (``kubectl create token``) into ``<state>/rlstack/tokens/`` (:func:`service_account_token`).
- ``rlsched-load-exporter`` (optional): ``hack/load_exporter.py``, node-exporter series per kwok node,
  registered with the cluster's Prometheus, which the extender queries.

Used by ``hack/demo.sh``, ``tests/e2e/test_extender_*.py``, ``benchmarks/scheduler_throughput.py`` and
``hack/replay_openb.py``; also a CLI::

    hack/rlstack.py up [--operator] [--load-exporter] [--model PATH|auto|none]   # on a running cluster
    hack/rlstack.py status
    hack/rlstack.py down

The parts live in ``hack/stacklib/``, one concern per module (the cluster's state folder, processes,
identities, kube-scheduler, our services, certificates, objects, the API client); this module puts
them together as :class:`Stack` and re-exports them, so callers import only ``rlstack``. Among them,
the object builders every caller shares: :func:`kwok_node` (a fake node with cpu, memory,
``nvidia.com/gpu`` and a card model) and :func:`pod_manifest` (a pod asking whole cards, a share or a
model in the conventions of docs/gpu-sharing.md), and a small asyncio client of the API server
(:class:`Api`) for bulk creation and watches.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# hack/ on the import path for stacklib/: callers load this file by path (importlib) or run it as a script
# with PYTHONSAFEPATH=1, which leaves the script's folder off sys.path.
_HACK = str(Path(__file__).resolve().parent)
if _HACK not in sys.path:
    sys.path.insert(0, _HACK)

from stacklib.api import (  # noqa: E402
    NOT_READY_TAINTS,
    Api,
    ApiError,
    create_nodes,
    delete_nodes,
    ensure_namespace,
)
from stacklib.cluster import LocalCluster  # noqa: E402
from stacklib.common import (  # noqa: E402
    LEASE_NAME,
    LEASE_NAMESPACE,
    LOCAL_RATE_WINDOW_S,
    REPO_ROOT,
    SCHEDULER_NAME,
    TOOLS_BIN,
    bundled_model,
    free_port,
    http_get,
    local_load_queries,
    log,
    wait_for,
)
from stacklib.identity import (  # noqa: E402
    EXTENDER_AUDIENCE,
    IDENTITY_NAMESPACE,
    OPERATOR_IDENTITY,
    READER_ROLE,
    STACK_IDENTITY,
    TOKEN_DURATION,
    reader_rbac,
    service_account_token,
)
from stacklib.objects import (  # noqa: E402
    CARD_MILLI_ANNOTATION,
    CARDS_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MILLI_RESOURCE,
    GPU_MODEL_LABEL,
    GPU_MODELS_ANNOTATION,
    GPU_NODE_ANNOTATION,
    GPU_RESOURCE,
    card_assignment,
    k8s_name,
    kwok_node,
    pod_from_spec,
    pod_manifest,
)
from stacklib.pki import tls_pki  # noqa: E402
from stacklib.process import Proc  # noqa: E402
from stacklib.scheduler import KubeScheduler, lease_rbac, rl_scheduler_config  # noqa: E402
from stacklib.services import (  # noqa: E402
    Extender,
    LoadExporter,
    Operator,
    StatusHttpError,
    describe_policy,
    prometheus_query,
)

__all__ = [
    "CARDS_ANNOTATION",
    "CARD_MILLI_ANNOTATION",
    "EXTENDER_AUDIENCE",
    "GPU_MILLI_ANNOTATION",
    "GPU_MILLI_RESOURCE",
    "GPU_MODELS_ANNOTATION",
    "GPU_MODEL_LABEL",
    "GPU_NODE_ANNOTATION",
    "GPU_RESOURCE",
    "IDENTITY_NAMESPACE",
    "LEASE_NAME",
    "LEASE_NAMESPACE",
    "LOCAL_RATE_WINDOW_S",
    "NOT_READY_TAINTS",
    "OPERATOR_IDENTITY",
    "READER_ROLE",
    "REPO_ROOT",
    "SCHEDULER_NAME",
    "STACK_IDENTITY",
    "TOKEN_DURATION",
    "TOOLS_BIN",
    "Api",
    "ApiError",
    "Extender",
    "KubeScheduler",
    "LoadExporter",
    "LocalCluster",
    "Operator",
    "Proc",
    "Stack",
    "StatusHttpError",
    "bundled_model",
    "card_assignment",
    "create_nodes",
    "delete_nodes",
    "describe_policy",
    "ensure_namespace",
    "free_port",
    "http_get",
    "k8s_name",
    "kwok_node",
    "lease_rbac",
    "local_load_queries",
    "log",
    "main",
    "pod_from_spec",
    "pod_manifest",
    "prometheus_query",
    "reader_rbac",
    "rl_scheduler_config",
    "service_account_token",
    "tls_pki",
    "wait_for",
]


# -- the stack ---------------------------------------------------------------------------------------


_ATTR = {"statusPort": "status_port"}
"""stack.json key → attribute of the process object, where they differ."""


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples → lists, paths → strings): what ``stack.json`` compares."""
    return json.loads(json.dumps(value, default=str))


@dataclass
class Stack:
    """Extender + our kube-scheduler (+ operator, load exporter) on one local cluster."""

    cluster: LocalCluster
    extender: Extender = field(init=False)
    scheduler: KubeScheduler = field(init=False)
    operator: Operator = field(init=False)
    exporter: LoadExporter = field(init=False)
    info: dict[str, Any] = field(init=False, default_factory=dict)
    """``stack.json``: per process, its ports and the arguments it was started with."""

    def __post_init__(self) -> None:
        self.extender = Extender(self.cluster)
        self.scheduler = KubeScheduler(self.cluster)
        self.operator = Operator(self.cluster)
        self.exporter = LoadExporter(self.cluster)

    @property
    def info_path(self) -> Path:
        return self.cluster.stack_dir / "stack.json"

    def read_info(self) -> dict[str, Any]:
        """``stack.json`` as it is on disk ({} when missing or unreadable)."""
        try:
            info = json.loads(self.info_path.read_text())
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def _write_info(self) -> None:
        self.cluster.stack_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.info_path.with_name(f".{self.info_path.name}.tmp")
        tmp.write_text(json.dumps(self.info, indent=2, default=str))
        tmp.replace(self.info_path)  # a reader (or an interrupted writer) never leaves half a file

    def record(self, key: str, **fields: Any) -> None:
        """Write what ``key``'s process was started with (its ports, ``args``) into ``stack.json`` now —
        right after each start, so that an up cut short (an exception, Ctrl-C) leaves no running process
        whose ports nobody knows."""
        self.info[key] = _plain(fields)
        self._write_info()

    def save(self, **extra: Any) -> None:
        """``stack.json``: the ports of what runs (and ``extra`` top-level keys), keeping each
        component's recorded ``args``."""
        for key, ports in (
            ("extender", {"port": self.extender.port, "statusPort": self.extender.status_port}),
            ("scheduler", {"port": self.scheduler.port}),
            ("exporter", {"port": self.exporter.port}),
        ):
            self.info[key] = {**(self.info.get(key) or {}), **ports}
        self.info.update(_plain(extra))
        self._write_info()

    @classmethod
    def load(cls, cluster: LocalCluster) -> Stack:
        s = cls(cluster)
        info = s.read_info()
        s.info = info
        s.extender.port = (info.get("extender") or {}).get("port")
        s.extender.status_port = (info.get("extender") or {}).get("statusPort")
        token = cluster.stack_dir / "tokens" / f"{STACK_IDENTITY}.token"
        s.extender.token_path = token if token.exists() else None
        s.scheduler.port = (info.get("scheduler") or {}).get("port")
        s.exporter.port = (info.get("exporter") or {}).get("port")
        return s

    def _reuse(self, proc: Proc, key: str, args: Mapping[str, Any], ports: Sequence[str] = ()) -> bool:
        """True when ``proc`` runs and ``stack.json`` says it was started with ``args`` (its recorded
        ``ports`` are then set on it). A process that runs without such a record (an up killed before it
        could write it, a stack.json of an older version) or with other arguments is stopped, saying why;
        False then."""
        if not proc.alive():
            return False
        rec = self.info.get(key) or {}
        old = rec.get("args")
        unknown = [p for p in ports if not isinstance(rec.get(p), int)]
        if unknown or not isinstance(old, dict):
            what = ", ".join(unknown) if unknown else "arguments"
            why = f"runs, but {self.info_path} does not record its {what} (an up cut short?)"
        elif old != _plain(args):
            changed = sorted(k for k in set(old) | set(args) if old.get(k) != _plain(args).get(k))
            why = f"runs with other arguments ({', '.join(changed)})"
        else:
            for p in ports:
                setattr(proc, _ATTR.get(p, p), rec[p])
            return True
        log(f"{proc.name} (pid {proc.pid}) {why}: restarting it")
        proc.stop()
        return False

    def up(
        self,
        model: str | Path | None = "auto",
        operator_namespace: str | None = None,
        load_exporter: bool = False,
        exporter_selector: str | None = None,
        leader_elect: bool = True,
        extender_settings: Mapping[str, Any] | None = None,
        scheduler_qps: float | None = None,
        scheduler_burst: int | None = None,
    ) -> None:
        """Start what is not running yet: load exporter, extender, operator, our kube-scheduler.

        What runs already is kept when ``stack.json`` records that it was started with the same
        arguments, and restarted otherwise (``--model``, ``--explain-load``, another operator namespace
        …). Each start is recorded in ``stack.json`` at once. The reader tokens of what is kept are
        renewed (they expire: :func:`service_account_token`)."""
        c = self.cluster
        c.stack_dir.mkdir(parents=True, exist_ok=True)
        self.info = self.read_info()  # what the running processes were started with
        if model == "auto":
            model = bundled_model()
        prom = c.prometheus_url

        if load_exporter:
            exporter_args = _plain({"nodeSelector": exporter_selector, "prometheus": prom is not None})
            if not self._reuse(self.exporter, "exporter", exporter_args, ports=("port",)):
                try:
                    self.exporter.start_with(node_selector=exporter_selector)
                finally:
                    self.record("exporter", port=self.exporter.port, args=exporter_args)
                log(
                    f"load exporter: pid {self.exporter.pid}, {self.exporter.url}"
                    + (f", registered in {c.prometheus_targets_dir}" if prom else " (no Prometheus: not registered)")
                )
        elif self.exporter.alive():
            self.exporter.port = (self.info.get("exporter") or {}).get("port")

        if operator_namespace is None and self.operator.alive():
            # up without --operator keeps a running operator's namespace (and the extender reading its
            # policy file); the operator is restarted only if its extender or Prometheus URL changed.
            operator_namespace = ((self.info.get("operator") or {}).get("args") or {}).get("namespace")
            if operator_namespace:
                log(f"{self.operator.name}: runs (namespace {operator_namespace}); its namespace is kept")
        policy_dir = c.stack_dir / "policy"
        policy_file = None
        if operator_namespace:
            policy_dir.mkdir(parents=True, exist_ok=True)
            policy_file = policy_dir / "policy.yaml"
            if not policy_file.exists():
                policy_file.write_text("{}\n")

        settings: dict[str, Any] = {"policyPollS": 1.0}
        if prom:
            settings["prometheus"] = {"intervalS": 5.0, "queries": local_load_queries()}
        settings.update(extender_settings or {})
        extender_args = _plain(  # a copy, as it is before the start
            {
                "model": str(model) if model else None,
                "policyFile": str(policy_file) if policy_file else None,
                "prometheusUrl": prom,
                "settings": settings,
            }
        )
        if self._reuse(self.extender, "extender", extender_args, ports=("port", "statusPort")):
            self.extender.token_path = service_account_token(c, STACK_IDENTITY)  # renewed: tokens expire
        else:
            rec = self.info.get("extender") or {}
            # The ports it had (the scheduler's configuration names them), else new ones.
            self.extender.port = self.extender.port or rec.get("port")
            self.extender.status_port = self.extender.status_port or rec.get("statusPort")
            try:
                self.extender.start_with(model=model, policy_file=policy_file, prometheus_url=prom, settings=settings)
            finally:
                self.record(
                    "extender", port=self.extender.port, statusPort=self.extender.status_port, args=extender_args
                )
            log(f"extender: pid {self.extender.pid}, verbs {self.extender.url}, status {self.extender.status_url}")

        if operator_namespace:
            operator_args = _plain(
                {
                    "namespace": operator_namespace,
                    "extenderStatusUrl": self.extender.status_url,
                    "policyDir": str(policy_dir),
                    "prometheusUrl": prom,
                }
            )
            if self._reuse(self.operator, "operator", operator_args):
                # renewed; the operator reads the file again
                service_account_token(c, OPERATOR_IDENTITY, audience=EXTENDER_AUDIENCE)
            else:
                ensure_namespace(c, operator_namespace)
                try:
                    self.operator.start_with(
                        operator_namespace,
                        self.extender.status_url,
                        policy_dir,
                        decision_log=c.stack_dir / "decisions",
                        prometheus_url=prom,
                    )
                finally:
                    self.record("operator", args=operator_args)
                log(f"operator: pid {self.operator.pid}, watching namespace {operator_namespace}")

        conf = rl_scheduler_config(
            c, self.extender.url, leader_elect=leader_elect, qps=scheduler_qps, burst=scheduler_burst
        )
        scheduler_args = _plain({"config": conf})
        if not self._reuse(self.scheduler, "scheduler", scheduler_args, ports=("port",)):
            try:
                self.scheduler.start_with(conf)
            finally:
                self.record("scheduler", port=self.scheduler.port, args=scheduler_args)
            log(
                f"kube-scheduler (profile {SCHEDULER_NAME}, lease {LEASE_NAMESPACE}/{LEASE_NAME}): "
                f"pid {self.scheduler.pid}, "
                f"https://127.0.0.1:{self.scheduler.port}"
            )
        self.save(model=str(model) if model else None, operatorNamespace=operator_namespace)

    def down(self) -> None:
        for p in (self.scheduler, self.operator, self.extender, self.exporter):
            if p.alive():
                p.stop()
                log(f"{p.name}: stopped")
            else:
                p.stop()  # clears stale pid files
        self.info_path.unlink(missing_ok=True)
        self.info = {}

    def status_lines(self) -> list[str]:
        lines = []
        for p in (self.scheduler, self.extender, self.operator, self.exporter):
            lines.append(f"{p.name:24s} {'running' if p.alive() else 'stopped':8s} {p.pid or '-':>8} {p.log_path}")
        if self.extender.alive():
            try:
                lines.append(f"policy: {describe_policy(self.extender.status())}")
            except Exception as exc:  # noqa: BLE001
                lines.append(f"policy: /status unavailable ({exc})")
        return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/rlstack.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster-dir", help="local-cluster state folder (default $RLSCHED_CLUSTER_DIR or .cache/cluster)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser(
        "up",
        help="start the extender, our kube-scheduler (and operator, load exporter); restart what runs with other "
        "arguments; renew the reader tokens",
    )
    up.add_argument("--model", default="auto", help="model file, 'auto' (the bundled one if installed) or 'none'")
    up.add_argument("--operator", metavar="NAMESPACE", help="run the operator serving NAMESPACE/default")
    up.add_argument(
        "--load-exporter", action="store_true", help="run hack/load_exporter.py and register it with Prometheus"
    )
    up.add_argument("--exporter-selector", help="label selector of the nodes the exporter covers")
    up.add_argument("--no-leader-elect", action="store_true", help="no lease (one replica)")
    up.add_argument(
        "--explain-load",
        action="store_true",
        help="the extender's explainLoad: record, per decision, the node it picks with load unknown",
    )
    sub.add_parser("down", help="stop what up started")
    sub.add_parser("status", help="what runs")
    args = ap.parse_args(argv)
    cluster = LocalCluster.from_env(args.cluster_dir)
    if args.cmd == "up":
        cluster.ports()  # fails with a clear message without a cluster
        stack = Stack.load(cluster)
        model = None if args.model == "none" else args.model
        stack.up(
            model=model,
            operator_namespace=args.operator,
            load_exporter=args.load_exporter,
            exporter_selector=args.exporter_selector,
            leader_elect=not args.no_leader_elect,
            extender_settings={"explainLoad": True} if args.explain_load else None,
        )
        print("\n".join(stack.status_lines()))
    elif args.cmd == "down":
        Stack.load(cluster).down()
    else:
        print("\n".join(Stack.load(cluster).status_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
