"""Per-node load from Prometheus: matching series to nodes, staleness, failures that never block."""

from __future__ import annotations

import numpy as np
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.extender.metrics import Metrics
from rlsched.extender.prometheus import LoadPoller
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
