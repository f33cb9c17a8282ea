"""Prometheus metrics of the extender, in a registry of their own (tests build as many as they like)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds; dense below 15 ms where the filter/prioritize targets are."""

BAD_HTTP_VERB = "http"
"""The ``verb`` of ``bad_requests_total`` for a request that is not valid HTTP (either listener)."""


class Metrics:
    """Every metric the extender exports."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.latency = Histogram(
            "rlsched_extender_request_seconds",
            "Time to answer one extender call, by verb and HTTP code",
            ["verb", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bad_requests = Counter(
            "rlsched_extender_bad_requests_total",
            'Requests answered 400/408/413/415, by verb: "other" another path (the status listener), '
            '"http" not valid HTTP (a bad request line, header or chunk size; aiohttp answers 400 and '
            "closes the connection)",
            ["verb"],
            registry=r,
        )
        self.bad_requests.labels(BAD_HTTP_VERB)
        self.decisions = Counter(
            "rlsched_extender_decisions_total",
            "Filter decisions by outcome: policy, fallback, unschedulable, delayed, rejected, invalid, awaiting_bind",
            ["outcome"],
            registry=r,
        )
        self.fallbacks = Counter(
            "rlsched_extender_fallbacks_total",
            "Decisions served by the fallback heuristic, by reason",
            ["reason"],
            registry=r,
        )
        self.shadow = Counter(
            "rlsched_extender_shadow_total",
            "Shadow mode: did the policy agree with the served heuristic",
            ["result"],
            registry=r,
        )
        self.load_explained = Counter(
            "rlsched_extender_load_explained_total",
            "explainLoad: decisions made with node load known, by whether deciding without it picks another node",
            ["changed"],
            registry=r,
        )
        self.binds = Counter(
            "rlsched_extender_binds_total",
            "Bind calls by result (ok, error, uncertain, duplicate, refused)",
            ["result"],
            registry=r,
        )
        self.binding_write = Histogram(
            "rlsched_extender_binding_write_seconds",
            "Time of bind's one API write (POST pods/binding), request sent to answer read, by result "
            "(ok, error, uncertain)",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.api_slot_wait = Histogram(
            "rlsched_extender_api_slot_wait_seconds",
            "Time a call to the API server waited for one of the extender's connections (only calls that "
            "had to wait: all were busy)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.preempt_nodes = Counter(
            "rlsched_extender_preempt_nodes_total", "Preemption candidates kept or dropped", ["result"], registry=r
        )
        self.policy_ms = Histogram(
            "rlsched_extender_policy_seconds",
            "Time the learned policy took per decision",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.model_reloads = Counter(
            "rlsched_extender_model_reloads_total", "Model (re)loads by result", ["result"], registry=r
        )
        self.policy_reloads = Counter(
            "rlsched_extender_policy_reloads_total", "Policy file reloads by result", ["result"], registry=r
        )
        self.model_info = Gauge(
            "rlsched_extender_model_info",
            "The loaded model (1) with its version and digest",
            ["version", "digest", "mode"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "rlsched_extender_watch_restarts_total",
            "Watch restarts by resource and reason",
            ["resource", "reason"],
            registry=r,
        )
        self.objects_rejected = Counter(
            "rlsched_extender_objects_rejected_total",
            "Watched objects (one count per unreadable content, not per event) that could not be read, by "
            "kind and reason "
            "(quantity, field, placement-rules, gpu-request, event, unexpected); the log line says what "
            "was done with each (ignored, kept unschedulable, counted as whole cards)",
            ["kind", "reason"],
            registry=r,
        )
        self.load_refreshes = Counter(
            "rlsched_extender_load_queries_total",
            "Prometheus load queries by column and result",
            ["column", "result"],
            registry=r,
        )
        self.load_series = Counter(
            "rlsched_extender_load_series_total",
            "Series of accepted Prometheus load answers by column and outcome (ok, clamped, out_of_range, "
            "duplicate, unmatched, nan, invalid; one each, the first that applies)",
            ["column", "outcome"],
            registry=r,
        )
        self.status_tls_reloads = Counter(
            "rlsched_extender_status_tls_reloads_total",
            "Reloads of the status listener's certificate after its files changed (server.statusTls), by "
            "result: ok, error (the files do not load; the previous certificate keeps serving)",
            ["result"],
            registry=r,
        )
        for result in ("ok", "error"):
            self.status_tls_reloads.labels(result)
        self._model_labels: tuple[str, str, str] | None = None
        self._collectors: list[Callable[[], list[Metric]]] = []
        r.register(_Callback(self._collectors))

    def set_model(self, info: Any, mode: str) -> None:
        """Model info gauge: one series for the loaded model (version "none" without one)."""
        labels = (str(info.version), str(info.digest)[:16], mode) if info is not None else ("none", "none", mode)
        if self._model_labels is not None and self._model_labels != labels:
            self.model_info.remove(*self._model_labels)
        self.model_info.labels(*labels).set(1)
        self._model_labels = labels

    def add_collector(self, fn: Callable[[], list[Metric]]) -> None:
        """``fn()`` returns metric families built at scrape time (cache size and age, load coverage)."""
        self._collectors.append(fn)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Callback:
    def __init__(self, fns: list[Callable[[], list[Metric]]]):
        self.fns = fns

    def collect(self) -> Iterator[Metric]:  # noqa: D401 - prometheus_client collector protocol
        for fn in self.fns:
            yield from fn()

    def describe(self) -> list[Metric]:
        return []


def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    """One gauge family with one sample (for scrape-time collectors)."""
    if labels:
        g = GaugeMetricFamily(name, doc, labels=list(labels))
        g.add_metric(list(labels.values()), value)
        return g
    return GaugeMetricFamily(name, doc, value=value)
