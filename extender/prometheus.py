"""Per-node load from Prometheus, refreshed in the background into ``ClusterState.load``.

One instant query per load column (``cpu``, ``memory``, ``network``, ``disk``; PromQL configurable,
defaults built on node-exporter). Each result series is matched to a node by its labels (``node``,
``nodename``, ``kubernetes_node``, then ``instance`` with the port stripped, against node names and
addresses). A node's value is kept with the time it was fetched; values older than ``staleAfterS``
become NaN. Nothing here ever blocks scheduling: a failed or slow query leaves the previous values
to age out, and every gap is reported (``/status``, ``rlsched_extender_load_*`` metrics).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rlsched.policy.cluster import LOAD_METRICS

from .bounded_read import read_capped
from .rejections import describe
from .settings import PrometheusSettings

log = logging.getLogger("rlsched.extender.prometheus")

SERIES_PER_NODE = 4
SERIES_SLACK = 1000
"""A load column's answer may hold ``SERIES_PER_NODE × nodes + SERIES_SLACK`` series: one per node is
what a query aggregated per node returns; far more is a query that is not (per CPU, per device)."""
BYTES_PER_SERIES = 512
"""Bytes allowed per allowed series (one with a few labels is ~150): the cap on a load answer's size,
checked before it is read, so a wrong query cannot stall the event loop decoding tens of megabytes."""
MAX_ANSWER_BYTES = 64 << 20
"""The cap on other queries' answers (:meth:`LoadPoller.query`: one series per pod)."""


@dataclass
class ColumnStatus:
    """The state of one load column."""

    last_success: float | None = None
    last_error: str | None = None
    series: int = 0
    matched: int = 0
    unmatched: list[str] = field(default_factory=list)
    out_of_range: int = 0
    """Values of the last round outside 0..1 or not finite (clamped, or skipped)."""
    duplicates: int = 0
    """Series of the last round for a node that already had one (the higher value is kept)."""


def vector_samples(body: Any, max_series: int | None = None) -> tuple[list[tuple[Mapping[str, Any], float]], bool]:
    """Each series of an instant-vector answer (``/api/v1/query``) as (labels, value); the value is NaN
    where it is not a number, the labels empty where they are not an object. The flag says whether
    more than ``max_series`` came back (the rest is not read). Any other answer raises ValueError."""
    if not isinstance(body, Mapping) or body.get("status") != "success":
        raise ValueError(f"Prometheus answered {str(body)[:200]}")
    data = body.get("data")
    data = data if isinstance(data, Mapping) else {}
    if data.get("resultType") != "vector" or not isinstance(data.get("result") or [], list):
        raise ValueError(f"query must return an instant vector, got {data.get('resultType')}")
    result = data.get("result") or []
    cut = max_series is not None and len(result) > max_series
    out: list[tuple[Mapping[str, Any], float]] = []
    for series in result[:max_series] if cut else result:
        labels = series.get("metric") if isinstance(series, Mapping) else None
        value = series.get("value") if isinstance(series, Mapping) else None
        number = math.nan
        if isinstance(value, list) and len(value) == 2 and not isinstance(value[1], bool):
            try:  # the API sends the value as a string; a JSON true or false is not a value
                number = float(value[1])
            except (TypeError, ValueError):
                pass
        out.append((labels if isinstance(labels, Mapping) else {}, number))
    return out, cut


class LoadPoller:
    """Queries Prometheus and hands per-node rows to ``sink`` (``ClusterCache.set_load``)."""

    def __init__(
        self,
        settings: PrometheusSettings,
        nodes: Callable[[], Mapping[str, list[str]]],
        sink: Callable[[dict[str, np.ndarray]], None],
        metrics: Any = None,
        clock: Callable[[], float] = time.time,
        query: Callable[[str], Any] | None = None,
    ):
        self.settings = settings
        self.nodes = nodes
        """() → node name → addresses (InternalIP, Hostname …)."""
        self.sink = sink
        self.metrics = metrics
        self.clock = clock
        self._custom_query = query
        """Answers a query with the decoded JSON (tests, the rebalancer's ``load_query``); no byte cap applies."""
        self._query = query or self._http_query
        self._session: aiohttp.ClientSession | None = None
        self.values: dict[str, dict[str, tuple[float, float]]] = {c: {} for c in LOAD_METRICS}
        """column → node → (value, fetched at)."""
        self.columns = {c: ColumnStatus() for c in LOAD_METRICS}
        self._refresh_error: str | None = None

    async def _http_query(self, promql: str, max_bytes: int = MAX_ANSWER_BYTES) -> Any:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        url = self.settings.url.rstrip("/") + "/api/v1/query"  # type: ignore[union-attr]
        async with self._session.get(
            url, params={"query": promql}, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s)
        ) as resp:
            if resp.status != 200:
                head = await resp.content.read(200)
                raise RuntimeError(f"HTTP {resp.status}: {head.decode('utf-8', 'replace')}")
            return orjson.loads(await read_capped(resp, max_bytes))

    async def _fetch(self, promql: str, max_bytes: int) -> Any:
        if self._custom_query is not None:
            return await self._custom_query(promql)
        return await self._http_query(promql, max_bytes)

    async def query(self, promql: str) -> Any:
        """One instant query (the decoded JSON answer), with the settings' timeout: for other readers
        of the same Prometheus (the operator's per-pod CPU use)."""
        return await asyncio.wait_for(self._query(promql), self.settings.timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _aliases(self) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for name, addresses in self.nodes().items():
            for a in addresses:
                aliases.setdefault(a, name)
        for name in self.nodes():
            aliases[name] = name
        return aliases

    def _match(self, labels: Mapping[str, Any], aliases: Mapping[str, str]) -> str | None:
        for key in self.settings.node_labels:
            value = labels.get(key)
            if not value or not isinstance(value, str):
                continue
            if value in aliases:
                return aliases[value]
            host = value.rsplit(":", 1)[0] if value.count(":") == 1 or value.startswith("[") else value
            host = host.strip("[]")
            if host in aliases:
                return aliases[host]
        return None

    async def refresh(self) -> None:
        """One round over every configured column; results go to ``sink``. A column that fails keeps
        its previous values (to age out) and says why in its status; the others go on."""
        aliases = self._aliases()
        now = self.clock()
        max_series = SERIES_PER_NODE * len(self.nodes()) + SERIES_SLACK
        for column in LOAD_METRICS:
            promql = self.settings.queries.get(column)
            status = self.columns[column]
            if not promql:
                continue
            try:
                body = await asyncio.wait_for(
                    self._fetch(promql, max_series * BYTES_PER_SERIES), self.settings.timeout_s
                )
                samples, cut = vector_samples(body, max_series)
                if cut:
                    raise ValueError(
                        f"more than {max_series:,} series: aggregate the query per node (e.g. avg by (instance))"
                    )
                fresh, unmatched, out_of_range, duplicates = self._read(samples, aliases)
                if out_of_range * 2 > max(len(fresh), out_of_range):  # most of them: the query is wrong
                    raise ValueError(
                        f"{out_of_range} of {max(len(fresh), out_of_range)} values are outside 0..1 or not finite; "
                        "the query must give a fraction per node (a percent-scale query?)"
                    )
            except Exception as exc:  # noqa: BLE001 - a failed query only ages the column out
                self._failed(column, describe(exc))
                continue
            status.out_of_range, status.duplicates = out_of_range, duplicates
            self.values[column].update((node, (value, now)) for node, value in fresh.items())
            if status.last_error is not None:
                log.info("load query %s works again", column, extra={"event": "load_query_recovered", "column": column})
            status.last_success, status.last_error = now, None
            status.series, status.matched, status.unmatched = len(samples), len(fresh), unmatched
            self._count(column, "ok")
        self.publish()

    def _read(
        self, samples: list[tuple[Mapping[str, Any], float]], aliases: Mapping[str, str]
    ) -> tuple[dict[str, float], list[str], int, int]:
        """node → value (clamped to 0..1) of the series that name a node, the first few that do not,
        how many values were outside 0..1 or infinite, and how many series repeated a node."""
        fresh: dict[str, float] = {}
        unmatched: list[str] = []
        out_of_range = duplicates = 0
        for labels, value in samples:
            if math.isnan(value):
                continue
            node = self._match(labels, aliases)
            if node is None:
                if len(unmatched) < 5:
                    unmatched.append(",".join(f"{k}={v}" for k, v in sorted(labels.items()))[:120])
                continue
            if not 0.0 <= value <= 1.0:
                out_of_range += 1
                if not math.isfinite(value):
                    continue
            clamped = min(max(value, 0.0), 1.0)
            if node in fresh:
                duplicates += 1
                clamped = max(clamped, fresh[node])
            fresh[node] = clamped
        return fresh, unmatched, out_of_range, duplicates

    def _failed(self, column: str, error: str) -> None:
        status = self.columns[column]
        # Once per new failure, not every interval while Prometheus stays down.
        level = logging.WARNING if error != status.last_error else logging.DEBUG
        status.last_error = error
        self._count(column, "error")
        log.log(
            level,
            "load query %s failed: %s (values age out after %.0f s)",
            column,
            error,
            self.settings.stale_after_s,
            extra={"event": "load_query_failed", "column": column},
        )

    def publish(self) -> None:
        """Hand the fresh values to the sink (stale ones as NaN)."""
        now = self.clock()
        rows: dict[str, np.ndarray] = {}
        names = self.nodes()
        for j, column in enumerate(LOAD_METRICS):
            for node, (value, at) in list(self.values[column].items()):
                if node not in names:
                    del self.values[column][node]
                    continue
                if now - at > self.settings.stale_after_s:
                    continue
                row = rows.get(node)
                if row is None:
                    row = rows[node] = np.full(len(LOAD_METRICS), np.nan)
                row[j] = value
        self.sink(rows)

    async def run(self) -> None:
        """Background task: refresh every ``intervalS``; never raises."""
        while True:
            try:
                await self.refresh()
                self._refresh_error = None
            except Exception as exc:  # noqa: BLE001 - the poller must survive anything
                error = describe(exc)
                if error != self._refresh_error:  # once per new failure, not every interval
                    log.exception("load refresh failed", extra={"event": "load_refresh_failed"})
                self._refresh_error = error
            await asyncio.sleep(self.settings.interval_s)

    def status(self) -> dict[str, Any]:
        now = self.clock()
        nodes = len(self.nodes())
        out: dict[str, Any] = {
            "url": self.settings.url,
            "staleAfterSeconds": self.settings.stale_after_s,
            "columns": {},
        }
        for column in LOAD_METRICS:
            s = self.columns[column]
            fresh = sum(1 for _, at in self.values[column].values() if now - at <= self.settings.stale_after_s)
            out["columns"][column] = {
                "configured": bool(self.settings.queries.get(column)),
                "ageSeconds": None if s.last_success is None else round(now - s.last_success, 3),
                "freshNodes": fresh,
                "missingNodes": nodes - fresh,
                "series": s.series,
                "unmatchedSeries": s.unmatched,
                "outOfRangeValues": s.out_of_range,
                "duplicateSeries": s.duplicates,
                "lastError": s.last_error,
            }
        return out

    def collect(self) -> list[Metric]:
        """Scrape-time gauges: per column, nodes with a fresh value, without one, and the age of the
        last successful query."""
        fresh = GaugeMetricFamily(
            "rlsched_extender_load_fresh_nodes", "Nodes with a fresh load value", labels=["column"]
        )
        missing = GaugeMetricFamily(
            "rlsched_extender_load_missing_nodes", "Nodes whose load value is missing or stale", labels=["column"]
        )
        age = GaugeMetricFamily(
            "rlsched_extender_load_age_seconds",
            "Seconds since the last successful query (+Inf: never)",
            labels=["column"],
        )
        for column, c in self.status()["columns"].items():
            fresh.add_metric([column], c["freshNodes"])
            missing.add_metric([column], c["missingNodes"])
            age.add_metric([column], float("inf") if c["ageSeconds"] is None else c["ageSeconds"])
        return [fresh, missing, age]

    def _count(self, column: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.load_refreshes.labels(column, result).inc()
