"""``rlsched extender``: run the kube-scheduler extender.

Settings: defaults ← ``--config FILE`` (YAML) ← ``RLSCHED_*`` environment ← flags. Exit codes:
0 clean shutdown, 1 start-up failed (API server unreachable, port taken, …), 2 bad configuration
(unknown key, bad value, unloadable model or policy file).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (keys: docs/extender.md)")
    g = parser.add_argument_group("listeners")
    g.add_argument("--host", help="verb listener address (default 127.0.0.1: keep the verbs on loopback)")
    g.add_argument("--port", type=int, help="verb listener port (default 8888)")
    g.add_argument("--path-prefix", help="path the verbs hang under, e.g. /rlsched (default none)")
    g.add_argument("--status-host", help="status listener address (default 127.0.0.1; the chart sets 0.0.0.0)")
    g.add_argument(
        "--status-port",
        type=int,
        help="status listener port: /metrics /healthz /readyz /status /decisions (default 8889)",
    )
    g.add_argument(
        "--tls-cert-file",
        help="serve the verbs over HTTPS with this certificate (with --tls-key-file "
        "and --tls-client-ca-file: mutual TLS)",
    )
    g.add_argument("--tls-key-file", help="private key of --tls-cert-file")
    g.add_argument("--tls-client-ca-file", help="CA that must have signed the callers' client certificates")
    g.add_argument(
        "--status-tls-cert-file",
        help="serve the status listener over HTTPS with this certificate (with --status-tls-key-file; "
        "re-read when the file changes)",
    )
    g.add_argument("--status-tls-key-file", help="private key of --status-tls-cert-file")
    g = parser.add_argument_group("authentication (status listener)")
    g.add_argument(
        "--auth",
        choices=("kubernetes", "none"),
        help="kubernetes (default): /status and /decisions need a bearer token allowed by TokenReview + "
        "SubjectAccessReview; none: open (local development only)",
    )
    g.add_argument("--protect-metrics", action="store_true", default=None, help="/metrics needs a token too")
    g = parser.add_argument_group("kubernetes")
    g.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
    g.add_argument("--context", help="kubeconfig context")
    g.add_argument("--scheduler-name", help="the scheduler profile served (default rl-scheduler)")
    g = parser.add_argument_group("policy")
    g.add_argument("--policy-file", help="policy settings file, hot-reloaded (the operator's ConfigMap)")
    g.add_argument("--mode", choices=("active", "shadow", "off"), help="active | shadow | off (default active)")
    g.add_argument("--model", help="exported PPO model (.npz)")
    g.add_argument("--fallback", help="heuristic without a model or on failure (default fgd)")
    g.add_argument("--deadline-ms", type=float, help="per-request budget of the learned policy (default 100)")
    g.add_argument("--top-k", type=int, help="filter keeps the policy's top K nodes; 0 keeps all (default 1)")
    g.add_argument("--typical-pods", help="typical pods JSON for FGD (default: the model's, else built in)")
    g.add_argument(
        "--no-strict-model",
        action="store_true",
        help="start with the fallback when the model cannot be loaded (default: refuse to start)",
    )
    g = parser.add_argument_group("load")
    g.add_argument("--prometheus-url", help="Prometheus base URL for per-node load (default: none)")
    g = parser.add_argument_group("output")
    g.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    g.add_argument("--log-format", choices=("json", "text"), help="json (default) or text")
    g.add_argument(
        "--print-scheduler-config",
        action="store_true",
        help="print the recommended KubeSchedulerConfiguration for these settings and exit",
    )
    g.add_argument(
        "--client-cert-file",
        help="with --print-scheduler-config and mutual TLS: kube-scheduler's client "
        "certificate (the path kube-scheduler sees)",
    )
    g.add_argument("--client-key-file", help="with --print-scheduler-config and mutual TLS: its private key")
    g.add_argument(
        "--server-ca-file",
        help="with --print-scheduler-config and mutual TLS: the CA that signed the extender's serving certificate",
    )
    g.add_argument("--print-settings", action="store_true", help="print the effective settings as YAML and exit")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "server.host": args.host,
        "server.port": args.port,
        "server.pathPrefix": args.path_prefix,
        "server.statusHost": args.status_host,
        "server.statusPort": args.status_port,
        "server.tls.certFile": args.tls_cert_file,
        "server.tls.keyFile": args.tls_key_file,
        "server.tls.clientCaFile": args.tls_client_ca_file,
        "server.statusTls.certFile": args.status_tls_cert_file,
        "server.statusTls.keyFile": args.status_tls_key_file,
        "auth.mode": args.auth,
        "auth.protectMetrics": args.protect_metrics,
        "kubernetes.kubeconfig": args.kubeconfig,
        "kubernetes.context": args.context,
        "kubernetes.schedulerName": args.scheduler_name,
        "policyFile": args.policy_file,
        "policy.mode": args.mode,
        "policy.modelPath": args.model,
        "policy.fallback": args.fallback,
        "policy.deadlineMs": args.deadline_ms,
        "policy.topK": args.top_k,
        "policy.typicalPodsPath": args.typical_pods,
        "strictModel": False if args.no_strict_model else None,
        "prometheus.url": args.prometheus_url,
        "log.level": args.log_level,
        "log.format": args.log_format,
    }


def run(args: argparse.Namespace) -> int:
    import asyncio

    from .settings import ConfigError, getenv, load_settings, settings_yaml

    try:
        settings = load_settings(args.config, getenv(), _overrides(args))
    except ConfigError as exc:
        print(f"rlsched extender: {exc}", file=sys.stderr)
        return 2
    if args.print_scheduler_config:
        from .scheduler_config import ClientTls, render

        host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::", "") else settings.server.host
        tls = None
        if settings.server.tls.cert_file:
            missing = [
                f
                for f, v in (
                    ("--client-cert-file", args.client_cert_file),
                    ("--client-key-file", args.client_key_file),
                    ("--server-ca-file", args.server_ca_file),
                )
                if not v
            ]
            if missing:
                print(
                    f"rlsched extender: the verbs use mutual TLS (server.tls): --print-scheduler-config needs "
                    f"{', '.join(missing)} (kube-scheduler's side of it)",
                    file=sys.stderr,
                )
                return 2
            tls = ClientTls(args.client_cert_file, args.client_key_file, args.server_ca_file)
        print(
            render(
                url=f"{'https' if tls else 'http'}://{host}:{settings.server.port}{settings.server.path_prefix}",
                scheduler_name=settings.kubernetes.scheduler_name,
                kubeconfig=None,
                gpu=settings.gpu,
                tls=tls,
            ),
            end="",
        )
        return 0
    if args.print_settings:
        print(settings_yaml(settings), end="")
        return 0

    from .logs import setup_logging
    from .server import StartupError, limit_native_threads, serve

    setup_logging(settings.log.level, settings.log.format)
    limit_native_threads()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        return runner(serve(settings))
    except StartupError as exc:
        print(f"rlsched extender: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:  # pragma: no cover
        return 0
