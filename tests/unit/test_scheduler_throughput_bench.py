"""benchmarks/scheduler_throughput.py: the parts that turn measurements into figures."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from benchmark_scripts import load_benchmark


def test_a_p50_inside_the_first_bucket_is_not_a_measurement() -> None:
    """1,995 of 2,000 binding handler times under 5 ms, kube-apiserver's first bucket: the interpolated
    p50 was 2.5 ms whatever they were, and "bind / API server" a ratio to that guess."""
    bench = load_benchmark("scheduler_throughput")
    handler = [(0.005, 1995.0), (0.025, 2000.0), (float("inf"), 2000.0)]
    assert bench.in_first_bucket(handler, 0.5) == 0.005
    assert bench.in_first_bucket([(0.005, 900.0), (0.025, 2000.0), (float("inf"), 2000.0)], 0.5) is None
    mode: dict[str, Any] = {}
    metrics = "\n".join(
        f'apiserver_request_duration_seconds_bucket{{resource="pods",subresource="binding",verb="POST",le="{le}"}} {n}'
        for le, n in (("0.005", 1995), ("0.025", 2000), ("+Inf", 2000))
    )
    verb = "\n".join(
        f'rlsched_extender_request_seconds_bucket{{verb="bind",code="200",le="{le}"}} {n}'
        for le, n in (("0.0025", 100), ("0.005", 1900), ("+Inf", 2000))
    )
    bench.Bench.bind_latency(SimpleNamespace(q_ms=bench.Bench.q_ms), mode, "", metrics, "", verb)
    assert mode["apiserverBindingP50Ms"] is None and mode["apiserverBindingP50BelowMs"] == 5.0
    assert "extenderBindOverApiserverP50" not in mode
    assert "| < 5 / " in bench.bind_table([{"phase": "rl", "round": 0, "backlog": mode}])


def test_a_run_that_lost_pods_says_so() -> None:
    bench = load_benchmark("scheduler_throughput")
    base = {"phase": "rl", "round": 0, "loadavgStart": "1.0/1/1", "loadavgStream": "2.0/1/1"}
    complete = {**base, "backlog": {"expected": 10, "bound": 10, "complete": True, "podsPerSecond": 5.0}}
    lost = {**base, "phase": "default", "backlog": {"expected": 10, "bound": 1, "complete": False}}
    lost["stream"] = {"expected": 10, "bound": 9, "complete": False}
    text = bench.summarize([complete, lost])
    assert "| rl | 0 | 10 / 10 | 5.0 |" in text and "| default | 0 | 1 / 10 |" in text
    assert "Not every pod was bound in: default round 0 backlog, default round 0 stream" in text


def test_the_harness_list_keeps_the_callers_limit() -> None:
    """{"limit": "1"} (is it empty, from where to watch) became 1,000 a page through every pod."""
    bench = load_benchmark("scheduler_throughput")
    sent = []

    class Stub(bench.rlstack.Api):
        def __init__(self) -> None:
            pass

        async def request(self, method, path, body=None, params=None, **kw):
            sent.append(dict(params))
            more = "next" if len(sent) == 1 else ""
            return {"items": [{}], "metadata": {"resourceVersion": "7", "continue": more}}

    items, rv = asyncio.run(Stub().list("/api/v1/namespaces/bench/pods", {"limit": "1"}))
    assert sent == [{"limit": "1"}] and len(items) == 1 and rv == "7"


def test_an_unreadable_api_server_leaves_its_figures_out() -> None:
    """A stalled run can leave kube-apiserver too busy to answer /metrics: the run still reports, without
    the handler's figures (it crashed before), and never with counts over the wrong window."""
    bench = load_benchmark("scheduler_throughput")

    def kubectl(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("kubectl get --raw /metrics failed (1): Unable to connect to the server")

    assert bench.Bench.apiserver_metrics(SimpleNamespace(cluster=SimpleNamespace(kubectl=kubectl))) is None
    metrics = 'apiserver_request_duration_seconds_bucket{resource="pods",subresource="binding",le="+Inf"} 9'
    mode: dict[str, Any] = {}
    bench.Bench.bind_latency(SimpleNamespace(q_ms=bench.Bench.q_ms), mode, None, metrics, None, None)
    assert mode["apiserverBindings"] == 0 and mode["apiserverBindingP50Ms"] is None
