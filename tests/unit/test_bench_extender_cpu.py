"""benchmarks/extender_cpu.py: the wall time per pod covers the pods, not the wait for the last watch
events after them (a fake clock that only the client's sleep moves; a stub extender in-process)."""

from __future__ import annotations

import argparse
import asyncio
import os
from types import SimpleNamespace
from typing import Any

import orjson
from aiohttp import web
from benchmark_scripts import load_benchmark
from sleep_clock import SleepClock


async def measure(bench: Any, args: argparse.Namespace) -> dict[str, float]:
    async def filter_(request: web.Request) -> web.Response:
        names = orjson.loads(await request.read())["NodeNames"]
        return web.json_response({"NodeNames": names[:1]})

    async def bind(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/filter", filter_)
    app.router.add_post("/bind", bind)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        return await bench.client(port, os.getpid(), args, seed=0)
    finally:
        await runner.cleanup()


def test_the_wall_time_per_pod_leaves_out_the_final_wait(monkeypatch: Any) -> None:
    bench = load_benchmark("extender_cpu")
    clock = SleepClock()
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(bench, "asyncio", SimpleNamespace(sleep=clock.sleep))
    args = argparse.Namespace(nodes=4, pods=6, warm=2, offered=0.5)
    result = asyncio.run(measure(bench, args))
    assert clock.sleeps == [0.3]  # the client waited for the last watch events…
    assert (result["scheduled"], result["pods"]) == (4, 4)
    assert result["wallMsPerPod"] == 0.0  # …outside the measured wall time (only that sleep moves the clock)
