"""The operator's ``/metrics`` listener (``metricsEndpoint``): Prometheus text from one registry.

The registry is the runtime's (the rebalancer's counters today); the listener is an aiohttp app run
as a task in kopf's event loop, cleaned up when the task is cancelled. No authentication: it serves
counters only (no object names), like kube-state-metrics; bind it to the pod network, not a public
address.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("rlsched.operator")


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` (``0.0.0.0:9102``, ``[::]:9102``) → (host, port); ValueError says what fits."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port (e.g. 0.0.0.0:9102)")
    return host.strip("[]"), int(port)


def make_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def serve(registry: CollectorRegistry, endpoint: str) -> None:
    """Serve until cancelled."""
    host, port = parse_endpoint(endpoint)
    runner = web.AppRunner(make_app(registry), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
