"""Load from Prometheus under real-world answers: jitter just outside 0..1, answers with many tiny
series, large error answers, hung queries, a wall clock stepped back, failures whose text changes
every round, and series that are counted rather than silently dropped."""

from __future__ import annotations

import asyncio
import heapq
import importlib
import logging
import time
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.extender.metrics import Metrics
from rlsched.extender.settings import ConfigError, ExtenderSettings, PrometheusSettings, build

prom = importlib.import_module("rlsched.extender.prometheus")
"""The module under test, by name: names added by these fixes are looked up inside each test."""
LoadPoller = prom.LoadPoller
COLUMNS = {"cpu": "cpu", "memory": "mem", "network": "net", "disk": "disk"}


def vector(*series: tuple[dict[str, Any], Any]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [1700000000.0, str(v)]} for m, v in series]},
    }


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def poller(answers: dict[str, Any], nodes: dict[str, list[str]], clock: Clock | None = None, **settings: Any):
    sink: dict[str, Any] = {}

    async def query(promql: str) -> Any:
        answer = answers[promql]
        answer = answer() if callable(answer) else answer
        if isinstance(answer, Exception):
            raise answer
        return answer

    s = PrometheusSettings(url="http://prom", queries={c: q for c, q in COLUMNS.items() if q in answers}, **settings)
    p = LoadPoller(s, lambda: nodes, lambda rows: sink.update(rows=rows), Metrics(), clock or Clock(), query)
    return p, sink


def series_counts(p: Any) -> dict[tuple[str, str], float]:
    out = {}
    for family in p.metrics.registry.collect():
        if family.name == "rlsched_extender_load_series":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["column"], s.labels["outcome"])] = s.value
    return out


# -- 1. jitter just outside 0..1 is not a percent-scale query ---------------------------------------


async def test_small_overshoots_are_clamped_and_counted_not_a_wrong_scale() -> None:
    """An idle node's ``1 - avg(rate(idle))`` is −0.0004 and a saturated disk's io_time rate 1.003: the
    column used to fail as "percent scale", leaving load NaN on every node."""
    ten = {f"n{i}": [] for i in range(10)}
    p, sink = poller(
        {
            "cpu": vector(
                *[({"node": f"n{i}"}, -0.0004) for i in range(6)], *[({"node": f"n{i}"}, 0.05) for i in range(6, 10)]
            ),
            "disk": vector(
                *[({"node": f"n{i}"}, 1.01) for i in range(6)], *[({"node": f"n{i}"}, 0.5) for i in range(6, 10)]
            ),
        },
        ten,
    )
    await p.refresh()
    st = p.status()["columns"]
    assert st["cpu"]["lastError"] is None and st["cpu"]["freshNodes"] == 10
    assert st["disk"]["lastError"] is None and st["disk"]["freshNodes"] == 10
    assert sink["rows"]["n0"][0] == 0.0 and sink["rows"]["n0"][3] == 1.0 and sink["rows"]["n9"][3] == 0.5
    assert st["cpu"]["clampedValues"] == 6 and st["cpu"]["outOfRangeValues"] == 0
    counts = series_counts(p)
    assert counts[("cpu", "clamped")] == 6 and counts[("cpu", "ok")] == 4 and counts[("disk", "clamped")] == 6


async def test_one_node_far_outside_is_counted_and_the_column_stays(caplog) -> None:
    """A node whose NIC is faster than the network query's divisor assumes reads 2.5: that node is
    clamped and counted (and logged, at most once per few minutes), the column is not refused."""
    nodes = {"a": [], "b": [], "c": []}
    clock = Clock()
    p, sink = poller({"net": vector(({"node": "a"}, 2.5), ({"node": "b"}, 0.2), ({"node": "c"}, 0.3))}, nodes, clock)
    with caplog.at_level(logging.DEBUG, logger="rlsched.extender.prometheus"):
        for _ in range(4):
            await p.refresh()
            clock.t += 15
    st = p.status()["columns"]["network"]
    assert st["lastError"] is None and st["freshNodes"] == 3 and st["outOfRangeValues"] == 1
    assert sink["rows"]["a"][2] == 1.0
    assert series_counts(p)[("network", "out_of_range")] == 4
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


# -- 2. too many series are refused before decoding ----------------------------------------------------


async def test_an_answer_of_many_tiny_series_is_refused_before_it_is_decoded(monkeypatch) -> None:
    """``{"metric":{},"value":[0,"0"]}`` is 30 bytes: an answer under the byte cap held ~17× the allowed
    series and was decoded whole on the event loop (1–1.4 s per column at 5,000 nodes) before the
    series limit was checked."""
    nodes = {"node-a": ["10.0.0.1"]}
    allowed = prom.SERIES_PER_NODE * len(nodes) + prom.SERIES_SLACK
    cap = allowed * prom.BYTES_PER_SERIES
    one = b'{"metric":{},"value":[0,"0"]}'
    count = (cap - 100) // (len(one) + 1)
    assert count > 10 * allowed
    tiny = b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join([one] * count) + b"]}}"
    assert len(tiny) < cap
    decoded: list[int] = []

    class CountingOrjson:
        @staticmethod
        def loads(raw: Any) -> Any:
            decoded.append(len(raw))
            return orjson.loads(raw)

    monkeypatch.setattr(prom, "orjson", CountingOrjson)

    async def query(request: web.Request) -> web.StreamResponse:
        if request.query["query"] == "mem":
            return web.json_response(vector(({"node": "node-a"}, 0.25)))
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(0, len(tiny), 1 << 16):  # chunked: the client has to count as it reads
            await resp.write(tiny[i : i + (1 << 16)])
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as server:
        sink: dict[str, Any] = {}
        p = LoadPoller(
            PrometheusSettings(url=str(server.make_url("")), queries={"cpu": "cpu", "memory": "mem"}, timeout_s=5),
            lambda: nodes,
            lambda rows: sink.update(rows=rows),
        )
        await p.refresh()
        await p.close()
    st = p.status()["columns"]
    assert f"more than {allowed:,} series" in st["cpu"]["lastError"]
    assert all(n < 1000 for n in decoded)  # only the small memory answer was decoded
    assert sink["rows"]["node-a"][1] == 0.25


async def test_series_keys_split_between_chunks_are_counted_once() -> None:
    class Content:
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        async def iter_chunked(self, n: int):
            for c in self.chunks:
                yield c

    class Resp:
        content_length = None

        def __init__(self, chunks: list[bytes]) -> None:
            self.content = Content(chunks)

    body = b'[{"metric":{}},{"metric":{}},{"metric":{}}]'
    for cut in range(1, len(body)):
        chunks = [body[:cut], body[cut:]]
        assert await prom.read_counting(Resp(chunks), 1 << 20, 3) == body
        with pytest.raises(ValueError, match="more than 2 series"):
            await prom.read_counting(Resp(chunks), 1 << 20, 2)


async def test_a_large_answer_is_read_off_the_loop_with_the_same_result(monkeypatch) -> None:
    nodes = {f"node-{i}": [f"10.1.{i // 250}.{i % 250}"] for i in range(3000)}
    body = orjson.dumps(
        vector(
            *[
                ({"instance": f"10.1.{i // 250}.{i % 250}:9100", "job": "node-exporter"}, i % 97 / 100)
                for i in range(3000)
            ]
        )
    )
    assert len(body) > prom.OFF_LOOP_BYTES
    threads = []
    digest = LoadPoller._digest_raw

    def recording(self, *args: Any) -> Any:
        threads.append(__import__("threading").current_thread().name)
        return digest(self, *args)

    monkeypatch.setattr(LoadPoller, "_digest_raw", recording)

    async def query(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as server:
        sink: dict[str, Any] = {}
        p = LoadPoller(
            PrometheusSettings(url=str(server.make_url("")), queries={"cpu": "cpu"}, timeout_s=5),
            lambda: nodes,
            lambda rows: sink.update(rows=rows),
        )
        await p.refresh()
        await p.close()
    assert p.status()["columns"]["cpu"]["freshNodes"] == 3000
    assert sink["rows"]["node-5"][0] == 0.05 and threads and threads[0] != "MainThread"


# -- 3. an error answer is never turned into text whole -----------------------------------------------


def test_an_error_answer_is_described_by_its_error_type_and_text_only() -> None:
    class Tripwire:
        def __repr__(self) -> str:
            raise AssertionError("the whole answer was turned into text")

        __str__ = __repr__

    body = {"status": "error", "errorType": "bad_data", "error": "parse error " + "x" * 10_000, "data": [Tripwire()]}
    with pytest.raises(ValueError) as caught:
        prom.vector_samples(body)
    message = str(caught.value)
    assert "bad_data" in message and "parse error" in message and len(message) < 400
    with pytest.raises(ValueError) as caught:
        prom.vector_samples([Tripwire()] * 3)
    assert "list" in str(caught.value)


# -- 4. nothing is served past staleAfterS, even while a query hangs --------------------------------


async def test_values_age_out_while_a_round_hangs_in_a_query() -> None:
    """Rows were published only when a round ended: a round stuck in queries (up to every column's
    timeout) kept serving values past ``staleAfterS``."""
    clock = Clock()
    hang = asyncio.Event()
    state = {"calls": 0}

    async def slow() -> Any:
        state["calls"] += 1
        if state["calls"] > 1:
            await hang.wait()  # never set: the round hangs in its second query
        return vector(({"node": "a"}, 0.9))

    sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
    order = iter(range(10**6))

    async def sleep(seconds: float) -> None:  # virtual time: the test moves the clock to the next wake-up
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(sleepers, (clock.t + seconds, next(order), wake))
        await wake

    published: list[tuple[float, set[str], int]] = []
    settings = PrometheusSettings(url="http://p", queries={"cpu": "cpu"}, interval_s=15, timeout_s=30, stale_after_s=60)
    p = LoadPoller(
        settings,
        lambda: {"a": []},
        lambda rows: published.append((clock.t, set(rows), state["calls"])),
        None,
        clock,
        lambda q: slow(),
        sleep,
    )
    task = asyncio.ensure_future(p.run())
    try:
        for _ in range(10):
            for _ in range(20):  # let every task run until it waits
                await asyncio.sleep(0)
            if len(published) > 1:
                break
            at, _, wake = heapq.heappop(sleepers)
            clock.t = max(clock.t, at)
            wake.set_result(None)
        assert published[0] == (1000.0, {"a"}, 1)
        at, rows, calls = published[1]
        assert calls == 2 and not hang.is_set()  # published while the second round still waits
        assert rows == set() and 1060 < at <= 1060 + 2 * prom.AGE_OUT_SLACK_S
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("prometheus", "message"),
    [
        ({"timeoutS": float("inf")}, "timeoutS: must be a positive, finite"),
        ({"timeoutS": float("nan")}, "timeoutS: must be a positive, finite"),
        ({"intervalS": 1e9, "timeoutS": 1e9}, "timeoutS: must be at most 60"),
        ({"staleAfterS": float("inf")}, "staleAfterS: must be a positive, finite"),
        ({"timeoutS": 30, "intervalS": 15}, "15 + 30 × 4 = 135 s"),
        ({"intervalS": 60, "staleAfterS": 10}, "staleAfterS: must be more than"),
    ],
)
def test_prometheus_timings_that_would_serve_stale_values_are_refused(prometheus: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        build(ExtenderSettings, {"prometheus": {"url": "http://p", **prometheus}})


def test_prometheus_timings_that_fit_are_accepted() -> None:
    ok = build(
        ExtenderSettings, {"prometheus": {"url": "http://p", "timeoutS": 30, "intervalS": 15, "staleAfterS": 300}}
    )
    assert ok.prometheus.timeout_s == 30
    two = {"cpu": "a", "memory": "b", "network": "", "disk": ""}  # two queries: 5 + 2 × 5 < 20
    build(ExtenderSettings, {"prometheus": {"intervalS": 5, "staleAfterS": 20, "queries": two}})
    build(ExtenderSettings, {})


# -- 5. ages do not follow the wall clock ---------------------------------------------------------------


def test_ages_are_measured_on_the_monotonic_clock() -> None:
    """With ``time.time`` a wall clock stepped back an hour kept a vanished node's value an hour."""
    p = LoadPoller(PrometheusSettings(url="http://p"), lambda: {}, lambda rows: None)
    assert p.clock is time.monotonic


# -- 6. logs throttled by time, every series counted --------------------------------------------------


async def test_failure_lines_are_throttled_by_time_even_when_the_text_changes(caplog) -> None:
    clock = Clock()
    ids = iter(range(10**6))
    flips = iter(range(10**6))
    p, _ = poller(
        {
            "cpu": lambda: RuntimeError(f"HTTP 502: upstream error, request id {next(ids):08x}"),
            "mem": lambda: RuntimeError("timeout") if next(flips) % 2 else vector(({"node": "a"}, 0.5)),
        },
        {"a": []},
        clock,
    )
    with caplog.at_level(logging.DEBUG, logger="rlsched.extender.prometheus"):
        for _ in range(20):  # 5 minutes at intervalS 15
            await p.refresh()
            clock.t += 15
    by = {
        (c, level): [r for r in caplog.records if r.levelno == level and getattr(r, "column", None) == c]
        for c in ("cpu", "memory")
        for level in (logging.WARNING, logging.INFO)
    }
    assert len(by["cpu", logging.WARNING]) == 1
    assert len(by["memory", logging.WARNING]) == 1 and len(by["memory", logging.INFO]) == 1
    clock.t += prom.LOG_EVERY_S
    with caplog.at_level(logging.DEBUG, logger="rlsched.extender.prometheus"):
        await p.refresh()
    last = [r for r in caplog.records if r.levelno == logging.WARNING and getattr(r, "column", None) == "cpu"][-1]
    assert "19 more since the last line" in last.getMessage()


async def test_every_series_is_counted_by_outcome() -> None:
    """Unmatched, clamped, duplicate, non-object and NaN series reached neither a log line nor a metric."""
    body = vector(
        ({"node": "n0"}, 1.2),
        ({"node": "n0"}, 0.3),
        ({"node": "ghost"}, 0.5),
        ({"node": "n1"}, "NaN"),
        ({"node": "n2"}, 1.001),
        ({"node": "n3"}, 0.2),
        ({"node": "n3"}, 0.1),
    )
    body["data"]["result"] += [7, None, "x", {"metric": {"node": "n1"}, "value": [1, [0.5]]}]
    p, sink = poller({"cpu": body}, {f"n{i}": [] for i in range(4)})
    await p.refresh()
    assert series_counts(p) == {
        ("cpu", "out_of_range"): 1,
        ("cpu", "ok"): 1,
        ("cpu", "unmatched"): 1,
        ("cpu", "nan"): 1,
        ("cpu", "clamped"): 1,
        ("cpu", "duplicate"): 2,
        ("cpu", "invalid"): 4,
    }
    st = p.status()["columns"]["cpu"]
    assert st["series"] == 11 and st["seriesOutcomes"]["invalid"] == 4 and st["duplicateSeries"] == 2
    assert sink["rows"]["n0"][0] == 1.0 and sink["rows"]["n2"][0] == 1.0 and sink["rows"]["n3"][0] == 0.2
    assert "rlsched_extender_load_series_total" in p.metrics.render().decode()


@pytest.mark.parametrize("result", ["missing", None, 0, {}, {"a": 1}, "xx"])
async def test_an_answer_without_a_list_of_series_is_a_shape_error(result: Any) -> None:
    """A missing, null or 0 ``result`` counted as a successful query with no series, and reset the
    column's age."""
    data: dict[str, Any] = {"resultType": "vector"}
    if result != "missing":
        data["result"] = result
    p, sink = poller({"cpu": {"status": "success", "data": data}}, {"a": []})
    await p.refresh()
    st = p.status()["columns"]["cpu"]
    assert "not a list of series" in st["lastError"] and st["ageSeconds"] is None
    assert 'rlsched_extender_load_queries_total{column="cpu",result="error"} 1.0' in p.metrics.render().decode()
    assert np.isnan(sink["rows"].get("a", [np.nan])[0])
