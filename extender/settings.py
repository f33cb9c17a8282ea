"""Settings of the extender: nested dataclasses with a docstring per field, passed in explicitly.

Sources, lowest precedence first: the defaults here, a YAML config file (camelCase keys mirroring the
field names: ``server.statusPort``, ``prometheus.queries.cpu``), ``RLSCHED_*`` environment variables
(``RLSCHED_SERVER_PORT``, ``RLSCHED_POLICY_MODE`` …; read only by the CLI), then command-line flags.
An unknown key is an error that names the key and lists the valid ones — a typo must not silently
fall back to a default.

The *policy settings* (:class:`PolicySettings`: mode, model path, fallback, deadline, top-K) can also
come from a separate policy file that the operator writes into a mounted ConfigMap; the extender
polls that file and hot-reloads it (see :mod:`rlsched.extender.policy`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from rlsched.policy.resources import clip

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")

MODES = ("active", "shadow", "off")
"""Policy modes: ``active`` the learned policy serves (heuristic on any failure); ``shadow`` the
heuristic serves and the policy's choice is only logged and counted; ``off`` the heuristic alone."""


class ConfigError(ValueError):
    """A configuration value or key that cannot be used; the message names it and says what fits."""


@dataclass
class TlsSettings:
    """Mutual TLS on the verb listener (all three files, or none)."""

    cert_file: str | None = None
    """PEM certificate the verb listener serves (HTTPS); unset: plain HTTP on loopback."""
    key_file: str | None = None
    """PEM private key of ``certFile``."""
    client_ca_file: str | None = None
    """PEM CA bundle; every caller must present a client certificate signed by it (kube-scheduler's
    extender ``tlsConfig.certFile``/``keyFile``). Without a verified certificate the TLS handshake fails."""


@dataclass
class StatusTlsSettings:
    """HTTPS on the status listener (both files, or neither): server-side TLS only. Callers still
    authenticate with their bearer tokens (``auth``); TLS keeps those tokens, and what the listener
    answers, off the wire. The files are read again when they change (:mod:`rlsched.extender.status_tls`)."""

    cert_file: str | None = None
    """PEM certificate (chain) the status listener serves; unset: plain HTTP."""
    key_file: str | None = None
    """PEM private key of ``certFile``."""


@dataclass
class ServerSettings:
    """The two HTTP listeners."""

    host: str = "127.0.0.1"
    """Address of the verb listener (filter/prioritize/bind/preempt). Loopback by default: without
    ``tls`` the protocol has no caller authentication, so run the extender as a sidecar of kube-scheduler.
    Any other address needs ``tls`` (refused at start-up otherwise)."""
    port: int = 8888
    """Port of the verb listener."""
    path_prefix: str = ""
    """Path the verbs hang under (``/rlsched`` → ``POST /rlsched/filter``); must match ``urlPrefix``."""
    status_host: str = "127.0.0.1"
    """Address of the status listener: /metrics, /healthz, /readyz, /status, /decisions. Loopback
    by default; the Helm chart sets 0.0.0.0 (probes, Prometheus and the operator reach it through
    the Service, with ``auth`` guarding what reveals anything)."""
    status_port: int = 8889
    """Port of the status listener."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Largest request body accepted (HTTP 413 above). With ``nodeCacheCapable: true`` (the chart's
    and ``--print-scheduler-config``'s setting) a body is the pod and the node names: ~0.1 MB at 5,000
    nodes. Full-node mode sends every v1.Node, about 5 KB each, so 8 MiB covers ~1,500 nodes; raise it
    for more. The body is parsed on the event loop (~20 ms per MB), so a larger limit lets one request
    hold up the others for longer."""
    shutdown_timeout_s: float = 5.0
    """Seconds to let in-flight requests finish on SIGTERM; keep below the pod's grace period."""
    header_timeout_s: float = 10.0
    """Seconds a client has to send a request line and its headers, counted from connecting (or from
    the first byte of a further request on a kept-alive connection); slower clients are answered 408
    and dropped (a slowloris client would otherwise hold a connection forever)."""
    body_timeout_s: float = 15.0
    """Seconds to receive a whole request body once the headers are in (HTTP 408 and the connection
    closed past it). kube-scheduler gives up on a call after its ``httpTimeout`` (10 s in our config)."""
    idle_timeout_s: float = 120.0
    """Seconds a kept-alive connection may sit idle between requests. Longer than Go's 90 s
    ``IdleConnTimeout`` (kube-scheduler's client), so the client closes idle connections first and
    never sends a request on one the extender is closing."""
    max_connections: int = 1024
    """Open connections the verb listener accepts at once; more are answered 503 and closed.
    kube-scheduler opens one per call in flight (binds run concurrently, one per pod)."""
    status_max_connections: int = 64
    """Open connections the status listener accepts at once (probes, Prometheus, the operator)."""
    tls: TlsSettings = field(default_factory=TlsSettings)
    """Optional mutual TLS on the verb listener (``server.tls.certFile`` …)."""
    status_tls: StatusTlsSettings = field(default_factory=StatusTlsSettings)
    """Optional HTTPS on the status listener (``server.statusTls.certFile``, ``keyFile``)."""


AUTH_MODES = ("kubernetes", "none")
"""``kubernetes``: bearer tokens checked with TokenReview + SubjectAccessReview; ``none``: no checks
(local development only; logged as a warning at start-up)."""


@dataclass
class AuthSettings:
    """Who may read the status listener (``GET /status``, ``/decisions``; ``/metrics`` optionally).

    A caller sends ``Authorization: Bearer <token>``; the extender asks the API server who it is
    (TokenReview) and whether it may ``get`` the non-resource URL it asked for
    (SubjectAccessReview: ``nonResourceURLs: ["/status", "/decisions"]``, ``verbs: [get]``) — the
    convention of kube-rbac-proxy and controller-runtime's metrics filter. /healthz and /readyz stay open.
    """

    mode: str = "kubernetes"
    """``kubernetes`` | ``none`` (see :data:`AUTH_MODES`). The extender's own identity needs
    ``create`` on tokenreviews and subjectaccessreviews (the ClusterRole ``system:auth-delegator``)."""
    protect_metrics: bool = False
    """Also require a token allowed ``get`` on ``/metrics``. Off by default, where the listener is on
    loopback; the chart turns it on (Prometheus then scrapes with its ServiceAccount token)."""
    cache_ttl_s: float = 30.0
    """Seconds an allowed (token, path) answer is reused without asking the API server again."""
    negative_cache_ttl_s: float = 5.0
    """Seconds a refused answer (invalid token, denied access) is reused; shorter, so a token that was
    just granted access works soon, while a caller repeating a bad token cannot flood the API server."""
    review_timeout_s: float = 5.0
    """Timeout of one TokenReview or SubjectAccessReview call; past it the request gets HTTP 503."""
    audiences: tuple[str, ...] = ()
    """Token audiences accepted besides the API server's own (``[rlsched-extender]``; the chart sets
    ``extender.auth.audience``). A token made for one of them (a projected ServiceAccount token,
    ``kubectl create token SA --audience rlsched-extender``) is refused by the API server itself, so
    one read off this plain-HTTP listener cannot be replayed there with its owner's rights. The
    TokenReview asks for these first (``spec.audiences``). At most 16, each 1..256 visible ASCII
    characters."""
    api_server_audience: bool = True
    """Also accept tokens of the API server's own audiences (a pod's default ServiceAccount token, what
    Prometheus scrapes with), with a second TokenReview when the first, for ``audiences``, refuses.
    false: only ``audiences`` tokens (an API-server token sent here is refused), and then
    ``audiences`` must not be empty: refused at start-up, since it would refuse every caller."""


@dataclass
class KubeSettings:
    """How the extender talks to the API server."""

    kubeconfig: str | None = None
    """Kubeconfig file; unset: in-cluster credentials if present, else $KUBECONFIG / ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context (unset: the current one)."""
    scheduler_name: str = "rl-scheduler"
    """``spec.schedulerName`` of the pods this extender serves: bind and preempt refuse every other pod
    (the kube-scheduler profile decides which pods reach filter and prioritize)."""
    list_timeout_s: float = 60.0
    """Timeout of one list page (seconds)."""
    write_timeout_s: float = 8.0
    """Seconds bind's API calls may take together: the pods/binding create (which carries the card
    annotations), and a GET of the pod when the watch has not delivered it or the create met a conflict
    (each GET at most 2 s). Keep it at least 1 s below kube-scheduler's extender ``httpTimeout`` (10 s in
    our config; kube-scheduler's own default is 5 s: set 4 then). Not shorter than the API server's
    binding latency under load: with 2 s, an API server slowed by CPU contention (its binding handler
    at 0.7 s p50, 2.9 s p99 for stock kube-scheduler) saw our writes cut off, every cut one more failed
    bind and retry, and the backlog stalled (docs/benchmarks.md, "Under CPU contention")."""
    watch_timeout_s: int = 300
    """``timeoutSeconds`` of each watch request; the watch then resumes from the last resourceVersion."""
    retry_backoff_s: float = 1.0
    """First delay after a failed list/watch; doubles up to 30 s."""
    assumed_ttl_s: float = 30.0
    """How long cards stay reserved for a pod whose binding outcome is unknown (write timed out)
    before the watch has confirmed it; then they are released (like kube-scheduler's assumed pods)."""
    api_connections: int = 64
    """The most calls to the API server in flight at once (watches aside), one HTTP/1.1 connection each:
    kube-scheduler starts a bind per pod without waiting for the previous one, and a bind that finds
    every connection busy waits for one within ``writeTimeoutS`` (``rlsched_extender_api_slot_wait_seconds``
    measures the wait; docs/benchmarks.md)."""


@dataclass
class GpuConventions:
    """How GPUs are expressed in Kubernetes objects (docs/gpu-sharing.md)."""

    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource for whole cards: a pod asks ``k`` cards; a node's allocatable is its card count."""
    gpu_milli_resource: str = "rlsched.io/gpu-milli"
    """Extended resource for a share of one card, in milli (1..1000); list it in ``managedResources``
    with ``ignoredByScheduler: true``."""
    gpu_milli_annotation: str = "rlsched.io/gpu-milli"
    """Pod annotation asking a share of one card (when no device plugin advertises the resource)."""
    gpu_models_annotation: str = "rlsched.io/gpu-models"
    """Pod annotation restricting the card model: ``V100M16|V100M32`` (``,`` also separates)."""
    node_model_labels: tuple[str, ...] = ("rlsched.io/gpu-model", "nvidia.com/gpu.product")
    """Node labels naming the card model, first match wins (GPU feature discovery sets the second)."""
    node_price_annotation: str = "rlsched.io/node-price"
    """Node annotation with a relative price (a float; default 1)."""
    cards_annotation: str = "rlsched.io/gpu-cards"
    """Pod annotation bind writes: the card indices chosen on the node, ``0,3``."""
    card_milli_annotation: str = "rlsched.io/gpu-card-milli"
    """Pod annotation bind writes: milli taken on each of those cards (1000 for whole cards)."""
    assigned_node_annotation: str = "rlsched.io/gpu-node"
    """Pod annotation bind writes: the node the cards belong to (cards are only trusted on that node)."""
    latency_sensitive_label: str = "rlsched.io/latency-sensitive"
    """Pod label saying outright whether a pod is latency-sensitive (``"true"``; any other value: it is
    not). It wins over :attr:`qos_label`; the operator's rebalancer reads the same label
    (``rebalancer.latencySensitiveLabel``). Only a model trained with the QoS features reads the class."""
    qos_label: str = "koordinator.sh/qosClass"
    """Pod label naming its QoS class, Koordinator's convention: ``LSE``, ``LSR`` and ``LS`` are
    latency-sensitive, any other value is not. A pod with neither label counts as latency-sensitive
    when its Kubernetes QoS class (``status.qosClass``) is ``Guaranteed``."""


DEFAULT_QUERIES: dict[str, str] = {
    "cpu": '1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[2m]))',
    "memory": "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes",
    "network": (
        "sum by (instance) ("
        'rate(node_network_receive_bytes_total{device!~"lo|veth.*|docker.*|cni.*|flannel.*|cali.*|virbr.*"}[2m])'
        ' + rate(node_network_transmit_bytes_total{device!~"lo|veth.*|docker.*|cni.*|flannel.*|cali.*|virbr.*"}[2m]))'
        " / 2.5e9"
    ),
    "disk": "max by (instance) (rate(node_disk_io_time_seconds_total[2m]))",
}
"""PromQL per load column (node-exporter metrics), each a 0..1 utilization per node. Network divides
rx+tx bytes/s by 2.5e9 (a 10 Gbit/s full-duplex link); edit the query for other links."""


MAX_PROMETHEUS_TIMEOUT_S = 60.0
"""Longest accepted ``prometheus.timeoutS``: an instant query slower than this is broken, and an endless
one would switch off the bound that keeps the columns' values fresh."""


@dataclass
class PrometheusSettings:
    """Per-node load from Prometheus (``ClusterState.load``)."""

    url: str | None = None
    """Prometheus base URL (``http://prometheus:9090``); unset: no load features (all NaN)."""
    interval_s: float = 15.0
    """Seconds between refreshes (from the end of one round to the start of the next)."""
    timeout_s: float = 5.0
    """Timeout of one query, seconds; at most 60. The columns are queried one after another, so
    ``intervalS`` + ``timeoutS`` × (configured queries) must stay below ``staleAfterS``: a Prometheus
    that is slow but answers then keeps every value fresh instead of letting it blink to NaN."""
    stale_after_s: float = 120.0
    """A node's value older than this (monotonic seconds since its query was sent) is dropped (NaN)
    and reported as stale — also while a round waits on a slow query: it is never served more than
    a moment (50 ms plus event-loop latency) past this."""
    queries: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_QUERIES))
    """PromQL per load column: ``cpu``, ``memory``, ``network``, ``disk`` (missing ones stay NaN)."""
    node_labels: tuple[str, ...] = ("node", "nodename", "kubernetes_node", "instance")
    """Series labels tried, in order, to find the node: matched against node names, then node
    addresses (InternalIP, Hostname); ``host:port`` loses the port first."""


@dataclass
class PolicySettings:
    """What scores nodes. Hot-reloadable through the policy file, except ``seed`` (start-up only)."""

    mode: str = "active"
    """``active`` | ``shadow`` | ``off`` (see :data:`MODES`)."""
    model_path: str | None = None
    """Exported PPO model (``.npz``); unset or unloadable: the fallback heuristic serves."""
    model_sha256: str | None = None
    """Expected sha256 of the model file (64 lowercase hex digits); unset: any file is loaded. A file
    with other bytes is not loaded (the previous model keeps serving, the error is in ``/status``):
    the operator publishes the digest it verified, so bytes swapped at a ``path`` after review are
    refused instead of served."""
    fallback: str = "fgd"
    """Heuristic used without a model, on any policy error, or past the deadline."""
    deadline_ms: float = 100.0
    """Per-request budget for the learned policy; past it the fallback's answer is served."""
    deadline_enforcement: str = "timer"
    """``timer``: the policy runs on the event loop's thread and a SIGALRM timer interrupts it at the
    deadline (within one numpy operation); ``thread``: it runs in a worker thread and the answer is
    abandoned at the deadline (the loop stays free even inside one long C call; costs ~0.2 ms p50,
    ~1.5 ms p99 per call on 2 shared cores)."""
    top_k: int = 1
    """Filter keeps only the policy's top K feasible nodes (0: keep all). 1 makes kube-scheduler
    bind the chosen node without calling prioritize (docs/extender.md, "Decisions that survive")."""
    typical_pods_path: str | None = None
    """JSON file of typical pods for FGD (``TypicalPods.to_json``); unset: the model's, else built-in."""
    seed: int = 0
    """Seed of the node tie-break order and of sampling policies. Read at start-up only: the tie-break
    order is fixed for the process, so a policy file's ``seed`` is ignored (logged and counted)."""


@dataclass
class LogSettings:
    """Logging."""

    level: str = "INFO"
    """Python log level name."""
    format: str = "json"
    """``json`` (one object per line) or ``text``."""


@dataclass
class ExtenderSettings:
    """Everything ``rlsched extender`` needs."""

    server: ServerSettings = field(default_factory=ServerSettings)
    """The HTTP listeners."""
    kubernetes: KubeSettings = field(default_factory=KubeSettings)
    """API server access."""
    gpu: GpuConventions = field(default_factory=GpuConventions)
    """GPU resource names, labels and annotations."""
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    """Load features."""
    policy: PolicySettings = field(default_factory=PolicySettings)
    """Initial policy settings (the policy file, when given, overrides them)."""
    policy_file: str | None = None
    """YAML file with :class:`PolicySettings` keys, polled and hot-reloaded (the operator's ConfigMap)."""
    strict_model: bool = True
    """At start-up, a model that cannot be loaded stops the extender with an error (true), or is
    reported in /status and the log while the fallback serves (false; hot reload keeps trying)."""
    policy_poll_s: float = 2.0
    """Seconds between checks of the policy file and the model file for changes."""
    decision_ring_size: int = 4096
    """Recent decisions kept for ``GET /decisions``."""
    decision_cache_ttl_s: float = 30.0
    """How long filter's decision for a pod is reused by prioritize and bind."""
    explain_load: bool = False
    """For every decision made while node load is known, decide again as if it were not, and record
    that node in the decision (``withoutLoad``) and in ``rlsched_extender_load_explained_total``: where
    load changed the choice. Costs a second decision per pod; off by default."""
    log: LogSettings = field(default_factory=LogSettings)
    """Logging."""
    auth: AuthSettings = field(default_factory=AuthSettings)
    """Authentication and authorization of the status listener."""


# -- loading --------------------------------------------------------------------------------------


def camel(name: str) -> str:
    """``status_port`` → ``statusPort``."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def settings_yaml(settings: Any) -> str:
    """A settings dataclass as the YAML a config file would hold (camelCase keys): ``--print-settings``."""

    def camelize(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {camel(k): camelize(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [camelize(v) for v in obj]
        return obj

    return yaml.safe_dump(camelize(dataclasses.asdict(settings)), sort_keys=False)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check/convert a YAML or env value to the field's type; ConfigError names ``where``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return build(hint, value, where)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true or false, got {clip(value)}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {clip(value)}")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {clip(value)}") from None
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {clip(value)}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {clip(value)}") from None
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value)
            if "\0" in text:  # open() and os.stat() would raise ValueError on it, far from here
                raise ConfigError(f"{where}: contains a NUL character (\\0): no file path, name or URL holds one")
            return text
        raise ConfigError(f"{where}: expected a string, got {type(value).__name__}")
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    raise ConfigError(f"{where}: unsupported setting type {hint!r}")  # pragma: no cover


def _yaml11(name: str, value: Any) -> Any:
    """YAML 1.1 reads an unquoted ``mode: off`` as false; that can only mean "off"."""
    if name == "mode" and value is False:
        return "off"
    return value


def build(cls: type[_D], data: Mapping[str, Any], where: str = "") -> _D:
    """A ``cls`` instance from camelCase ``data``; unknown keys and wrong types raise ConfigError."""
    hints = _hints(cls)
    by_key = {camel(f.name): f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        f = by_key.get(str(key))
        if f is None:
            path = f"{where}.{key}" if where else str(key)
            raise ConfigError(
                f"unknown setting {clip(path)}; valid keys{' under ' + where if where else ''}: "
                f"{', '.join(sorted(by_key))}"
            )
        kwargs[f.name] = _coerce(_yaml11(f.name, value), hints[f.name], f"{where}.{key}" if where else str(key))
    obj = cls(**kwargs)
    validate(obj, where)
    return obj


def merge(obj: _D, data: Mapping[str, Any], where: str = "") -> _D:
    """A copy of dataclass ``obj`` with camelCase ``data`` applied on top (nested sections merged)."""
    hints = _hints(type(obj))
    by_key = {camel(f.name): f for f in dataclasses.fields(obj)}
    changes = {}
    for key, value in data.items():
        f = by_key.get(str(key))
        path = f"{where}.{key}" if where else str(key)
        if f is None:
            raise ConfigError(
                f"unknown setting {clip(path)}; valid keys{' under ' + where if where else ''}: "
                f"{', '.join(sorted(by_key))}"
            )
        current = getattr(obj, f.name)
        if dataclasses.is_dataclass(current) and not isinstance(current, type) and isinstance(value, Mapping):
            changes[f.name] = merge(current, value, path)
        else:
            changes[f.name] = _coerce(_yaml11(f.name, value), hints[f.name], path)
    result = dataclasses.replace(obj, **changes)
    validate(result, where)
    return result


def validate(obj: Any, where: str = "") -> None:
    """Range checks that types alone do not express."""
    prefix = f"{where}." if where else ""
    if isinstance(obj, PolicySettings):
        if obj.mode not in MODES:
            raise ConfigError(f"{prefix}mode: {clip(obj.mode)} is not one of {', '.join(MODES)}")
        if not 0 < obj.deadline_ms <= MAX_DEADLINE_MS:  # NaN and infinities too
            raise ConfigError(
                f"{prefix}deadlineMs: must be more than 0 and at most {MAX_DEADLINE_MS:.0f}, "
                f"got {clip(obj.deadline_ms)}"
            )
        if obj.deadline_enforcement not in ("timer", "thread"):
            raise ConfigError(f"{prefix}deadlineEnforcement: {clip(obj.deadline_enforcement)} is not timer or thread")
        if obj.top_k < 0:
            raise ConfigError(f"{prefix}topK: must be 0 (keep all) or more, got {obj.top_k}")
        if obj.model_sha256 is not None and not SHA256_HEX.fullmatch(obj.model_sha256):
            raise ConfigError(
                f"{prefix}modelSha256: expected 64 lowercase hex digits (sha256sum of the model), "
                f"got {clip(obj.model_sha256)}"
            )
        from rlsched.policy.scorers import UnknownPolicyError, canonical_name

        try:
            canonical_name(obj.fallback)
        except UnknownPolicyError as exc:
            raise ConfigError(f"{prefix}fallback: {exc}") from None
    elif isinstance(obj, ServerSettings):
        for name in ("port", "status_port"):
            port = getattr(obj, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{prefix}{camel(name)}: {port} is not a TCP port")
        if obj.max_body_bytes < 1024:
            raise ConfigError(f"{prefix}maxBodyBytes: must be at least 1024, got {obj.max_body_bytes}")
        if obj.path_prefix and (not obj.path_prefix.startswith("/") or obj.path_prefix.endswith("/")):
            raise ConfigError(
                f"{prefix}pathPrefix: must start with '/' and not end with one, got {clip(obj.path_prefix)}"
            )
        for name, most in SERVER_TIMEOUT_MAX_S.items():
            if not 0 < getattr(obj, name) <= most:  # an endless one would switch the guard it sets off
                raise ConfigError(
                    f"{prefix}{camel(name)}: must be above 0 and at most {most:g} s, got {getattr(obj, name)}"
                )
        for name in ("max_connections", "status_max_connections"):
            if not 1 <= getattr(obj, name) <= MAX_CONNECTIONS:
                raise ConfigError(f"{prefix}{camel(name)}: must be 1..{MAX_CONNECTIONS}, got {getattr(obj, name)}")
    elif isinstance(obj, AuthSettings):
        if obj.mode not in AUTH_MODES:
            raise ConfigError(f"{prefix}mode: {clip(obj.mode)} is not one of {', '.join(AUTH_MODES)}")
        for name in ("cache_ttl_s", "negative_cache_ttl_s", "review_timeout_s"):
            low_ok = obj.review_timeout_s > 0 if name == "review_timeout_s" else getattr(obj, name) >= 0
            most = 60.0 if name == "review_timeout_s" else MAX_AUTH_CACHE_TTL_S
            if not low_ok or not getattr(obj, name) <= most:  # a revoked grant must stop working some time
                raise ConfigError(
                    f"{prefix}{camel(name)}: must be {'above 0' if name == 'review_timeout_s' else '0 or more'} "
                    f"and at most {most:g} s, got {getattr(obj, name)}"
                )
        if len(obj.audiences) > MAX_AUTH_AUDIENCES:
            raise ConfigError(f"{prefix}audiences: at most {MAX_AUTH_AUDIENCES}, got {len(obj.audiences)}")
        for i, audience in enumerate(obj.audiences):
            if not (len(audience) <= MAX_AUDIENCE_CHARS and AUDIENCE.fullmatch(audience)):
                raise ConfigError(
                    f"{prefix}audiences[{i}]: expected 1 to {MAX_AUDIENCE_CHARS} visible ASCII characters (a "
                    f"name such as rlsched-extender, or a URL), got {clip(audience)}"
                )
    elif isinstance(obj, KubeSettings):
        for name, (low, most) in KUBE_RANGES.items():
            value = getattr(obj, name)
            if not low <= value <= most:  # NaN too
                raise ConfigError(f"{prefix}{camel(name)}: must be {low:g}..{most:g}, got {clip(value)}")
    elif isinstance(obj, PrometheusSettings):
        unknown = set(obj.queries) - {"cpu", "memory", "network", "disk"}
        if unknown:
            raise ConfigError(
                f"{prefix}queries: unknown load column(s) {sorted(unknown)}; valid: cpu, memory, network, disk"
            )
        for name in ("interval_s", "timeout_s", "stale_after_s"):
            seconds = getattr(obj, name)
            if not 0 < seconds < float("inf"):  # NaN too
                raise ConfigError(
                    f"{prefix}{camel(name)}: must be a positive, finite number of seconds, got {clip(seconds)}"
                )
        if obj.timeout_s > MAX_PROMETHEUS_TIMEOUT_S:
            raise ConfigError(
                f"{prefix}timeoutS: must be at most {MAX_PROMETHEUS_TIMEOUT_S:g} s, got {obj.timeout_s:g}"
            )
        queries = sum(1 for q in obj.queries.values() if q)
        round_s = obj.interval_s + queries * obj.timeout_s
        if not round_s < obj.stale_after_s:
            raise ConfigError(
                f"{prefix}staleAfterS: must be more than intervalS + timeoutS × {queries} queries "
                f"= {obj.interval_s:g} + {obj.timeout_s:g} × {queries} = {round_s:g} s (a round whose "
                f"queries all run to their timeout), got {obj.stale_after_s:g}: raise staleAfterS or "
                "lower intervalS or timeoutS"
            )
    elif isinstance(obj, LogSettings):
        if obj.format not in ("json", "text"):
            raise ConfigError(f"{prefix}format: {clip(obj.format)} is not json or text")
        if obj.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"{prefix}level: {clip(obj.level)} is not a log level (DEBUG, INFO, WARNING, ERROR)")
    elif isinstance(obj, ExtenderSettings):
        if not 1 <= obj.decision_ring_size <= MAX_DECISION_RING:
            raise ConfigError(f"decisionRingSize: must be 1..{MAX_DECISION_RING}, got {obj.decision_ring_size}")
        if not obj.policy_poll_s > 0:
            raise ConfigError("policyPollS: must be positive")


SERVER_TIMEOUT_MAX_S = {
    "header_timeout_s": 60.0,
    "body_timeout_s": 300.0,
    "idle_timeout_s": 3600.0,
    "shutdown_timeout_s": 300.0,
}
"""Longest accepted value of each server timeout (``server.headerTimeoutS`` ...)."""
KUBE_RANGES: dict[str, tuple[float, float]] = {
    "list_timeout_s": (1.0, 600.0),
    "write_timeout_s": (0.5, 60.0),  # kube-scheduler waits httpTimeout for bind: keep it below that
    "watch_timeout_s": (1, 3600),
    "retry_backoff_s": (0.05, 30.0),  # 0 would retry a failing list or watch in a tight loop
    "assumed_ttl_s": (1.0, 3600.0),
    "api_connections": (1, 1024),
}
"""Accepted range of each ``kubernetes`` setting (inclusive)."""
MAX_CONNECTIONS = 65_536
"""Most connections a listener may be told to keep (``server.maxConnections``, ``statusMaxConnections``)."""
MAX_AUTH_CACHE_TTL_S = 3600.0
"""Longest a token review's answer may be reused (``auth.cacheTtlS``, ``negativeCacheTtlS``)."""
MAX_AUTH_AUDIENCES = 16
"""Most token audiences the status listener accepts (``auth.audiences``); each goes into every
TokenReview it asks."""
MAX_AUDIENCE_CHARS = 256
"""Longest accepted audience (a short name or a URL)."""
AUDIENCE = re.compile(r"[\x21-\x7e]+")
"""An audience: visible ASCII, no spaces (what a JWT's ``aud`` and ``kubectl create token --audience`` carry)."""
MAX_DECISION_RING = 1_000_000
"""Most decision records kept in memory (``decisionRingSize``)."""


def is_loopback(host: str) -> bool:
    """``host`` names this machine only: ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_complete(settings: ExtenderSettings) -> ExtenderSettings:
    """Checks across keys that may come from different sources (file, environment, flags), so they run
    once everything is merged: the TLS files come as a set (each listener's), the verbs leave loopback
    only with them, and the status listener accepts some token audience."""
    tls = settings.server.tls
    given = {camel(n): getattr(tls, n) for n in ("cert_file", "key_file", "client_ca_file")}
    if any(given.values()) and not all(given.values()):
        missing = ", ".join(f"server.tls.{k}" for k, v in given.items() if not v)
        raise ConfigError(
            f"{missing}: mutual TLS needs certFile, keyFile and clientCaFile together "
            "(a server certificate without client verification would authenticate no caller)"
        )
    status_tls = settings.server.status_tls
    if bool(status_tls.cert_file) != bool(status_tls.key_file):
        missing = "keyFile" if status_tls.cert_file else "certFile"
        raise ConfigError(
            f"server.statusTls.{missing}: HTTPS on the status listener needs certFile and keyFile together "
            "(set both, or neither for plain HTTP)"
        )
    if not tls.cert_file and not is_loopback(settings.server.host):
        # bind changes the cluster, and without mutual TLS the verbs authenticate no caller: anyone who
        # reached the port could place or bind pods.
        raise ConfigError(
            f"server.host: {settings.server.host!r} is not a loopback address, and without server.tls the "
            "verbs (filter, prioritize, bind, preempt) authenticate no caller; keep them on 127.0.0.1 (a "
            "sidecar of kube-scheduler) or set server.tls.certFile, keyFile and clientCaFile (mutual TLS)"
        )
    if not settings.auth.api_server_audience and not settings.auth.audiences:
        raise ConfigError(
            "auth.apiServerAudience: false with no auth.audiences would refuse every token; list the "
            "audiences to accept in auth.audiences (e.g. [rlsched-extender]) or set apiServerAudience true"
        )
    if settings.auth.mode == "none" and not is_loopback(settings.server.status_host):
        # /status and /decisions show pod names and decision features: off loopback they need a token.
        # server.statusTls changes nothing here: TLS hides the answers from the wire, not from the caller.
        raise ConfigError(
            f"server.statusHost: {settings.server.status_host!r} is not a loopback address, and with auth.mode "
            "none /status and /decisions answer anyone who reaches it; set auth.mode kubernetes or keep the "
            "status listener on 127.0.0.1"
        )
    return settings


SHA256_HEX = re.compile(r"[0-9a-f]{64}")
"""A sha256 digest as ``sha256sum`` prints it (``policy.modelSha256``)."""
MAX_YAML_BYTES = 256 * 1024
"""Largest settings or policy file read (they are a few KiB): a larger one is refused unread."""
MAX_DEADLINE_MS = 10_000.0
"""Longest decision deadline (``policy.deadlineMs``): kube-scheduler's extender call times out first."""


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases (``*name``): settings never need them, and a few nested anchors in a
    few hundred bytes expand to gigabytes (a "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed here", event.start_mark)
        return super().compose_node(parent, index)


def read_yaml(path: str | Path, what: str = "config file") -> Mapping[str, Any]:
    """A YAML mapping from ``path`` (empty file → {}); ConfigError says what is wrong and where.
    At most :data:`MAX_YAML_BYTES`, no aliases."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:
            raise ConfigError(f"{what} {path}: larger than {MAX_YAML_BYTES // 1024} KiB; not read")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader, without aliases
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path}: not valid YAML: {str(exc)[:400]}") from None
    except RecursionError:  # [[[…]]] a few hundred deep: the loader recurses several calls per level
        raise ConfigError(f"{what} {path}: YAML nested too deeply to parse") from None
    except MemoryError:
        raise ConfigError(f"{what} {path}: YAML too large to parse") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what} {path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def load_settings(
    path: str | Path | None = None, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> ExtenderSettings:
    """Defaults ← YAML file ← ``RLSCHED_*`` from ``env`` ← ``overrides`` (dotted camelCase keys)."""
    settings = ExtenderSettings()
    if path:
        try:
            settings = merge(settings, read_yaml(path))
        except ConfigError as exc:
            if str(exc).startswith("config file"):
                raise
            raise ConfigError(f"config file {path}: {exc}") from None
    for key, value in env_overrides(env or {}).items():
        settings = merge(settings, _nest(key, value), "")
    for key, value in (overrides or {}).items():
        if value is not None:
            settings = merge(settings, _nest(key, value), "")
    return check_complete(settings)


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    parts = dotted.split(".")
    out: dict[str, Any] = {parts[-1]: value}
    for p in reversed(parts[:-1]):
        out = {p: out}
    return out


def env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """``RLSCHED_SERVER_STATUS_PORT=9000`` → ``{"server.statusPort": "9000"}`` for every known setting.

    Unknown ``RLSCHED_*`` names are ignored (other parts of the project use the prefix too).
    """
    known = {}
    for path in setting_paths(ExtenderSettings):
        env_name = "RLSCHED_" + re.sub(r"([A-Z])", r"_\1", path.replace(".", "_")).upper()
        known[env_name] = path
    return {known[k]: v for k, v in env.items() if k in known and v != ""}


def setting_paths(cls: type, prefix: str = "") -> list[str]:
    """Every dotted camelCase path of scalar settings (``server.statusPort`` …)."""
    out = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + camel(f.name)
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.extend(setting_paths(hint, key + "."))
        else:
            out.append(key)
    return out


def load_policy_file(path: str | Path, base: PolicySettings) -> PolicySettings:
    """Policy settings from the operator's policy file, on top of ``base``.

    A policy file that does not exist (yet) means "no overrides": the operator creates it after the
    scheduler pod may already be running, and its ConfigMap volume may be mounted empty.
    """
    if not Path(path).exists():
        return base
    data = read_yaml(path, "policy file")
    try:
        return merge(base, data, "")
    except ConfigError as exc:
        raise ConfigError(f"policy file {path}: {exc}") from None


def getenv() -> Mapping[str, str]:
    """The process environment (only the CLI calls this)."""
    return dict(os.environ)
