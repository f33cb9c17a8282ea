"""TCP listeners that drop slow and surplus clients.

aiohttp reads a request's line and headers with no deadline (a client that sends one byte every few
seconds holds its connection forever — slowloris) and accepts connections without limit. A
:class:`ConnectionGuard` wraps the protocol aiohttp creates per connection:

- a **header deadline**: from connecting, or from the first byte of a further request on a kept-alive
  connection, the client has ``header_timeout_s`` to complete a request line and headers; past it the
  guard answers ``408`` and closes. The request's middleware (:meth:`ConnectionGuard.middleware`)
  tells the guard when aiohttp has parsed a request (deadline off) and when it has been answered.
  Bodies are bounded separately (``server.bodyTimeoutS``, where the handlers read them), idle
  kept-alive connections by aiohttp's keep-alive timeout (``server.idleTimeoutS``);
- a **connection cap**: at ``max_connections`` open connections the one idle longest (kept alive,
  no request in progress) is closed to make room; when none is idle a new one is answered ``503``
  and closed at once;
- **TLS under the guard**: a TLS listener accepts plain TCP, and the guard sees each connection
  first — the cap counts it from the moment it is accepted — and only then starts the TLS handshake
  on it (``loop.start_tls``), with the header deadline as the handshake's. Given to ``create_server``
  as ``ssl=``, asyncio would run the handshake before any protocol of ours saw the connection, so
  clients that connect and send nothing would hold sockets past any cap (hundreds of them ran the
  process out of file descriptors). A handshake that times out or fails (not TLS, no common version
  or cipher, a client certificate refused) closes the connection and frees its place. aiohttp's
  protocol is made once the handshake is done, and is handed the TLS transport.

Dropped connections are counted (``rlsched_extender_connections_dropped_total{listener,reason}``) and
logged at most once per few seconds per listener and reason (failed handshakes at INFO: they are the
client's business, as a request that is not HTTP is).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from prometheus_client import Counter, Gauge

from .log_throttle import EveryFewSeconds, skipped_note
from .wire import error_body

log = logging.getLogger("rlsched.extender.http")


class ConnectionMetrics:
    """The listeners' connection metrics (one set per registry, shared by both guards)."""

    def __init__(self, registry: Any = None):
        self.dropped = Counter(
            "rlsched_extender_connections_dropped_total",
            "Connections the extender closed on a client: header-timeout (request line and headers "
            "not complete in time), over-limit (too many open connections, none idle), idle-at-limit "
            "(an idle kept-alive connection closed to make room for a new one), tls-handshake-timeout "
            "(no TLS handshake within the header deadline), tls-handshake-failed (not TLS, no common "
            "version or cipher, a client certificate refused)",
            ["listener", "reason"],
            registry=registry,
        )
        self.open = Gauge(
            "rlsched_extender_connections", "Open connections by listener", ["listener"], registry=registry
        )


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = error_body(message)
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


class ConnectionGuard:
    """Header deadline and connection cap of one listener (``name``: ``verbs`` or ``status``)."""

    def __init__(
        self,
        name: str,
        header_timeout_s: float,
        max_connections: int,
        metrics: ConnectionMetrics,
        log_every_s: float = 10.0,
    ):
        self.name, self.header_timeout_s, self.max_connections = name, header_timeout_s, max_connections
        self.metrics = metrics
        self.connections: dict[int, _GuardedProtocol] = {}
        """id(aiohttp's RequestHandler) → its guard, for the open connections; in the order they last
        finished a request (or opened), so the first idle one has been idle longest."""
        self.handshaking: set[_GuardedProtocol] = set()
        """Connections in their TLS handshake: they count under the cap, aiohttp has none of them yet."""
        self._quiet = EveryFewSeconds(log_every_s)
        metrics.open.labels(name).set_function(self.open_count)
        for reason in ("header-timeout", "over-limit", "idle-at-limit"):
            metrics.dropped.labels(name, reason)

    def open_count(self) -> int:
        """Open connections: aiohttp's, and those still in their TLS handshake."""
        return len(self.connections) + len(self.handshaking)

    def protocol_factory(
        self, server: Callable[[], asyncio.Protocol], ssl_context: ssl.SSLContext | None = None
    ) -> Callable[[], asyncio.Protocol]:
        """What ``loop.create_server`` takes: aiohttp's per-connection protocol, guarded; with
        ``ssl_context``, behind a TLS handshake the guard starts (module docstring)."""
        if ssl_context is not None:
            for reason in ("tls-handshake-timeout", "tls-handshake-failed"):
                self.metrics.dropped.labels(self.name, reason)
        return lambda: _GuardedProtocol(self, server, ssl_context)

    def dropped(self, reason: str, peer: Any, detail: str = "", level: int = logging.WARNING) -> None:
        self.metrics.dropped.labels(self.name, reason).inc()
        skipped = self._quiet(reason)
        if skipped is None:
            return
        log.log(
            level,
            "%s listener: dropped a connection from %s (%s%s)%s",
            self.name,
            peer,
            reason,
            f": {detail}" if detail else "",
            skipped_note(skipped),
            extra={"event": "connection_dropped", "listener": self.name, "reason": reason},
        )

    async def end_handshakes(self) -> None:
        """Close the connections still in their TLS handshake (the listener stops; aiohttp knows
        nothing of them) and wait for their handshakes to end."""
        pending = list(self.handshaking)
        tasks = [c.upgrade for c in pending if c.upgrade is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in pending:  # a handshake cancelled before it began closes nothing itself
            if c.transport is not None:
                c.transport.close()
        self.handshaking.clear()

    def idle_to_close(self) -> _GuardedProtocol | None:
        """The connection open longest with no request in progress (a kept-alive one waiting for the
        next): at the cap, it makes room for a new connection. Without this, clients that each send
        one request and then hold their connection idle would fill the cap, and kubelet's probes
        would be turned away for ``idleTimeoutS``."""
        return next((c for c in self.connections.values() if c.state == _GuardedProtocol.IDLE), None)

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        """Tells the guard that a request has arrived whole (headers parsed) and when it is answered."""

        @web.middleware
        async def middleware(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            guard = self.connections.get(id(request.protocol))
            if guard is not None:
                guard.request_started(request)
            try:
                return await handler(request)
            finally:
                if guard is not None:
                    guard.request_finished()

        return middleware


def _feed(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """Hand ``data`` to ``protocol`` as if the transport had just read it (asyncio's and uvloop's TLS
    protocols are buffered protocols; a plain one gets ``data_received``)."""
    buffered: Any = protocol
    if hasattr(buffered, "buffer_updated"):  # uvloop's TLS protocol does not subclass BufferedProtocol
        view = memoryview(data)
        while view:
            buf = memoryview(buffered.get_buffer(len(view)))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            buffered.buffer_updated(n)
            view = view[n:]
    else:
        buffered.data_received(data)


class _GuardedProtocol(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, with the header deadline and the cap around it."""

    IDLE, HEAD, BUSY, HANDSHAKE = "idle", "head", "busy", "handshake"

    def __init__(self, guard: ConnectionGuard, server: Callable[[], Any], ssl_context: ssl.SSLContext | None = None):
        self.guard, self.server, self.ssl_context = guard, server, ssl_context
        self.inner: Any = None
        self.transport: asyncio.Transport | None = None
        self.state = self.IDLE
        self.timer: asyncio.TimerHandle | None = None
        self.request: web.BaseRequest | None = None
        self.next_request_started = False
        """Bytes arrived after the current request's body was complete: the next request has begun."""
        self.upgrade: asyncio.Task[None] | None = None
        """The TLS handshake (``ssl_context`` given), until it ends."""
        self.early: list[bytes] = []
        self.early_eof = False
        """Decrypted bytes (and an end) that arrive between the handshake's end and aiohttp's protocol:
        asyncio's TLS protocol may pass them on before ``start_tls`` has returned."""
        self.tls_installed = False
        """``start_tls`` has put its TLS protocol on the connection: what reaches this protocol from now
        on is decrypted."""
        self.raw_early: list[bytes] = []
        """Bytes of the handshake read before ``start_tls`` took the connection over: uvloop starts
        reading right after ``connection_made`` returns, whatever it paused (its
        ``_call_connection_made``), so a client's first TLS record can arrive here; it is handed to
        the TLS protocol once that is in place."""
        self.lost = False

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's protocol: the transport is a full Transport (asyncio types the callback with the base)
        self.transport = cast(asyncio.Transport, transport)
        g = self.guard
        if g.open_count() >= g.max_connections and (idle := g.idle_to_close()) is not None:
            g.dropped("idle-at-limit", idle.peer())
            idle.close()
        if g.open_count() >= g.max_connections:
            g.dropped("over-limit", transport.get_extra_info("peername"))
            if self.ssl_context is None:  # a TLS client would read the answer as a broken record
                self.transport.write(
                    _raw_response(
                        503,
                        "Service Unavailable",
                        f"the {g.name} listener has {g.max_connections} connections open "
                        f"(server.{'maxConnections' if g.name == 'verbs' else 'statusMaxConnections'}); try again",
                    )
                )
            transport.close()
            return
        if self.ssl_context is not None:
            self.transport.pause_reading()  # nothing is read before the TLS protocol takes the transport
            self.state = self.HANDSHAKE
            g.handshaking.add(self)
            self.upgrade = asyncio.get_running_loop().create_task(self._start_tls(self.transport, self.ssl_context))
            return
        self._serve(self.transport)

    def _serve(self, transport: asyncio.Transport) -> None:
        """aiohttp's protocol takes the connection (plain, or TLS once the handshake is done)."""
        self.inner = self.server()
        self.guard.connections[id(self.inner)] = self
        self.inner.connection_made(transport)
        self._arm()

    async def _start_tls(self, raw: asyncio.Transport, ctx: ssl.SSLContext) -> None:
        """The TLS handshake on an admitted connection; aiohttp's protocol gets the connection once it
        is done. This protocol stays the TLS transport's: its calls pass on to aiohttp's as before."""
        g = self.guard
        peer = raw.get_extra_info("peername")
        tls: asyncio.Transport | None = None
        try:
            if self.lost or raw.is_closing():
                return
            loop = asyncio.get_running_loop()
            starting = loop.create_task(
                loop.start_tls(
                    raw,
                    self,
                    ctx,
                    server_side=True,
                    ssl_handshake_timeout=g.header_timeout_s,
                    # a closed TLS connection waits for the client's close_notify: not 30 s (the
                    # default), which kept sockets past the cap for that long
                    ssl_shutdown_timeout=g.header_timeout_s,
                )
            )
            # start_tls's first step (run before this task resumes: the ready queue is FIFO) pauses
            # reading, puts its TLS protocol on the connection and schedules that protocol's
            # connection_made and the resumption of reading; bytes read before it go after them, ahead
            # of anything read later
            await asyncio.sleep(0)
            self.tls_installed = True
            if self.raw_early:
                hello, self.raw_early = b"".join(self.raw_early), []
                loop.call_soon(self._hand_over, raw, hello)
            tls = await starting
        except ConnectionAbortedError:  # the handshake's deadline (asyncio's and uvloop's TLS protocol alike)
            g.dropped("tls-handshake-timeout", peer, f"not done within {g.header_timeout_s:g} s", logging.INFO)
            return
        except (ConnectionResetError, BrokenPipeError):
            return  # the client went away in the handshake: nothing of ours to count
        except OSError as exc:  # ssl.SSLError among them; start_tls has closed the connection
            g.dropped("tls-handshake-failed", peer, f"{type(exc).__name__}: {exc}"[:200], logging.INFO)
            return
        finally:
            g.handshaking.discard(self)
            self.upgrade = None
        if tls is None or self.lost or tls.is_closing():  # closed as the handshake ended
            if tls is not None:
                tls.close()
            return
        self.transport = tls
        self._serve(tls)
        early, self.early = self.early, []
        for data in early:
            self.data_received(data)
        if self.early_eof:  # the TLS transport is closing itself (a close_notify ends the session)
            self.inner.eof_received()

    def _hand_over(self, raw: asyncio.Transport, data: bytes) -> None:
        """The handshake's first bytes, read before ``start_tls`` took over, to its TLS protocol."""
        if raw.is_closing():
            return
        try:
            _feed(raw.get_protocol(), data)
        except Exception as exc:  # noqa: BLE001 - one connection's problem: close it, count it, no traceback
            self.guard.dropped(
                "tls-handshake-failed",
                raw.get_extra_info("peername"),
                f"{type(exc).__name__}: {exc}"[:200],
                logging.INFO,
            )
            raw.close()

    def peer(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport is not None else None

    def close(self) -> None:
        """Close at once and leave the listener's count now (connection_lost comes later)."""
        self._disarm()
        if self.inner is not None:
            self.guard.connections.pop(id(self.inner), None)
        if self.transport is not None:
            if self.ssl_context is not None and self.transport.get_write_buffer_size() == 0:
                # nothing left to send: no close_notify exchange, the socket goes now rather than
                # when the client answers one (a connection closed to make room at the cap)
                self.transport.abort()
            else:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._disarm()
        if self.inner is not None:
            self.guard.connections.pop(id(self.inner), None)
            self.inner.connection_lost(exc)
        self.request = None

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            if self.state == self.HANDSHAKE:
                (self.early if self.tls_installed else self.raw_early).append(data)
            return
        if self.state == self.IDLE:
            self._arm()
        elif self.state == self.BUSY and self.request is not None and self.request.content.is_eof():
            self.next_request_started = True
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.inner is None and self.state == self.HANDSHAKE:
            self.early_eof = True
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # -- the request's progress (from the middleware) -----------------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        self._disarm()
        self.state, self.request, self.next_request_started = self.BUSY, request, False

    def request_finished(self) -> None:
        self.request = None
        self.state = self.IDLE
        # the guard's dict runs from the longest idle to the latest used (ConnectionGuard.idle_to_close)
        if self.inner is not None and id(self.inner) in self.guard.connections:
            self.guard.connections[id(self.inner)] = self.guard.connections.pop(id(self.inner))
        if self.next_request_started:
            self._arm()

    # -- the deadline -------------------------------------------------------------------------------
    def _arm(self) -> None:
        self._disarm()
        self.state = self.HEAD
        self.timer = asyncio.get_running_loop().call_later(self.guard.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.state != self.HEAD or self.transport is None or self.transport.is_closing():
            return
        self.guard.dropped("header-timeout", self.transport.get_extra_info("peername"))
        self.transport.write(
            _raw_response(
                408,
                "Request Timeout",
                f"request line and headers not received within "
                f"{self.guard.header_timeout_s:g} s (server.headerTimeoutS)",
            )
        )
        self.transport.close()


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections go through a :class:`ConnectionGuard`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ):
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=backlog)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        # plain TCP either way: with a context the guard starts TLS on each connection it admits
        self._server = await loop.create_server(
            self.guard.protocol_factory(server, self._ssl_context), self._host, self._port, backlog=self._backlog
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
        else:  # pragma: no cover
            self._bound_port = self._port

    async def stop(self) -> None:
        await super().stop()
        await self.guard.end_handshakes()
