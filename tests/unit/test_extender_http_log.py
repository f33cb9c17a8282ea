"""Requests aiohttp cannot parse (a bad request line, header or chunk size; bytes that are not HTTP)
are answered 400 by aiohttp before any middleware: the listeners' runners count them and log them at
most once per few seconds, without a traceback — never one ERROR line with a traceback per request."""

from __future__ import annotations

import asyncio
import logging

from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from rlsched.extender.app import Health, make_status_app
from rlsched.extender.listener import ConnectionGuard, ConnectionMetrics, GuardedSite
from rlsched.extender.server import _runner
from rlsched.extender.settings import ExtenderSettings, ServerSettings
from rlsched.extender.testing import Harness, make_node

MALFORMED = [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",  # a header without a colon
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",  # a request line over aiohttp's limit
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",  # chunk size
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello on the plain-HTTP port
]


async def _send(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_malformed_requests_are_counted_and_logged_once_without_traceback(caplog) -> None:
    caplog.set_level(logging.INFO)
    settings = ExtenderSettings(server=ServerSettings(port=0, status_port=0))
    h = Harness([make_node("g0", gpus=4)], settings=settings)
    guard = ConnectionGuard("status", 10, 64, ConnectionMetrics(h.metrics.registry))
    runner = _runner(
        make_status_app(h.extender, h.metrics, Health(), connections=guard), settings.server, "status", h.metrics
    )
    await runner.setup()
    try:
        await GuardedSite(runner, "127.0.0.1", 0, guard).start()
        port = runner.addresses[0][1]
        for _ in range(10):
            for raw in MALFORMED:
                assert (await _send(port, raw)).startswith(b"HTTP/1.0 400")
        assert (await _send(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).startswith(
            b"HTTP/1.1 200"
        )  # the listener serves on
        await asyncio.sleep(0.05)
    finally:
        await runner.cleanup()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []  # was: one "Error handling request" with a traceback per request
    lines = [r for r in caplog.records if getattr(r, "event", None) == "bad_http"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and not lines[0].exc_info
    assert "status listener" in lines[0].getMessage() and "not valid HTTP" in lines[0].getMessage()
    counted = h.metrics.registry.get_sample_value("rlsched_extender_bad_requests_total", {"verb": "http"})
    assert counted == 10 * len(MALFORMED)


def test_the_http_server_log_throttles_counts_and_keeps_bugs_visible(caplog) -> None:
    from rlsched.extender.log_throttle import HttpServerLog

    caplog.set_level(logging.DEBUG)
    now = [0.0]
    counted: list[int] = []
    log = HttpServerLog("verbs", lambda: counted.append(1), period_s=10.0, clock=lambda: now[0])

    def bad(exc: Exception) -> None:  # as aiohttp's RequestHandler.handle_error logs it
        log.exception("Error handling request from %s", "10.0.0.9", exc_info=exc)

    bad(BadHttpMessage("Invalid header token", headers=None))
    now[0] = 5.0
    bad(LineTooLong("request line " + "x" * 5000, "8190"))
    now[0] = 11.0
    bad(BadHttpMessage("x" * 5000, headers=None))
    lines = [r for r in caplog.records if getattr(r, "event", None) == "bad_http"]
    assert len(counted) == 3 and len(lines) == 2
    assert "10.0.0.9" in lines[0].getMessage() and "; 1 more since the last line" in lines[1].getMessage()
    assert all(len(r.getMessage()) < 400 and not r.exc_info for r in lines)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)

    caplog.clear()
    try:
        raise RuntimeError("a bug")
    except RuntimeError as exc:
        log.exception("Unhandled exception", exc_info=exc)
        log.exception("Unhandled exception", exc_info=exc)  # the same kind within the period: quiet
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and errors[0].name == "aiohttp.server"
    log.debug("Ignored premature client disconnection")
    assert caplog.records[-1].levelno == logging.DEBUG and len(counted) == 3
