"""hack/stacklib's services and API client against servers that misbehave: a foreign process on the
extender's port (its answer must not pass for our extender's readiness) and an API server that never
answers (ordinary requests give up after the request timeout; watches do not)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_hack_script

rlstack = load_hack_script("rlstack")

from stacklib import api as stack_api  # noqa: E402
from stacklib import process as stack_process  # noqa: E402
from stacklib.cluster import LocalCluster  # noqa: E402
from stacklib.pki import tls_pki  # noqa: E402
from stacklib.services import Extender  # noqa: E402

# -- a foreign server on the extender's port ----------------------------------------------------------


class FakeCluster(LocalCluster):
    """No API server: the token and RBAC steps of ``start_with`` do nothing."""

    def apply(self, objects: Any, server_side: bool = False) -> None:
        pass

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(args, 0, "token\n", "")


def foreign_server(delay_s: float = 0.0) -> HTTPServer:
    """Another program's HTTP server answering 200 to everything (after ``delay_s``)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            time.sleep(delay_s)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def launcher(tmp_path: Path, body: str) -> str:
    """A stand-in for ``python -m rlsched.cli`` (RLSCHED_STACK_EXTENDER_LAUNCHER)."""
    path = tmp_path / "fake-extender.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def extender(tmp_path: Path) -> Iterator[Extender]:
    ext = Extender(FakeCluster(tmp_path / "state"))
    yield ext
    ext.stop()


def test_a_port_taken_by_another_process_fails_before_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extender: Extender
) -> None:
    """The ports stack.json recorded may belong to another program by now: its 200 on /readyz made an
    extender that could not bind (and exited a second later) look started."""
    monkeypatch.setenv("RLSCHED_STACK_EXTENDER_LAUNCHER", launcher(tmp_path, "sleep 1; echo bind: in use >&2; exit 1"))
    foreign = foreign_server()
    try:
        with pytest.raises(RuntimeError, match=f"port {foreign.server_port} is in use"):
            extender.start_with(port=rlstack.free_port(), status_port=foreign.server_port, timeout=10)
    finally:
        foreign.shutdown()
    assert extender.pid is None  # nothing was started


def test_a_readiness_answered_by_another_process_does_not_pass_for_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extender: Extender
) -> None:
    """When the port check cannot see the other listener (it took the port after the check), an extender
    that has died by the time /readyz answers is reported with its log, not as started."""
    monkeypatch.setattr(stack_process, "port_in_use", lambda port, host="127.0.0.1": False, raising=False)
    monkeypatch.setenv("RLSCHED_STACK_EXTENDER_LAUNCHER", launcher(tmp_path, "echo cannot bind >&2; exit 3"))
    foreign = foreign_server(delay_s=0.5)
    try:
        with pytest.raises(RuntimeError, match="exit status 3") as exc:
            extender.start_with(port=foreign.server_port, status_port=foreign.server_port, timeout=10)
    finally:
        foreign.shutdown()
    assert "cannot bind" in str(exc.value)


# -- an API server that never answers -----------------------------------------------------------------


class SilentApiServer:
    """TLS on loopback: reads each request, then answers as ``respond`` says (or never)."""

    def __init__(self, tmp_path: Path, respond: Callable[[ssl.SSLSocket], None] | None = None):
        pki = tls_pki(tmp_path / "tls")
        self.state = tmp_path / "state"
        (self.state / "pki").mkdir(parents=True)
        for src, dst in (("ca", "ca.crt"), ("client_cert", "admin.crt"), ("client_key", "admin.key")):
            shutil.copy(pki[src], self.state / "pki" / dst)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki["server_cert"], pki["server_key"])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        (self.state / "ports.env").write_text(f"APISERVER_PORT={self.sock.getsockname()[1]}\n")
        self.respond = respond
        self.requests = 0
        self.held: list[ssl.SSLSocket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = tls.recv(65536)
                if not chunk:
                    return
                data += chunk
        except OSError:
            return
        self.requests += 1
        self.held.append(tls)
        if self.respond is not None:
            self.respond(tls)

    def close(self) -> None:
        self.sock.close()
        for s in self.held:
            s.close()


def test_an_ordinary_request_gives_up_after_the_request_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request used to wait for ever (ClientTimeout(total=None)): create_nodes' ready_timeout and the
    replays' creates hung on a wedged API server. A timed-out create is not retried either."""
    monkeypatch.setattr(stack_api, "REQUEST_TIMEOUT_S", 0.4, raising=False)
    server = SilentApiServer(tmp_path)

    async def go() -> list[float]:
        took = []
        async with stack_api.Api(LocalCluster(server.state)) as api:
            for call in (lambda: api.request("GET", "/api/v1/nodes"), lambda: api.create("/api/v1/nodes", {})):
                t0 = time.monotonic()
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(call(), 8)
                took.append(time.monotonic() - t0)
        return took

    try:
        took = asyncio.run(go())
    finally:
        server.close()
    assert all(t < 4 for t in took), took
    assert server.requests == 2  # one each: the create was not retried


def test_a_watch_is_not_cut_by_the_request_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_api, "REQUEST_TIMEOUT_S", 0.3, raising=False)
    event = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "n1"}}}).encode() + b"\n"

    def quiet_then_one_event(tls: ssl.SSLSocket) -> None:
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        time.sleep(1.0)  # longer than the request timeout: a watch with nothing to say
        tls.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))

    server = SilentApiServer(tmp_path, quiet_then_one_event)

    async def go() -> list[tuple[str, dict[str, Any]]]:
        async with stack_api.Api(LocalCluster(server.state)) as api:
            return [ev async for ev in api.watch("/api/v1/nodes", "1")]

    try:
        events = asyncio.run(asyncio.wait_for(go(), 10))
    finally:
        server.close()
    assert events == [("ADDED", {"metadata": {"name": "n1"}})]
