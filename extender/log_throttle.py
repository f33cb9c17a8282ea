"""Log lines a client can cause, at most once per few seconds per kind.

A bad request, a refused token or a dropped connection is one line each; a client that repeats it
thousands of times a second must not fill the log (or the disk under it). Each kind of line is
written at most once per period, with the number left out since the last one.
:class:`HttpServerLog` does the same for what aiohttp itself logs about requests it cannot parse.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

MAX_KINDS = 1024
"""Kinds remembered; the table is emptied when full (kinds are fixed strings, a handful in use)."""


class EveryFewSeconds:
    """``throttle(kind)``: None (stay quiet), or the number of lines skipped since the last one (log now)."""

    def __init__(self, period_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.period_s, self.clock = period_s, clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, kind: str) -> int | None:
        now = self.clock()
        if now - self._last.get(kind, -1e18) < self.period_s:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return None
        if len(self._last) >= MAX_KINDS:
            self._last.clear()
        self._last[kind] = now
        return self._skipped.pop(kind, 0)


def skipped_note(skipped: int) -> str:
    """``"; N more since the last line"`` (empty for 0)."""
    return f"; {skipped} more since the last line" if skipped else ""


MAX_DETAIL_CHARS = 200
"""aiohttp's description of a request it could not parse is cut to this (it may quote the bad line)."""


class HttpServerLog(logging.LoggerAdapter[logging.Logger]):
    """The log of a listener's HTTP server (aiohttp's request handler ``logger=``), made fit to face
    any client.

    aiohttp answers a request it cannot parse — a bad request line, header or chunk size, bytes that
    are not HTTP — with 400 and closes the connection itself, before any middleware runs, and logs it
    as "Error handling request" at ERROR with a traceback, once per request: anything that reaches a
    listener (the chart's status port listens on 0.0.0.0) could fill the log. Here each such request
    is counted (``count()``) and logged at WARNING without a traceback, at most once per period, with
    the number left out. Any other error aiohttp reports (a bug: it keeps its traceback) is logged
    at most once per period per exception type. Debug lines pass through."""

    def __init__(
        self,
        listener: str,
        count: Callable[[], None] | None = None,
        period_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.listener = listener
        self.count = count or (lambda: None)
        self.out = logging.getLogger("rlsched.extender.http")
        """Where the bad-request lines go (the listeners' logger)."""
        self._quiet = EveryFewSeconds(period_s, clock)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = _exception(kwargs.get("exc_info"))
        if isinstance(exc, HttpProcessingError):
            self._bad_http(args, exc)
        elif level >= logging.ERROR:
            skipped = self._quiet(f"error-{type(exc).__name__}")
            if skipped is not None:
                self.logger.log(level, f"{msg}{skipped_note(skipped)}", *args, **kwargs)
        else:
            self.logger.log(level, msg, *args, **kwargs)

    def _bad_http(self, args: tuple[object, ...], exc: HttpProcessingError) -> None:
        try:
            self.count()
        except Exception:  # noqa: BLE001 - a metrics problem must not become the listener's problem
            self.out.exception("counting a malformed request failed")
        skipped = self._quiet("bad-http")
        if skipped is None:
            return
        peer = args[0] if len(args) == 1 else "?"  # aiohttp's "Error handling request from %s", request.remote
        detail = " ".join(str(exc.message)[: 2 * MAX_DETAIL_CHARS].split())
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[: MAX_DETAIL_CHARS - 1] + "…"
        self.out.warning(
            "%s listener: a request from %s is not valid HTTP (%s: %s); answered 400 and closed%s",
            self.listener,
            peer,
            type(exc).__name__,
            detail,
            skipped_note(skipped),
            extra={"event": "bad_http", "listener": self.listener, "status": 400},
        )


def _exception(exc_info: Any) -> BaseException | None:
    """The exception a logging call's ``exc_info`` names (an exception, a sys.exc_info() tuple, or True
    for the one being handled)."""
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3 and isinstance(exc_info[1], BaseException):
        return exc_info[1]
    if exc_info is True:
        return sys.exception()
    return None
