"""aiohttp applications: the verbs (loopback) and the read-only status listener.

``make_app(extender, metrics, settings)`` serves ``POST {pathPrefix}/filter|prioritize|bind|preempt``;
``make_status_app(extender, metrics, health)`` serves ``/metrics``, ``/healthz``, ``/readyz``,
``/status`` and ``/decisions``. Both take their dependencies, so tests build them with fakes.

One error middleware maps :class:`~rlsched.extender.wire.BadRequest` to 400 (or its status) and an
oversized body to 413, each with a JSON ``{"Error": ...}`` naming the field; the request is logged
(truncated) and the server carries on. A client that goes away mid-request is not an error of the
extender: it is logged at INFO and its latency sample carries code 499 ("client closed request"), never
500. A body must arrive within ``server.bodyTimeoutS`` (408 and the connection closed otherwise);
request lines and headers are bounded by :mod:`rlsched.extender.listener`. The cyclic garbage
collector is paused while a verb runs (parsing big requests allocates many objects; collecting them
mid-request doubled tail latency).

On the status listener, ``auth`` (:class:`rlsched.extender.auth.Authenticator`) guards /status and
/decisions, and /metrics with ``protect_metrics``; /healthz and /readyz stay open (kubelet probes).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from rlsched.policy.resources import clip

from .decision_ring import MAX_READ
from .gc_pause import GcPause
from .log_throttle import EveryFewSeconds, skipped_note
from .metrics import Metrics
from .settings import ExtenderSettings
from .verbs import Extender
from .wire import BadRequest, binding_args, dumps, error_body, extender_args, loads, preemption_args

if TYPE_CHECKING:
    from .auth import Authenticator
    from .listener import ConnectionGuard

log = logging.getLogger("rlsched.extender.http")

EXTENDER: web.AppKey[Extender] = web.AppKey("extender", Extender)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
HEALTH: web.AppKey[Health] = web.AppKey("health", object)  # type: ignore[arg-type]

VERBS = ("filter", "prioritize", "bind", "preempt")


class Health:
    """What /healthz and /readyz report; the server fills it in."""

    def __init__(self) -> None:
        self.started = False
        self.stopping = False
        """Set when shutdown begins: not ready any more (the verbs listener is closing)."""
        self.checks: dict[str, Callable[[], str | None]] = {}
        """name → () → problem or None (readiness)."""
        self.liveness: dict[str, Callable[[], str | None]] = {}
        """name → () → problem or None (liveness: a dead background task)."""

    def problems(self, checks: dict[str, Callable[[], str | None]]) -> dict[str, str]:
        out = {}
        for name, fn in checks.items():
            try:
                problem = fn()
            except Exception as exc:  # noqa: BLE001
                problem = f"check failed: {exc}"
            if problem:
                out[name] = problem
        return out


def _error_middleware(metrics: Metrics, verb_of: Callable[[str], str | None]) -> Middleware:
    quiet = EveryFewSeconds()  # a line per kind of failure per few seconds: a client cannot flood the log

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        verb = verb_of(request.path)
        start = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except BadRequest as exc:
            status = exc.status
            metrics.bad_requests.labels(verb or "other").inc()
            _log_bad(request, verb, exc.status, str(exc), quiet(f"{verb}-{exc.status}"))
            response = web.Response(status=exc.status, body=error_body(str(exc)), content_type="application/json")
            if exc.status == 408:
                response.force_close()  # the rest of a late body must not be read as the next request
            return response
        except web.HTTPRequestEntityTooLarge as exc:
            status = 413
            metrics.bad_requests.labels(verb or "other").inc()
            message = (
                f"body: larger than the limit ({exc.text}); raise server.maxBodyBytes or use nodeCacheCapable: true"
            )
            _log_bad(request, verb, 413, message, quiet(f"{verb}-413"))
            return web.Response(status=413, body=error_body(message), content_type="application/json")
        except web.HTTPException as exc:
            status = exc.status
            raise
        except Exception as exc:  # noqa: BLE001 - last line of defence: answer and keep serving
            if isinstance(exc, (ConnectionError, RuntimeError)) and _client_gone(request):
                # The client went away (mid-body, or before the answer): nothing to answer, nothing broken.
                # aiohttp raises RuntimeError("Connection closed.") reading a body whose connection was
                # lost before the handler started (a TLS client whose request came with the end of
                # its handshake, then its close).
                status = 499
                log.info(
                    "%s %s: the client closed the connection before the answer",
                    request.method,
                    request.path,
                    extra={"event": "client_gone", "verb": verb, "remote": request.remote},
                )
                return web.Response(status=499, reason="Client Closed Request")
            if (skipped := quiet(f"{verb}-500")) is not None:
                log.exception(
                    "%s %s failed%s",
                    request.method,
                    request.path,
                    skipped_note(skipped),
                    extra={"event": "internal_error", "verb": verb},
                )
            return web.Response(
                status=500,
                body=error_body(f"internal error in the extender: {type(exc).__name__}: {exc}"),
                content_type="application/json",
            )
        finally:
            if verb is not None:
                metrics.latency.labels(verb, str(status)).observe(time.perf_counter() - start)

    return middleware


def _client_gone(request: web.Request) -> bool:
    """The request's own connection is closed (a ConnectionError from elsewhere is ours to report)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _log_bad(request: web.Request, verb: str | None, status: int, message: str, skipped: int | None) -> None:
    """One line for a bad request (``skipped``: from the listener's throttle; None: stay quiet)."""
    if skipped is None:
        return
    body = getattr(request, "_read_bytes", None) or b""
    log.warning(
        "bad request %s %s → %d: %s%s",
        request.method,
        request.path,
        status,
        message,
        skipped_note(skipped),
        extra={
            "event": "bad_request",
            "verb": verb,
            "status": status,
            "remote": request.remote,
            "bodyBytes": len(body),
            "body": body[:512].decode("utf-8", "replace"),
        },
    )


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or BadRequest: 408 when it does not arrive within ``timeout_s``, 415 when it is
    compressed (the listeners never inflate a body: a small gzip of gigabytes would hold the event
    loop; kube-scheduler sends plain JSON), 400 when its framing is broken."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise BadRequest("Content-Encoding", f"{clip(encoding)} is not read here; send plain JSON", status=415)
    try:
        if request.content.is_eof():  # all of it arrived with the headers (the usual case on loopback):
            return await request.read()  # no need for wait_for's task and timer
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        raise BadRequest("body", f"not received within {timeout_s:g} s (server.bodyTimeoutS)", status=408) from None
    except web.RequestPayloadError as exc:
        raise BadRequest("body", f"cannot be read: {clip(str(exc))}") from None


def _middlewares(connections: ConnectionGuard | None, *rest: Any) -> list[Any]:
    return ([connections.middleware()] if connections is not None else []) + list(rest)


def make_app(
    extender: Extender,
    metrics: Metrics,
    settings: ExtenderSettings,
    connections: ConnectionGuard | None = None,
    gc_pause: GcPause | None = None,
) -> web.Application:
    """The verb listener's application (``connections``: the listener's guard, told of each request).

    The cyclic GC is paused while a verb is parsed and decided (``gc_pause``: the process's, shared
    with the informers' lists; a new one when None) — not while a body is still arriving, nor while
    bind waits for the API server: a slow client, or a slow API server under a stream of binds, would
    keep the GC off for as long as it lasted."""
    prefix = settings.server.path_prefix
    paths = {f"{prefix}/{v}": v for v in VERBS}
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=_middlewares(connections, _error_middleware(metrics, paths.get)),
    )
    app[EXTENDER] = extender
    app[METRICS] = metrics
    body_timeout = settings.server.body_timeout_s
    gc_pause = gc_pause if gc_pause is not None else GcPause()

    async def filter_(request: web.Request) -> web.Response:
        body = await read_body(request, body_timeout)
        with gc_pause:
            return _json(await request.app[EXTENDER].filter(extender_args(loads(body))))

    async def prioritize(request: web.Request) -> web.Response:
        body = await read_body(request, body_timeout)
        with gc_pause:
            return _json(await request.app[EXTENDER].prioritize(extender_args(loads(body))))

    async def bind(request: web.Request) -> web.Response:
        body = await read_body(request, body_timeout)
        with gc_pause:
            args = binding_args(loads(body))
        # not while the binding write awaits the API server: concurrent binds would keep the GC off
        return _json(await request.app[EXTENDER].bind(args))

    async def preempt(request: web.Request) -> web.Response:
        body = await read_body(request, body_timeout)
        with gc_pause:
            return _json(await request.app[EXTENDER].preempt(preemption_args(loads(body))))

    for path, handler in (
        (f"{prefix}/filter", filter_),
        (f"{prefix}/prioritize", prioritize),
        (f"{prefix}/bind", bind),
        (f"{prefix}/preempt", preempt),
    ):
        app.router.add_post(path, handler)
    return app


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(obj), content_type="application/json")


_CURSOR = re.compile(r"[0-9]{1,18}")
"""A query integer: ASCII digits only (``int()`` would also take ``1_000``, ``" 5"`` and ``"５"``), short
enough that parsing it costs nothing."""


def _int_param(request: web.Request, name: str, default: int, low: int, high: int, what: str) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if _CURSOR.fullmatch(raw) is None:
        raise BadRequest(name, f"expected {what}, got {raw[:40]!r}{'…' if len(raw) > 40 else ''}")
    value = int(raw)
    if not low <= value <= high:
        raise BadRequest(name, f"must be {low}..{high}, got {value}")
    return value


def make_status_app(
    extender: Extender,
    metrics: Metrics,
    health: Health,
    extra_status: Callable[[], dict[str, Any]] | None = None,
    auth: Authenticator | None = None,
    protect_metrics: bool = False,
    connections: ConnectionGuard | None = None,
) -> web.Application:
    """The read-only listener: metrics, probes, status and the decision ring.

    ``auth`` None: nothing is checked (``auth.mode: none``, tests); else /status and /decisions (and
    /metrics with ``protect_metrics``) need a bearer token the API server allows."""
    middlewares = _middlewares(connections, _error_middleware(metrics, lambda path: None))
    if auth is not None:
        from .auth import auth_middleware

        protected = {"/status", "/decisions"} | ({"/metrics"} if protect_metrics else set())
        middlewares.append(auth_middleware(auth, frozenset(protected)))
    app = web.Application(middlewares=middlewares)
    app[EXTENDER] = extender
    app[METRICS] = metrics
    app[HEALTH] = health

    async def metrics_(request: web.Request) -> web.Response:
        return web.Response(
            body=request.app[METRICS].render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    def readiness(h: Health) -> dict[str, str]:
        problems = h.problems(h.checks)
        if not h.started:
            problems["startup"] = "still starting"
        if h.stopping:
            problems["shutdown"] = "shutting down"
        return problems

    def shown(problems: dict[str, str]) -> dict[str, str]:
        """The open probes name the failing checks; their text (an API server's error: its URL, our
        ServiceAccount's name) is for /status, which needs a token, unless nothing is authenticated."""
        if auth is None:
            return problems
        return {name: "failing (the reason is on /status)" for name in problems}

    async def healthz(request: web.Request) -> web.Response:
        problems = request.app[HEALTH].problems(request.app[HEALTH].liveness)
        return _json({"ok": not problems, "problems": shown(problems)}, 200 if not problems else 503)

    async def readyz(request: web.Request) -> web.Response:
        problems = readiness(request.app[HEALTH])
        return _json({"ready": not problems, "problems": shown(problems)}, 200 if not problems else 503)

    async def status(request: web.Request) -> web.Response:
        ext = request.app[EXTENDER]
        h = request.app[HEALTH]
        body = {
            "health": {"live": h.problems(h.liveness), "ready": readiness(h)},
            "policy": ext.engine.status(),
            "cache": ext.cache.summary(),
            "decisions": {
                "ring": len(ext.ring),
                "last": ext.ring.last,
                "remembered": len(ext.memory),
                "outcomes": dict(ext.counts),
            },
        }
        if extra_status is not None:
            body.update(extra_status())
        return _json(body)

    async def decisions(request: web.Request) -> web.Response:
        after = _int_param(
            request, "after", 0, 0, 10**18 - 1, "an integer cursor (the 'next' of the previous answer, 0 at first)"
        )
        limit = _int_param(request, "limit", 1000, 1, MAX_READ, f"an integer number of records, 1..{MAX_READ}")
        return _json(request.app[EXTENDER].ring.read(after, limit))

    app.router.add_get("/metrics", metrics_)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    app.router.add_get("/decisions", decisions)
    return app
