"""Settings of the operator: nested dataclasses with a docstring per field, passed in explicitly.

``rlsched operator`` builds :class:`OperatorSettings` from defaults ← an optional YAML file
(camelCase keys mirroring the field names: ``requeue.maxAttempts``, ``sink.kind``) ← command-line
flags. Nothing below the CLI reads the environment. An unknown key is an error naming the key and
the valid ones, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rlsched.extender.decision_ring import MAX_READ
from rlsched.extender.settings import ConfigError, GpuConventions, PrometheusSettings, camel, merge, read_yaml

from .spec import DNS1123_SUBDOMAIN

__all__ = ["OperatorSettings", "SettingsError", "camel", "load_settings"]


SettingsError = ConfigError
"""A setting that cannot be used; the message names it and says what fits."""


@dataclass
class KubeAccess:
    """How the operator reaches the API server (both for kopf's watches and its own writes)."""

    kubeconfig: str | None = None
    """Kubeconfig file; unset: in-cluster service-account credentials, else ``$KUBECONFIG`` or
    ``~/.kube/config`` (read by the CLI only)."""
    context: str | None = None
    """Kubeconfig context (unset: the current one)."""
    request_timeout_s: float = 10.0
    """Timeout of the operator's own API requests (ConfigMap writes, pod patches), seconds."""
    outage_tolerance_s: float = 600.0
    """How long kopf keeps retrying a failing API request (watches included) before giving up and
    stopping the operator (Kubernetes then restarts it). Covers API-server restarts and upgrades. At
    most :data:`MAX_OUTAGE_TOLERANCE_S` (7 days)."""


@dataclass
class ScopeSettings:
    """What the operator watches and how several replicas share the work."""

    namespaces: tuple[str, ...] = ()
    """Namespaces (or kopf glob patterns) to watch for SchedulingPolicies and pods; empty: the
    whole cluster."""
    peering: str | None = None
    """Name of the KopfPeering object replicas coordinate through (``operator/crds/kopfpeering.yaml``
    must be installed); unset: standalone — run exactly one replica."""
    priority: int = 0
    """Peering priority of this replica (the highest one works, the others pause)."""
    scheduler_name: str = "rl-scheduler"
    """``spec.schedulerName`` of the pods the operator requeues and logs outcomes for; the pod
    watch is filtered server-side by this field."""


@dataclass
class PolicyRef:
    """Which SchedulingPolicy drives the extender (one scheduler, one policy)."""

    namespace: str = "default"
    """Namespace of the served SchedulingPolicy (in a cluster: the scheduler's namespace)."""
    name: str = "default"
    """Name of the served SchedulingPolicy. Any other policy gets ``Ready=False, reason NotServed``."""


@dataclass
class SinkSettings:
    """Where the operator publishes the policy file and model for the extender to hot-reload."""

    kind: str = "configmap"
    """``configmap`` (in a cluster: a ConfigMap the scheduler pod mounts) or ``directory`` (local
    runs: a folder the extender process reads directly)."""
    namespace: str = "default"
    """Namespace of the ConfigMaps (``configmap`` sink)."""
    configmap: str = "rlsched-policy"
    """Name of the ConfigMap the extender mounts; the last good bundle is kept in
    ``<name>-last-good`` (``configmap`` sink)."""
    directory: str | None = None
    """Folder written by the ``directory`` sink (created if missing)."""
    mount_path: str | None = None
    """Where the extender sees the published files (its ``policyFile`` is ``<mountPath>/policy.yaml``).
    ``configmap``: the volume's mountPath in the scheduler pod (default ``/etc/rlsched/policy``);
    ``directory``: defaults to the directory itself."""
    max_model_bytes: int = 900 * 1024
    """Largest model the ConfigMap sink accepts. A ConfigMap holds at most 1 MiB in total (policy
    file included); larger models must be served from ``spec.model.path`` (a volume the extender
    mounts) instead."""


IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

ROOM_ANNOTATION = "rlsched.io/room-requeue"
"""The annotation a room requeue bumps (``Requeuer.on_room``): its own, so that these requeues never
count against the delays' ``maxAttempts`` (the chart's admission policy lets the operator change any
``rlsched.io/`` annotation)."""

REJECTED_ANNOTATION = "rlsched.io/policy-rejected"
"""The annotation that records a rejection was told (``requeue.Rejections``)."""

RESERVED_ANNOTATIONS = frozenset({ROOM_ANNOTATION, REJECTED_ANNOTATION})
"""The operator's own pod annotations, which ``requeue.annotation`` must not name."""
"""Where the kubelet mounts a pod's ServiceAccount token (a projected, rotated volume)."""


@dataclass
class ExtenderAccess:
    """The extender's read-only listener (``GET /status``, ``GET /decisions``)."""

    status_url: str = "http://127.0.0.1:8889"
    """Base URL of the extender's status port: ``https://`` when the extender serves it over TLS
    (``server.statusTls``; the chart's default)."""
    ca_file: str | None = None
    """PEM CA bundle that verifies the extender's status certificate with an ``https://`` statusUrl;
    unset: the system's trust store. Read again when the file changes (a rotated Secret). The
    certificate must name statusUrl's host. Set only with an https statusUrl."""
    token_file: str | None = IN_CLUSTER_TOKEN
    """Bearer token sent to ``/status`` and ``/decisions`` (the extender checks it with a TokenReview
    and a SubjectAccessReview: the identity needs ``get`` on those non-resource URLs). Re-read whenever
    the file changes, so the kubelet's token rotation works. Default: the pod's ServiceAccount token;
    a file that does not exist means no token is sent (an extender with ``auth.mode: none``). The
    chart mounts a token made for the extender's audience (``extender.auth.audience``) and points
    here: the API server refuses it, so one that leaks (a plain-HTTP status port, a log) cannot be
    replayed there."""
    timeout_s: float = 5.0
    """Timeout of one request to the status port, seconds."""
    rollout_timeout_s: float = 120.0
    """How long a rollout waits for the extender to report the new model before rolling back.
    In a cluster the kubelet syncs ConfigMap volumes after up to ~1–2 minutes; raise this with it."""
    poll_interval_s: float = 1.0
    """Seconds between ``/status`` polls during a rollout."""
    status_interval_s: float = 30.0
    """Seconds between refreshes of the served policy's ``status.counts`` and drift checks."""


@dataclass
class RequeueSettings:
    """Requeue of pods the policy answered with ``delay``, and of pods filter refused moments before
    room freed where they fit (``room`` records, :mod:`rlsched.extender.refused`)."""

    enabled: bool = True
    """Requeue such pods at all (off: they wait for kube-scheduler's own 5-minute flush, or its next
    event)."""
    initial_s: float = 5.0
    """Delay before the first requeue, seconds (at least the policy's own ``retryAfterSeconds``)."""
    max_s: float = 120.0
    """Cap of the exponential backoff, seconds."""
    max_attempts: int = 10
    """Requeues per pod before the operator gives up with a ``RequeueGaveUp`` event."""
    annotation: str = "rlsched.io/requeue-attempt"
    """Pod annotation the operator bumps: an update of the pod itself is the cluster event that
    moves it out of kube-scheduler's unschedulable pool (docs/operator.md). Must start with
    ``rlsched.io/``: the chart's admission policy denies the operator any other pod change; and be a
    valid annotation key (a qualified name), or the API server refuses every requeue (422)."""
    sweep_interval_s: float = 15.0
    """Seconds between sweeps over pending pods whose condition says "delayed by policy" but that
    no decision record announced (operator restarts, a drained ring)."""


@dataclass
class DecisionLogSettings:
    """The append-only decision dataset for retraining."""

    path: str | None = None
    """Folder of the dataset (a volume); unset: decisions are not logged (requeue still works)."""
    segment_bytes: int = 16 * 1024 * 1024
    """A segment is closed and a new one started when it reaches this size."""
    max_bytes: int = 512 * 1024 * 1024
    """Total size bound: the oldest segments are deleted beyond it."""
    fsync: bool = True
    """fsync each appended batch (and the folder on segment changes): a crash loses nothing acknowledged."""
    drain_interval_s: float = 2.0
    """Seconds between drains of the extender's ``/decisions`` ring (it must not overflow between two)."""
    drain_limit: int = 1000
    """Most records asked for per drain request."""
    load_delay_s: float = 60.0
    """Seconds after a pod is bound at which the node's load is sampled for the outcome."""
    prometheus_url: str | None = None
    """Prometheus base URL for the node load in outcomes; unset: outcomes carry no load."""
    load_queries: dict[str, str] = field(
        default_factory=lambda: {
            "cpu": '1 - avg(rate(node_cpu_seconds_total{mode="idle",NODE_SELECTOR}[2m]))',
            "memory": (
                "1 - avg(node_memory_MemAvailable_bytes{NODE_SELECTOR} / node_memory_MemTotal_bytes{NODE_SELECTOR})"
            ),
        }
    )
    """PromQL per load column; ``NODE_SELECTOR`` is replaced by ``<nodeLabel>="<node>"``."""
    node_label: str = "node"
    """Series label that names the node in ``loadQueries``."""


DEFAULT_POD_CPU_QUERY = 'sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{container!=""}[5m]))'
"""Cores per pod, averaged over 5 minutes, from cAdvisor's per-container counters; ``container!=""``
drops the pod-level cgroup series, which would count every pod twice."""


@dataclass
class RebalancerSettings:
    """The rebalancer's operator-side settings; what it does is the served policy's ``spec.rebalance``."""

    enabled: bool = True
    """Allow the rebalancer at all. Off: ``spec.rebalance`` is ignored (the chart sets this from
    ``operator.rebalancer.enabled``, which also grants ``pods/eviction``)."""
    tick_s: float = 5.0
    """Seconds between checks whether a cycle is due (``spec.rebalance.intervalSeconds`` sets the
    cycle; this only bounds how late one starts)."""
    typical_pods_path: str | None = None
    """Typical pods for the fragmentation measure (a JSON file as the extender's ``typicalPodsPath``);
    unset: the built-in ones the extender ships. Use the extender's file when it has one."""
    latency_sensitive_label: str = "rlsched.io/latency-sensitive"
    """Pod label whose value ``"true"`` marks a latency-sensitive pod for the planner (any other value:
    not); a pod without it is read as the extender reads it: ``gpu.latencySensitiveLabel``, then
    Koordinator's ``koordinator.sh/qosClass`` (``gpu.qosLabel``: ``LSE``, ``LSR``, ``LS``)."""
    max_pods: int = 200_000
    """A cycle lists at most this many pods (pages of 2,000); a larger cluster is skipped with an error."""
    gpu: GpuConventions = field(default_factory=GpuConventions)
    """How GPUs appear in objects: must match the extender's ``gpu`` settings."""
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    """Node load for the planner's hot-node term, read once per cycle with the extender's poller (same
    keys as the extender's ``prometheus`` section: use the same URL and queries). ``url`` unset: the
    load is unknown (NaN) and only fragmentation drives the moves."""
    pod_cpu_query: str = DEFAULT_POD_CPU_QUERY
    """PromQL of each pod's CPU use in cores (cAdvisor's series, labels ``namespace`` and ``pod``), read
    once per cycle from ``prometheus.url``: the planner then knows which pod makes a node hot (in the
    simulation this cut hot-node time about twice as much as the request-share estimate;
    docs/rebalancer.md). Empty, or no ``prometheus.url``: a pod's part of its node's load is estimated
    from its share of the requested CPU."""


@dataclass
class OperatorSettings:
    """Everything ``rlsched operator`` needs."""

    kubernetes: KubeAccess = field(default_factory=KubeAccess)
    """API server access."""
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    """Watched namespaces, peering, scheduler name."""
    policy: PolicyRef = field(default_factory=PolicyRef)
    """The served SchedulingPolicy."""
    sink: SinkSettings = field(default_factory=SinkSettings)
    """Where policy files and models are published."""
    extender: ExtenderAccess = field(default_factory=ExtenderAccess)
    """The extender's status port and rollout timing."""
    requeue: RequeueSettings = field(default_factory=RequeueSettings)
    """Requeue of delayed pods."""
    decision_log: DecisionLogSettings = field(default_factory=DecisionLogSettings)
    """The decision dataset."""
    rebalancer: RebalancerSettings = field(default_factory=RebalancerSettings)
    """The rebalancer (evictions that undo fragmentation; ``spec.rebalance`` of the served policy)."""
    install_crds: bool = False
    """Apply ``operator/crds/*.yaml`` at start (local runs; in a cluster the chart installs them)."""
    liveness_endpoint: str | None = None
    """kopf's liveness probe endpoint (``http://0.0.0.0:8080/healthz``); unset: none."""
    metrics_endpoint: str | None = None
    """``host:port`` of the operator's Prometheus ``/metrics`` listener (the rebalancer's counters);
    unset: none."""
    log_level: str = "INFO"
    """Python log level name."""


# -- loading --------------------------------------------------------------------------------------
# The keys, types and messages follow the extender's settings: the same loader serves both.


def from_mapping(data: Mapping[str, Any], base: OperatorSettings | None = None) -> OperatorSettings:
    """``base`` (default: the defaults) with camelCase ``data`` applied; SettingsError names bad keys."""
    return merge(base if base is not None else OperatorSettings(), data)


def _positive(seconds: float) -> bool:
    """A finite number above 0 (NaN and inf are not: a loop would spin or never run)."""
    return math.isfinite(seconds) and seconds > 0


MAX_OUTAGE_TOLERANCE_S = 7 * 24 * 3600.0
"""The longest ``kubernetes.outageToleranceS``: kopf holds one 30 s retry delay per step of it, and an
API server gone for a week is not an outage an operator should wait out without restarting."""

_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def qualified_name(key: str) -> bool:
    """Whether ``key`` is a Kubernetes qualified name, as annotation keys must be (apimachinery's
    ``IsQualifiedName``): an optional DNS-subdomain prefix of at most 253 characters and ``/``, then a
    name of at most 63 characters: alphanumerics, ``-``, ``_`` and ``.``, alphanumeric at both ends."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def validate(s: OperatorSettings) -> OperatorSettings:
    """Cross-field checks; returns ``s`` with derived defaults filled in."""
    if s.sink.kind not in ("configmap", "directory"):
        raise SettingsError(f"sink.kind: {s.sink.kind!r} is not configmap or directory")
    if s.sink.kind == "directory":
        if not s.sink.directory:
            raise SettingsError("sink.directory: required with sink.kind=directory (the folder the extender reads)")
        if not s.sink.mount_path:
            s = dataclasses.replace(
                s, sink=dataclasses.replace(s.sink, mount_path=str(Path(s.sink.directory).resolve()))
            )
    elif not s.sink.mount_path:
        s = dataclasses.replace(s, sink=dataclasses.replace(s.sink, mount_path="/etc/rlsched/policy"))
    r = s.requeue
    if not (r.initial_s > 0 and r.max_s >= r.initial_s):
        raise SettingsError("requeue: initialS must be positive and maxS at least initialS")
    if r.max_attempts < 1:
        raise SettingsError("requeue.maxAttempts: must be at least 1")
    if not (r.annotation.startswith("rlsched.io/") and len(r.annotation) > len("rlsched.io/")):
        # The chart's admission policy lets the operator change only rlsched.io/ annotations of pods.
        raise SettingsError(
            f"requeue.annotation: {r.annotation!r} must start with rlsched.io/ "
            "(the only pod annotations the operator may change)"
        )
    if r.annotation in RESERVED_ANNOTATIONS:
        raise SettingsError(
            f"requeue.annotation: {r.annotation!r} is the operator's own "
            f"(reserved: {', '.join(sorted(RESERVED_ANNOTATIONS))}); choose another rlsched.io/ key"
        )
    if not qualified_name(r.annotation):
        raise SettingsError(
            f"requeue.annotation: {r.annotation[:300]!r} is not a valid annotation key: after rlsched.io/, "
            "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    if not _positive(r.sweep_interval_s):
        raise SettingsError(f"requeue.sweepIntervalS: must be a positive number of seconds, got {r.sweep_interval_s!r}")
    d = s.decision_log
    if d.segment_bytes < 4096 or d.max_bytes < 2 * d.segment_bytes:
        raise SettingsError("decisionLog: segmentBytes must be at least 4096 and maxBytes at least twice segmentBytes")
    if not 1 <= d.drain_limit <= MAX_READ:
        raise SettingsError(
            f"decisionLog.drainLimit: must be 1..{MAX_READ} (what the extender answers), got {d.drain_limit}"
        )
    if not _positive(d.drain_interval_s):
        raise SettingsError(
            f"decisionLog.drainIntervalS: must be a positive number of seconds, got {d.drain_interval_s!r}"
        )
    if not (math.isfinite(d.load_delay_s) and d.load_delay_s >= 0):
        raise SettingsError(f"decisionLog.loadDelayS: must be a number of seconds, 0 or more, got {d.load_delay_s!r}")
    k = s.kubernetes
    if not (_positive(k.request_timeout_s) and _positive(k.outage_tolerance_s)):
        raise SettingsError("kubernetes: requestTimeoutS and outageToleranceS must be positive numbers of seconds")
    if k.outage_tolerance_s > MAX_OUTAGE_TOLERANCE_S:
        raise SettingsError(
            f"kubernetes.outageToleranceS: at most {MAX_OUTAGE_TOLERANCE_S:.0f} seconds (7 days), "
            f"got {k.outage_tolerance_s!r}"
        )
    if not (s.policy.name and s.policy.namespace):
        raise SettingsError("policy: name and namespace must not be empty (the SchedulingPolicy this operator serves)")
    if s.sink.max_model_bytes < 1:
        raise SettingsError(f"sink.maxModelBytes: must be positive, got {s.sink.max_model_bytes}")
    if s.log_level.upper() not in logging.getLevelNamesMapping():
        raise SettingsError(f"logLevel: {s.log_level[:40]!r} is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    if s.metrics_endpoint:
        from .metrics import parse_endpoint

        try:
            parse_endpoint(s.metrics_endpoint)
        except ValueError as exc:
            raise SettingsError(f"metricsEndpoint: {exc}") from None
    rb = s.rebalancer
    if not 0.1 <= rb.tick_s <= 3600 or rb.max_pods < 1:
        raise SettingsError("rebalancer: tickS must be from 0.1 to 3600 seconds and maxPods at least 1")
    if not rb.latency_sensitive_label:
        raise SettingsError("rebalancer.latencySensitiveLabel: must not be empty")
    e = s.extender
    if not (e.timeout_s > 0 and e.rollout_timeout_s > 0 and e.poll_interval_s > 0 and e.status_interval_s > 0):
        raise SettingsError("extender: timeoutS, rolloutTimeoutS, pollIntervalS and statusIntervalS must be positive")
    scheme = urlsplit(e.status_url).scheme
    if scheme not in ("http", "https"):
        raise SettingsError(f"extender.statusUrl: {e.status_url[:200]!r} is not an http:// or https:// URL")
    if e.ca_file and scheme != "https":
        raise SettingsError(
            f"extender.caFile: set, but extender.statusUrl {e.status_url[:200]!r} is plain HTTP: use https:// "
            "(the extender's server.statusTls) or leave caFile unset"
        )
    return s


def load_settings(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> OperatorSettings:
    """Defaults ← YAML file ← ``overrides`` (dotted camelCase keys, None values skipped)."""
    settings = OperatorSettings()
    if path:
        data = read_yaml(path)
        try:
            settings = from_mapping(data, settings)
        except SettingsError as exc:
            raise SettingsError(f"config file {path}: {exc}") from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        nested: Any = value
        for part in reversed(dotted.split(".")):
            nested = {part: nested}
        settings = from_mapping(nested, settings)
    return validate(settings)
