"""Per-node load from Prometheus, refreshed in the background into ``ClusterState.load``.

One instant query per load column (``cpu``, ``memory``, ``network``, ``disk``; PromQL configurable,
defaults built on node-exporter). Each result series is matched to a node by its labels (``node``,
``nodename``, ``kubernetes_node``, then ``instance`` with the port stripped, against node names and
addresses). A node's value is kept with the (monotonic) time it was fetched; values older than
``staleAfterS`` become NaN, also while a round is stuck in a slow query. Nothing here ever blocks
scheduling: a failed or slow query leaves the previous values to age out, and every gap is reported
(``/status``, ``rlsched_extender_load_*`` metrics).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rlsched.policy.cluster import LOAD_METRICS
from rlsched.policy.resources import clip

from .bounded_read import READ_CHUNK, AnswerTooLong
from .log_throttle import EveryFewSeconds, skipped_note
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
SERIES_KEY = b'"metric"'
"""Counted in a load answer's bytes as they arrive: each series has one ``"metric"`` key. The byte cap
alone does not bound the series: ``{"metric":{},"value":[0,"0"]}`` is 30 bytes, so an answer under
the cap could hold ~17× the allowed series, and decoding those (orjson holds the GIL, so a thread
does not help) stalled the loop for 1.0–1.4 s per column at 5,000 nodes. Counting is exact for what
Prometheus writes; a label key or value spelled ``metric`` only counts more (refused a little
early), and a key escaped to hide from the count is still caught after decoding."""
OFF_LOOP_BYTES = 256 << 10
"""A load answer larger than this is decoded and read in a worker thread: orjson holds the GIL while
it decodes, but reading the series into per-node values is Python code, which lets the event loop
in every few milliseconds instead of waiting for the whole answer."""

OVERSHOOT_TOLERANCE = 0.05
"""Values this far outside 0..1 are measurement jitter of a right query, clamped to 0..1 and counted
(``clamped``): ``1 - avg(rate(idle))`` on an idle node gives −0.0004, ``rate(io_time)`` on a saturated
disk 1.003 (rate() extrapolates to the window's edges from scrape times that jitter)."""
FAR_OUTSIDE = 0.5
"""A value below ``−FAR_OUTSIDE`` or above ``1 + FAR_OUTSIDE`` (or infinite) is far outside 0..1.
When more than half of a round's matched values are, the column fails: the query's scale is wrong
(a percent-scale query gives 1.5..100 on every node above 1.5 % busy). Fewer are one node's problem
and only counted (``out_of_range``, clamped, an infinite one skipped): one value cannot condemn the
column — the network query's divisor assumes 10 Gbit/s links, so a node with a faster NIC reads 2.5
or 10 when busy, and every other node's value is still right."""
LOG_EVERY_S = 300.0
"""A column's failure (or value-range) lines: at most one per this many seconds, with the number
left out. Errors whose text changes every round (a count, a proxy's request id) would otherwise log
every interval, and a flapping Prometheus a WARNING and an INFO line every other one."""
AGE_OUT_SLACK_S = 0.05
"""How long after a served value passes ``staleAfterS`` the rows are published again without it (a
timer's wake-up needs a margin): no value is served past ``staleAfterS`` + this + event-loop
latency, whatever a round's queries do."""
SERIES_OUTCOMES = ("ok", "clamped", "out_of_range", "duplicate", "unmatched", "nan", "invalid")
"""``rlsched_extender_load_series_total{outcome}``, one per series of an accepted round, the first that
applies: ``invalid`` (not an object, or its value not a number), ``nan`` (the value is NaN),
``unmatched`` (no node), ``out_of_range`` (beyond the tolerance: clamped, or skipped when infinite),
``clamped`` (within the tolerance), ``duplicate`` (a node that already had one: the higher value is
kept), ``ok``."""


@dataclass
class ColumnStatus:
    """The state of one load column."""

    last_success: float | None = None
    """Monotonic time of the last accepted round (``ageSeconds``)."""
    last_error: str | None = None
    series: int = 0
    matched: int = 0
    unmatched: list[str] = field(default_factory=list)
    out_of_range: int = 0
    """Values of the last round outside 0..1 beyond :data:`OVERSHOOT_TOLERANCE`, or infinite (clamped,
    or skipped)."""
    clamped: int = 0
    """Values of the last round outside 0..1 within the tolerance (clamped)."""
    duplicates: int = 0
    """Series of the last round for a node that already had one (the higher value is kept)."""
    outcomes: dict[str, int] = field(default_factory=dict)
    """The last accepted round's series by outcome (:data:`SERIES_OUTCOMES`)."""


@dataclass
class _Round:
    """One column's answer read into per-node values."""

    fresh: dict[str, float] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    series: int = 0
    out_of_range: int = 0
    clamped: int = 0
    duplicates: int = 0
    matched: int = 0
    """Series that named a node and carried a number (NaN excluded)."""
    far: int = 0
    """Of those, the values far outside 0..1 (:data:`FAR_OUTSIDE`)."""
    largest: float = -math.inf


def _text(value: object, limit: int = 200) -> str:
    """A string from an answer, cut to ``limit`` characters; any other value by :func:`clip` (never a
    whole structure turned into text)."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[: limit - 1] + "…"
    return clip(value)


def _too_many(max_series: int) -> str:
    return f"more than {max_series:,} series: aggregate the query per node (e.g. avg by (instance))"


def _vector_series(
    body: Any, max_series: int | None = None
) -> tuple[list[tuple[Mapping[str, Any] | None, float | None]], bool]:
    """:func:`vector_samples`, telling apart what it folds together: labels None for a series that is
    not an object, value None for one that is not a number (NaN stays NaN)."""
    if not isinstance(body, Mapping):
        raise ValueError(f"Prometheus answered {clip(body)}, not an object")
    if body.get("status") != "success":
        # errorType and error only: an error answer may carry megabytes of data, and turning all of it
        # into text to keep 200 characters held the loop for 200 ms (seconds at the 64 MiB cap)
        said = [_text(body.get("status"), 40)]
        said += [_text(body[k], limit) for k, limit in (("errorType", 40), ("error", 200)) if body.get(k) is not None]
        raise ValueError(f"Prometheus answered status {': '.join(said)}")
    data = body.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector":
        kind = data.get("resultType") if isinstance(data, Mapping) else None
        raise ValueError(f"query must return an instant vector, got {_text(kind, 40)}")
    result = data.get("result")
    if not isinstance(result, list):  # missing, null, 0, an object: not a vector (not "no series")
        raise ValueError(f"the answer's data.result is {clip(result)}, not a list of series")
    cut = max_series is not None and len(result) > max_series
    out: list[tuple[Mapping[str, Any] | None, float | None]] = []
    for series in result[:max_series] if cut else result:
        if not isinstance(series, Mapping):
            out.append((None, None))
            continue
        labels, value = series.get("metric"), series.get("value")
        number: float | None = None
        if isinstance(value, list) and len(value) == 2 and not isinstance(value[1], bool):
            raw = value[1]
            if not (isinstance(raw, str) and "_" in raw):  # Python reads "0_5" as 5.0; Prometheus never sends it
                try:  # the API sends the value as a string; a JSON true or false is not a value
                    number = float(raw)
                except (TypeError, ValueError, OverflowError):  # OverflowError: an integer of 400 digits
                    pass
        out.append((labels if isinstance(labels, Mapping) else {}, number))
    return out, cut


def vector_samples(body: Any, max_series: int | None = None) -> tuple[list[tuple[Mapping[str, Any], float]], bool]:
    """Each series of an instant-vector answer (``/api/v1/query``) as (labels, value); the value is NaN
    where it is not a number, the labels empty where they are not an object. The flag says whether
    more than ``max_series`` came back (the rest is not read). Any other answer raises ValueError,
    whose message quotes at most the answer's ``errorType`` and ``error`` (cut short)."""
    series, cut = _vector_series(body, max_series)
    return [({} if labels is None else labels, math.nan if v is None else v) for labels, v in series], cut


async def read_counting(resp: aiohttp.ClientResponse, max_bytes: int, max_series: int | None = None) -> bytes:
    """The whole answer, like :func:`~.bounded_read.read_capped` (:class:`AnswerTooLong` over
    ``max_bytes``), and ValueError as soon as the bytes read hold more than ``max_series`` series
    (:data:`SERIES_KEY`; None: not counted): refused before anything is decoded, the rest unread."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise AnswerTooLong(f"the answer has {resp.content_length:,} bytes, over the cap of {max_bytes:,}")
    data = bytearray()
    series = 0
    async for chunk in resp.content.iter_chunked(READ_CHUNK):
        start = max(len(data) - len(SERIES_KEY) + 1, 0)  # a key split between two chunks counts once
        data += chunk
        if len(data) > max_bytes:
            raise AnswerTooLong(f"the answer is longer than the cap of {max_bytes:,} bytes")
        if max_series is None:
            continue
        series += data.count(SERIES_KEY, start)
        if series > max_series:
            raise ValueError(_too_many(max_series))
    return bytes(data)


class LoadPoller:
    """Queries Prometheus and hands per-node rows to ``sink`` (``ClusterCache.set_load``)."""

    def __init__(
        self,
        settings: PrometheusSettings,
        nodes: Callable[[], Mapping[str, list[str]]],
        sink: Callable[[dict[str, np.ndarray]], None],
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        query: Callable[[str], Any] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        self.settings = settings
        self.nodes = nodes
        """() → node name → addresses (InternalIP, Hostname …)."""
        self.sink = sink
        self.metrics = metrics
        self.clock = clock
        """Ages and staleness: monotonic (a wall clock stepped back by an hour would keep a vanished
        node's value for that hour)."""
        self.sleep = sleep
        """Waits between rounds and until the next value goes stale (tests pass one that moves ``clock``)."""
        self._custom_query = query
        """Answers a query with the decoded JSON (tests, the rebalancer's ``load_query``); no byte cap applies."""
        self._query = query or self._http_query
        self._session: aiohttp.ClientSession | None = None
        self.values: dict[str, dict[str, tuple[float, float]]] = {c: {} for c in LOAD_METRICS}
        """column → node → (value, fetched at)."""
        self.columns = {c: ColumnStatus() for c in LOAD_METRICS}
        self._refresh_error: str | None = None
        self._quiet = EveryFewSeconds(LOG_EVERY_S, clock)
        self._served_until = math.inf
        """When the first value of the rows last handed to ``sink`` goes stale (:meth:`_age_out`)."""

    async def _get(self, promql: str, max_bytes: int, max_series: int | None = None) -> bytes:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        url = self.settings.url.rstrip("/") + "/api/v1/query"  # type: ignore[union-attr]
        async with self._session.get(
            url, params={"query": promql}, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s)
        ) as resp:
            if resp.status != 200:
                head = await resp.content.read(200)
                raise RuntimeError(f"HTTP {resp.status}: {head.decode('utf-8', 'replace')}")
            return await read_counting(resp, max_bytes, max_series)

    async def _http_query(self, promql: str, max_bytes: int = MAX_ANSWER_BYTES) -> Any:
        return orjson.loads(await self._get(promql, max_bytes))

    async def query(self, promql: str, max_series: int | None = None) -> Any:
        """One instant query (the decoded JSON answer), with the settings' timeout: for other readers
        of the same Prometheus (the operator's per-pod CPU use). An answer whose bytes hold more than
        ``max_series`` series is refused (ValueError) before it is decoded: 64 MiB of tiny series took
        seconds of the event loop to decode only to be cut."""
        return await asyncio.wait_for(self._query_counted(promql, max_series), self.settings.timeout_s)

    async def _query_counted(self, promql: str, max_series: int | None) -> Any:
        if self._custom_query is not None:
            return await self._custom_query(promql)
        raw = await self._get(promql, MAX_ANSWER_BYTES, max_series)
        if len(raw) <= OFF_LOOP_BYTES:
            return orjson.loads(raw)
        return await asyncio.get_running_loop().run_in_executor(None, orjson.loads, raw)

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
        max_series = SERIES_PER_NODE * len(self.nodes()) + SERIES_SLACK
        for column in LOAD_METRICS:
            promql = self.settings.queries.get(column)
            status = self.columns[column]
            if not promql:
                continue
            asked = self.clock()  # a value is as old as the query that fetched it
            try:
                got = await self._column(promql, aliases, max_series)
            except Exception as exc:  # noqa: BLE001 - a failed query only ages the column out
                self._failed(column, describe(exc))
                continue
            self.values[column].update((node, (value, asked)) for node, value in got.fresh.items())
            if status.last_error is not None:
                status.last_error = None
                skipped = self._quiet(f"recovered-{column}")
                if skipped is not None:
                    log.info(
                        "load query %s works again%s",
                        column,
                        skipped_note(skipped),
                        extra={"event": "load_query_recovered", "column": column},
                    )
            status.last_success = asked
            status.series, status.matched, status.unmatched = got.series, len(got.fresh), got.unmatched
            status.out_of_range, status.clamped, status.duplicates = got.out_of_range, got.clamped, got.duplicates
            status.outcomes = {k: got.outcomes[k] for k in SERIES_OUTCOMES if got.outcomes[k]}
            self._count(column, "ok")
            self._count_series(column, got.outcomes)
            if got.out_of_range:
                self._warn_range(column, got)
        self.publish()

    async def _column(self, promql: str, aliases: Mapping[str, str], max_series: int) -> _Round:
        """One column's query, read into per-node values. Refused before it is decoded when its bytes
        hold too many series (:func:`read_counting`); decoded and read off the loop when large."""
        timeout = self.settings.timeout_s
        if self._custom_query is not None:
            return self._digest(await asyncio.wait_for(self._custom_query(promql), timeout), aliases, max_series)
        raw = await asyncio.wait_for(self._get(promql, max_series * BYTES_PER_SERIES, max_series), timeout)
        if len(raw) <= OFF_LOOP_BYTES:
            return self._digest_raw(raw, aliases, max_series)
        return await asyncio.get_running_loop().run_in_executor(None, self._digest_raw, raw, aliases, max_series)

    def _digest_raw(self, raw: bytes, aliases: Mapping[str, str], max_series: int) -> _Round:
        return self._digest(orjson.loads(raw), aliases, max_series)

    def _digest(self, body: Any, aliases: Mapping[str, str], max_series: int) -> _Round:
        """A decoded answer read into a round; ValueError when it is not one to use (not a vector, too
        many series, values mostly far outside 0..1). Runs in a worker thread for a large answer: it
        reads only its arguments and the settings."""
        series, cut = _vector_series(body, max_series)
        if cut:  # the byte count missed them (a key written with escapes), or a custom query
            raise ValueError(_too_many(max_series))
        got = self._read(series, aliases)
        if got.far * 2 > got.matched:
            raise ValueError(
                f"{got.far} of {got.matched} values are far outside 0..1 (largest {got.largest:.6g}); "
                "the query must give a fraction per node (a percent-scale query?)"
            )
        return got

    def _read(self, series: list[tuple[Mapping[str, Any] | None, float | None]], aliases: Mapping[str, str]) -> _Round:
        """node → value (clamped to 0..1) of the series that name a node, the first few that do not,
        and what each series was (:data:`SERIES_OUTCOMES`)."""
        got = _Round(series=len(series))
        outcomes = got.outcomes
        low, high = -OVERSHOOT_TOLERANCE, 1.0 + OVERSHOOT_TOLERANCE
        for labels, value in series:
            if labels is None or value is None:
                outcomes["invalid"] += 1
                continue
            if math.isnan(value):
                outcomes["nan"] += 1
                continue
            node = self._match(labels, aliases)
            if node is None:
                outcomes["unmatched"] += 1
                if len(got.unmatched) < 5:
                    text = ",".join(f"{_text(k, 40)}={_text(v, 60)}" for k, v in list(labels.items())[:8])
                    got.unmatched.append(text[:120])
                continue
            got.matched += 1
            got.largest = max(got.largest, value)
            if not -FAR_OUTSIDE <= value <= 1.0 + FAR_OUTSIDE:
                got.far += 1
            outcome = "ok"
            if not low <= value <= high:
                got.out_of_range += 1
                outcome = "out_of_range"
                if not math.isfinite(value):
                    outcomes[outcome] += 1
                    continue
            elif not 0.0 <= value <= 1.0:
                got.clamped += 1
                outcome = "clamped"
            clamped = min(max(value, 0.0), 1.0)
            if node in got.fresh:
                got.duplicates += 1
                outcome = "duplicate" if outcome == "ok" else outcome
                clamped = max(clamped, got.fresh[node])
            got.fresh[node] = clamped
            outcomes[outcome] += 1
        return got

    def _failed(self, column: str, error: str) -> None:
        status = self.columns[column]
        first = status.last_error is None
        status.last_error = error
        self._count(column, "error")
        # At most once per LOG_EVERY_S per column (with the number left out), however the text changes.
        skipped = self._quiet(f"failed-{column}")
        log.log(
            logging.WARNING if skipped is not None else logging.DEBUG,
            "load query %s failed%s: %s (values age out after %.0f s)%s",
            column,
            "" if first else " again",
            error,
            self.settings.stale_after_s,
            skipped_note(skipped or 0),
            extra={"event": "load_query_failed", "column": column},
        )

    def _warn_range(self, column: str, got: _Round) -> None:
        skipped = self._quiet(f"range-{column}")
        if skipped is None:
            return
        log.warning(
            "load query %s: %d of %d values outside 0..1 (largest %.6g), clamped or skipped; "
            "the query must give a fraction per node%s",
            column,
            got.out_of_range,
            got.matched,
            got.largest,
            skipped_note(skipped),
            extra={"event": "load_values_out_of_range", "column": column},
        )

    def publish(self) -> None:
        """Hand the fresh values to the sink (stale ones as NaN)."""
        now = self.clock()
        stale_after = self.settings.stale_after_s
        until = math.inf
        rows: dict[str, np.ndarray] = {}
        names = self.nodes()
        for j, column in enumerate(LOAD_METRICS):
            for node, (value, at) in list(self.values[column].items()):
                if node not in names:
                    del self.values[column][node]
                    continue
                if now - at > stale_after:
                    continue
                until = min(until, at + stale_after)
                row = rows.get(node)
                if row is None:
                    row = rows[node] = np.full(len(LOAD_METRICS), np.nan)
                row[j] = value
        self._served_until = until
        self.sink(rows)

    async def _age_out(self) -> None:
        """Publish again as soon as a served value passes ``staleAfterS``. A round publishes when it
        ends, and it may spend every column's timeout in queries first: without this, a value went on
        being served that long past ``staleAfterS`` while a query hung."""
        while True:
            wait = self._served_until - self.clock()
            if wait >= 0:
                await self.sleep(min(wait, self.settings.stale_after_s) + AGE_OUT_SLACK_S)
                continue
            try:
                self.publish()
            except Exception:  # noqa: BLE001 - the sink failed; run() reports the same after its round
                self._served_until = math.inf
                log.debug("publishing aged load values failed", exc_info=True)

    async def run(self) -> None:
        """Background task: refresh every ``intervalS``, and age values out in between; never raises."""
        ager = asyncio.ensure_future(self._age_out())
        try:
            while True:
                try:
                    await self.refresh()
                    self._refresh_error = None
                except Exception as exc:  # noqa: BLE001 - the poller must survive anything
                    error = describe(exc)
                    if error != self._refresh_error:  # once per new failure, not every interval
                        log.exception("load refresh failed", extra={"event": "load_refresh_failed"})
                    self._refresh_error = error
                await self.sleep(self.settings.interval_s)
        finally:
            ager.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ager

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
                "clampedValues": s.clamped,
                "duplicateSeries": s.duplicates,
                "seriesOutcomes": s.outcomes,
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

    def _count_series(self, column: str, outcomes: Mapping[str, int]) -> None:
        if self.metrics is not None:
            for outcome, n in outcomes.items():
                self.metrics.load_series.labels(column, outcome).inc(n)
