"""rlsched.operator.pod_usage: each pod's CPU use from a Prometheus answer, read defensively."""

from __future__ import annotations

from typing import Any

import pytest

from rlsched.operator.pod_usage import DEFAULT_QUERY, read_pod_cpu


def answering(result: Any, status: str = "success") -> Any:
    async def query(promql: str, max_series: int | None = None) -> Any:
        assert promql == DEFAULT_QUERY
        return {"status": status, "data": {"resultType": "vector", "result": result}}

    return query


def series(namespace: Any, pod: Any, value: Any) -> dict:
    return {"metric": {"namespace": namespace, "pod": pod, "instance": "n1"}, "value": [1795000000.0, value]}


async def test_millicores_per_pod_and_every_bad_series_skipped() -> None:
    read = await read_pod_cpu(
        answering(
            [
                series("ml", "train-0", "2.5"),
                series("ml", "train-0", "0.5"),  # a second series of the same pod (another instance): summed
                series("web", "api", "0"),
                series("ml", None, "1"),
                series(7, "x", "1"),
                series("ml", "neg", "-0.1"),
                series("ml", "inf", "+Inf"),
                series("ml", "nan", "NaN"),
                series("ml", "text", "fast"),
                {"metric": {"namespace": "ml", "pod": "short"}, "value": ["1"]},
                "not a series",
            ]
        )
    )
    assert read.milli == {"ml/train-0": 3000.0, "web/api": 0.0}
    assert (read.skipped, read.truncated, read.error) == (8, False, "")


@pytest.mark.parametrize(
    "answer, error",
    [
        ({"status": "error", "error": "bad query"}, "not a usable Prometheus vector answer: "),
        ({"status": "success", "data": {"resultType": "matrix"}}, "not a usable Prometheus vector answer: "),
        (["nonsense"], "not a usable Prometheus vector answer: "),
    ],
)
async def test_a_malformed_answer_gives_nothing(answer: Any, error: str) -> None:
    async def query(promql: str, max_series: int | None = None) -> Any:
        return answer

    read = await read_pod_cpu(query)
    assert read.milli == {} and read.error.startswith(error) and len(read.error) > len(error)


async def test_a_failing_query_gives_nothing_and_says_why() -> None:
    async def query(promql: str, max_series: int | None = None) -> Any:
        raise TimeoutError("Prometheus did not answer in 5 s")

    read = await read_pod_cpu(query)
    assert read.milli == {} and read.error == "TimeoutError: Prometheus did not answer in 5 s"


async def test_at_most_max_series_are_read() -> None:
    read = await read_pod_cpu(answering([series("ns", f"p{i}", "1") for i in range(10)]), max_series=4)
    assert len(read.milli) == 4 and read.truncated


async def test_an_answer_of_too_many_series_is_refused_before_it_is_decoded(monkeypatch) -> None:
    """The operator's reader decoded up to 64 MiB of tiny series on the event loop (seconds) before
    cutting them to ``max_series``; the Prometheus client now counts them in the bytes as they come."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    import rlsched.extender.prometheus as prometheus
    from rlsched.extender.settings import PrometheusSettings

    decoded = []
    real_loads = prometheus.orjson.loads
    monkeypatch.setattr(prometheus.orjson, "loads", lambda raw: decoded.append(len(raw)) or real_loads(raw))
    tiny = ",".join('{"metric":{},"value":[0,"0"]}' for _ in range(5000))
    body = f'{{"status":"success","data":{{"resultType":"vector","result":[{tiny}]}}}}'

    async def answer(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/query", answer)
    async with TestServer(app) as server:
        poller = prometheus.LoadPoller(
            PrometheusSettings(url=str(server.make_url(""))), lambda: {}, lambda load: None, None
        )
        read = await read_pod_cpu(poller.query, max_series=100)
        fits = await read_pod_cpu(poller.query, max_series=10_000)
        await poller.close()
    assert read.milli == {} and "more than 100 series" in read.error
    assert fits.error == "" and fits.skipped == 5000  # no namespace/pod labels: read, then skipped
    assert decoded == [len(body)]  # only the answer that fit was decoded
