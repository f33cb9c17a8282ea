"""Per-node load from Prometheus: matching series to nodes, staleness, failures that never block."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.extender.metrics import Metrics
from rlsched.extender.prometheus import BYTES_PER_SERIES, SERIES_PER_NODE, SERIES_SLACK, LoadPoller
from rlsched.extender.settings import PrometheusSettings

NODES = {"node-a": ["10.0.0.1", "node-a"], "node-b": ["10.0.0.2", "node-b"], "node-c": ["10.0.0.3"]}


def vector(*series):
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [1700000000.0, str(v)]} for m, v in series]},
    }


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def poller(answers, clock=None, **settings):
    sink = {}

    async def query(promql):
        answer = answers[promql]
        if isinstance(answer, Exception):
            raise answer
        return answer

    s = PrometheusSettings(
        url="http://prom", queries={"cpu": "cpu", "memory": "mem", "network": "net", "disk": "disk"}, **settings
    )
    p = LoadPoller(s, lambda: NODES, lambda rows: sink.update(rows=rows), Metrics(), clock or Clock(), query)
    return p, sink


async def test_series_are_matched_by_node_label_instance_or_address() -> None:
    p, sink = poller(
        {
            "cpu": vector(
                ({"instance": "10.0.0.1:9100"}, 0.5), ({"node": "node-b"}, 1.7), ({"instance": "elsewhere:9100"}, 0.3)
            ),
            "mem": vector(({"nodename": "node-c"}, 0.25)),
            "net": vector(({"kubernetes_node": "node-a"}, "NaN")),
            "disk": RuntimeError("connection refused"),
        }
    )
    await p.refresh()
    rows = sink["rows"]
    assert rows["node-a"][0] == 0.5 and rows["node-b"][0] == 1.0  # clamped to 0..1
    assert rows["node-c"][1] == 0.25 and np.isnan(rows["node-a"][2]) and np.isnan(rows["node-a"][3])
    st = p.status()["columns"]
    assert st["cpu"]["freshNodes"] == 2 and st["cpu"]["unmatchedSeries"] == ["instance=elsewhere:9100"]
    assert "connection refused" in st["disk"]["lastError"] and st["disk"]["missingNodes"] == 3


async def test_values_go_stale() -> None:
    clock = Clock()
    answers = {"cpu": vector(({"node": "node-a"}, 0.4)), "mem": vector(), "net": vector(), "disk": vector()}
    p, sink = poller(answers, clock, stale_after_s=60)
    await p.refresh()
    assert sink["rows"]["node-a"][0] == 0.4
    answers["cpu"] = RuntimeError("down")
    clock.t += 30
    await p.refresh()
    assert sink["rows"]["node-a"][0] == 0.4  # still fresh
    clock.t += 31
    await p.refresh()
    assert "node-a" not in sink["rows"]
    text = p.metrics.render().decode()
    assert 'rlsched_extender_load_queries_total{column="cpu",result="error"} 2.0' in text


async def test_bad_answers_are_reported() -> None:
    p, sink = poller(
        {
            "cpu": {"status": "error", "error": "parse error"},
            "mem": {"status": "success", "data": {"resultType": "matrix", "result": []}},
            "net": vector(),
            "disk": vector(),
        }
    )
    await p.refresh()
    st = p.status()["columns"]
    assert "parse error" in st["cpu"]["lastError"] and "instant vector" in st["memory"]["lastError"]
    fams = {f.name: f for f in p.collect()}
    assert {s.labels["column"]: s.value for s in fams["rlsched_extender_load_missing_nodes"].samples}["cpu"] == 3


async def test_http_query_against_a_fake_prometheus() -> None:
    async def query(request):
        assert request.query["query"] == "cpu"
        return web.json_response(vector(({"instance": "node-a:9100"}, 0.75)))

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as server:
        sink = {}
        p = LoadPoller(
            PrometheusSettings(url=str(server.make_url("")), queries={"cpu": "cpu"}, timeout_s=0.5),
            lambda: NODES,
            lambda rows: sink.update(rows=rows),
        )
        await p.refresh()
        await p.close()
    assert sink["rows"]["node-a"][0] == 0.75


async def test_label_values_that_are_not_strings_are_skipped() -> None:
    p, sink = poller(
        {
            "cpu": vector(
                ({"node": "node-a"}, 0.5),
                ({"node": ["node-b"]}, 0.7),
                ({"node": 7}, 0.7),
                ({"nodename": None, "instance": {"a": 1}}, 0.7),
                ({"node": ["x"], "instance": "10.0.0.2:9100"}, 0.25),  # the next label still counts
            ),
            "mem": vector(({"node": "node-c"}, 0.1)),
            "net": vector(),
            "disk": vector(),
        }
    )
    await p.refresh()
    rows = sink["rows"]
    assert rows["node-a"][0] == 0.5 and rows["node-b"][0] == 0.25 and rows["node-c"][1] == 0.1
    st = p.status()["columns"]["cpu"]
    assert st["lastError"] is None and st["freshNodes"] == 2 and len(st["unmatchedSeries"]) == 3


async def test_a_column_that_fails_while_read_is_reported_and_the_others_go_on(caplog) -> None:
    answers = {
        "cpu": vector(({"node": "boom"}, 0.5)),
        "mem": vector(({"node": "node-c"}, 0.25)),
        "net": vector(),
        "disk": vector(),
    }
    p, sink = poller(answers)
    match = p._match

    def exploding(labels, aliases):
        if labels.get("node") == "boom":
            raise TypeError("a bug while matching")
        return match(labels, aliases)

    p._match = exploding  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, logger="rlsched.extender.prometheus"):
        for _ in range(3):
            await p.refresh()
    assert sink["rows"]["node-c"][1] == 0.25
    st = p.status()["columns"]
    assert st["cpu"]["lastError"] == "TypeError: a bug while matching" and st["memory"]["lastError"] is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "a bug while matching" in warnings[0].getMessage()  # once, not every interval
    text = p.metrics.render().decode()
    assert 'rlsched_extender_load_queries_total{column="cpu",result="error"} 3.0' in text
    assert 'rlsched_extender_load_queries_total{column="memory",result="ok"} 3.0' in text


async def test_an_answer_with_far_more_series_than_nodes_is_refused() -> None:
    allowed = SERIES_PER_NODE * len(NODES) + SERIES_SLACK
    many = [({"node": "node-a", "cpu": str(i)}, 0.5) for i in range(allowed + 1)]
    p, sink = poller({"cpu": vector(*many), "mem": vector(*many[:allowed]), "net": vector(), "disk": vector()})
    await p.refresh()
    st = p.status()["columns"]
    assert f"more than {allowed:,} series" in st["cpu"]["lastError"] and st["cpu"]["freshNodes"] == 0
    assert st["memory"]["lastError"] is None and st["memory"]["series"] == allowed


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_http_answer_over_the_byte_cap_is_refused(chunked: bool) -> None:
    cap = (SERIES_PER_NODE * len(NODES) + SERIES_SLACK) * BYTES_PER_SERIES
    sent = []

    async def query(request):
        if request.query["query"] == "mem":
            return web.json_response(vector(({"node": "node-c"}, 0.25)))
        filler = b" " * (1 << 16)
        if not chunked:
            return web.Response(body=b"{" + filler * (cap // len(filler) + 1) + b"}", content_type="application/json")
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(4 * cap // len(filler)):  # no Content-Length: the client must stop reading itself
            await resp.write(filler)
            sent.append(len(filler))
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as server:
        sink = {}
        p = LoadPoller(
            PrometheusSettings(url=str(server.make_url("")), queries={"cpu": "cpu", "memory": "mem"}, timeout_s=5),
            lambda: NODES,
            lambda rows: sink.update(rows=rows),
        )
        await p.refresh()
        await p.close()
    st = p.status()["columns"]
    assert "cap" in st["cpu"]["lastError"] and f"{cap:,}" in st["cpu"]["lastError"]
    assert sink["rows"]["node-c"][1] == 0.25 and st["memory"]["lastError"] is None
    if chunked:
        assert sum(sent) < 4 * cap  # the client stopped reading


async def test_run_logs_a_failing_refresh_once_per_distinct_error(caplog) -> None:
    p, _ = poller({"cpu": vector(), "mem": vector(), "net": vector(), "disk": vector()}, interval_s=0)
    calls = []

    def sink(rows):
        calls.append(rows)
        raise RuntimeError("one" if len(calls) <= 3 else "two")

    p.sink = sink
    with caplog.at_level(logging.DEBUG, logger="rlsched.extender.prometheus"):
        task = asyncio.ensure_future(p.run())
        while len(calls) < 6:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    failed = [r for r in caplog.records if r.getMessage() == "load refresh failed"]
    assert [str(r.exc_info[1]) for r in failed] == ["one", "two"]


async def test_values_outside_zero_to_one_are_counted_and_a_percent_query_fails_its_column() -> None:
    """A percent-scale query (37.5 for 37.5 %) used to read as 1.0 on every node while /status said
    every node was fresh; duplicate series and a JSON true went by silently."""
    percent = vector(({"node": "node-a"}, 37.5), ({"node": "node-b"}, 80.0), ({"node": "node-c"}, 0.5))
    dup = vector(({"node": "node-a"}, 0.10), ({"instance": "10.0.0.1:9100"}, 0.95), ({"node": "node-b"}, 1.2))
    boolean = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {"node": "node-c"}, "value": [1, True]}]},
    }
    p, sink = poller({"cpu": percent, "mem": dup, "net": boolean, "disk": vector()})
    await p.refresh()
    st = p.status()["columns"]
    assert "2 of 3 values are far outside 0..1" in st["cpu"]["lastError"] and st["cpu"]["freshNodes"] == 0
    assert st["memory"]["duplicateSeries"] == 1 and st["memory"]["outOfRangeValues"] == 1
    assert sink["rows"]["node-a"][1] == 0.95 and sink["rows"]["node-b"][1] == 1.0  # the higher kept; clamped
    assert st["network"]["freshNodes"] == 0  # true is not a value
    assert "node-c" not in sink["rows"] or np.isnan(sink["rows"]["node-c"][2])
