"""``rlsched operator``: run the kopf operator (SchedulingPolicy rollout, requeue, decision log).

Settings: defaults ← ``--config FILE`` (YAML, camelCase keys of
:class:`~rlsched.operator.settings.OperatorSettings`) ← flags. SIGTERM/SIGINT stop it gracefully:
kopf finishes the handlers in flight, the background tasks stop, a last drain of the extender's
decisions is written and the log is fsync'd. Exit codes: 0 clean shutdown, 1 the operator failed,
2 bad configuration.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML settings file (keys: docs/operator.md)")
    g = parser.add_argument_group("kubernetes")
    g.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
    g.add_argument("--context", help="kubeconfig context")
    g.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; kopf glob patterns allowed); default: the whole cluster",
    )
    g.add_argument(
        "--peering", metavar="NAME", help="coordinate replicas through this KopfPeering (default: standalone)"
    )
    g.add_argument("--priority", type=int, help="peering priority of this replica")
    g.add_argument("--scheduler-name", help="spec.schedulerName of the pods to requeue and log (default rl-scheduler)")
    g.add_argument("--install-crds", action="store_true", default=None, help="apply the CRDs at start (local runs)")
    g = parser.add_argument_group("policy and rollout")
    g.add_argument("--policy", metavar="NAMESPACE/NAME", help="the SchedulingPolicy to serve (default default/default)")
    g.add_argument("--sink", choices=("configmap", "directory"), help="where to publish (default configmap)")
    g.add_argument("--sink-namespace", help="namespace of the policy ConfigMap (default default)")
    g.add_argument("--configmap", help="name of the policy ConfigMap the scheduler pod mounts (default rlsched-policy)")
    g.add_argument("--directory", help="folder the extender reads (--sink directory)")
    g.add_argument("--mount-path", help="where the extender sees the published files (default /etc/rlsched/policy)")
    g.add_argument("--extender-url", help="the extender's status port (default http://127.0.0.1:8889)")
    g.add_argument(
        "--extender-ca-file",
        help="CA bundle that verifies the extender's status certificate with an https:// --extender-url "
        "(default: the system's trust store)",
    )
    g.add_argument(
        "--extender-token-file",
        help="bearer token for the extender's /status and /decisions, re-read "
        "when it changes (default: the in-cluster ServiceAccount token)",
    )
    g.add_argument(
        "--rollout-timeout", type=float, help="seconds to wait for the extender to load a model (default 120)"
    )
    g.add_argument("--status-interval", type=float, help="seconds between status.counts refreshes (default 30)")
    g = parser.add_argument_group("requeue of delayed pods")
    g.add_argument("--no-requeue", action="store_true", help="leave delayed pods to kube-scheduler's 5-minute flush")
    g.add_argument("--requeue-initial", type=float, help="first requeue delay, seconds (default 5)")
    g.add_argument("--requeue-max", type=float, help="backoff cap, seconds (default 120)")
    g.add_argument("--requeue-attempts", type=int, help="requeues per pod before giving up (default 10)")
    g = parser.add_argument_group("decision log")
    g.add_argument("--decision-log", metavar="DIR", help="folder of the decision dataset (default: no log)")
    g.add_argument("--segment-bytes", type=int, help="segment size before rotation (default 16 MiB)")
    g.add_argument("--max-bytes", type=int, help="total size bound; oldest segments deleted (default 512 MiB)")
    g.add_argument("--drain-interval", type=float, help="seconds between drains of the extender's ring (default 2)")
    g.add_argument("--prometheus-url", help="Prometheus for the node load in outcomes (default: none)")
    g = parser.add_argument_group("output")
    g.add_argument("--liveness", metavar="URL", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    g.add_argument("--metrics", metavar="HOST:PORT", help="Prometheus /metrics listener, e.g. 0.0.0.0:9102")
    g.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    g.add_argument("--print-settings", action="store_true", help="print the effective settings as YAML and exit")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    ns, name = None, None
    if args.policy:
        ns, _, name = args.policy.rpartition("/")
        ns = ns or None
    return {
        "kubernetes.kubeconfig": args.kubeconfig,
        "kubernetes.context": args.context,
        "scope.namespaces": args.namespaces,
        "scope.peering": args.peering,
        "scope.priority": args.priority,
        "scope.schedulerName": args.scheduler_name,
        "installCrds": args.install_crds,
        "policy.namespace": ns,
        "policy.name": name,
        "sink.kind": args.sink,
        "sink.namespace": args.sink_namespace,
        "sink.configmap": args.configmap,
        "sink.directory": args.directory,
        "sink.mountPath": args.mount_path,
        "extender.statusUrl": args.extender_url,
        "extender.caFile": args.extender_ca_file,
        "extender.tokenFile": args.extender_token_file,
        "extender.rolloutTimeoutS": args.rollout_timeout,
        "extender.statusIntervalS": args.status_interval,
        "requeue.enabled": False if args.no_requeue else None,
        "requeue.initialS": args.requeue_initial,
        "requeue.maxS": args.requeue_max,
        "requeue.maxAttempts": args.requeue_attempts,
        "decisionLog.path": args.decision_log,
        "decisionLog.segmentBytes": args.segment_bytes,
        "decisionLog.maxBytes": args.max_bytes,
        "decisionLog.drainIntervalS": args.drain_interval,
        "decisionLog.prometheusUrl": args.prometheus_url,
        "livenessEndpoint": args.liveness,
        "metricsEndpoint": args.metrics,
        "logLevel": args.log_level,
    }


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from rlsched.extender.settings import settings_yaml

    from .settings import SettingsError, load_settings

    try:
        settings = load_settings(args.config, _overrides(args))
    except SettingsError as exc:
        print(f"rlsched operator: {exc}", file=sys.stderr)
        return 2
    if args.print_settings:
        print(settings_yaml(settings), end="")
        return 0

    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    import kopf

    from .handlers import build_registry
    from .kube import Kube, load_configuration

    try:
        kube = Kube(
            load_configuration(settings.kubernetes.kubeconfig, settings.kubernetes.context),
            settings.kubernetes.request_timeout_s,
        )
    except (ValueError, OSError) as exc:
        print(f"rlsched operator: {exc}", file=sys.stderr)
        return 2
    scope = settings.scope
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(settings),
                memo=kopf.Memo(settings=settings, kube=kube),
                standalone=scope.peering is None,
                peering_name=scope.peering,
                priority=scope.priority,
                clusterwide=not scope.namespaces,
                namespaces=list(scope.namespaces),
                liveness_endpoint=settings.liveness_endpoint,
            )
        )
    except KeyboardInterrupt:  # pragma: no cover - kopf handles SIGINT itself
        pass
    except Exception as exc:  # noqa: BLE001 - report and exit non-zero
        logging.getLogger("rlsched.operator").exception("operator failed: %s", exc)
        return 1
    finally:
        kube.close()
    return 0
