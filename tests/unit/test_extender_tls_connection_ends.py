"""How TLS connections end on the extender's listeners (both loops the extender may run on).

- A mutual-TLS verb client whose request arrives with the end of its handshake and that closes at
  once (Finished + request head + FIN in one write) is a client gone (499), not a 500 with a
  traceback: the request was parsed from bytes held during the handshake, and aiohttp's connection
  was lost before the handler read the body (``RuntimeError("Connection closed.")``).
- Idle TLS connections closed to make room at the cap free their sockets at once: a closed TLS
  connection waited for the client's close_notify up to asyncio's 30 s default, so the process held
  far more sockets than ``statusMaxConnections``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import sys
import time
from pathlib import Path

import pytest

from rlsched.extender.server import serve
from rlsched.extender.settings import (
    AuthSettings,
    ExtenderSettings,
    ServerSettings,
    StatusTlsSettings,
    TlsSettings,
)
from rlsched.extender.testing import FakeKubeApi, make_node

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
try:
    from stacklib.pki import tls_pki
finally:
    sys.path.pop(0)


pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl missing (makes the test certificates)")


def _settings(pki: dict[str, Path], **server: object) -> ExtenderSettings:
    base: dict[str, object] = dict(
        port=0,
        status_port=0,
        status_host="127.0.0.1",
        header_timeout_s=2.0,
        tls=TlsSettings(str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca"])),
        status_tls=StatusTlsSettings(str(pki["server_cert"]), str(pki["server_key"])),
    )
    base.update(server)
    return ExtenderSettings(server=ServerSettings(**base), auth=AuthSettings(mode="none"))


async def _run(s: ExtenderSettings, client) -> tuple[object, object]:
    stop = asyncio.Event()
    ready = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(s, api=FakeKubeApi([make_node("g0", gpus=2)]), stop=stop, ready=ready.set_result))
    service = await asyncio.wait_for(ready, 30)
    try:
        result = await asyncio.get_running_loop().run_in_executor(None, client, service)
        await asyncio.sleep(0.5)
        return service, result
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def _loops():
    yield "asyncio"
    try:
        import uvloop  # noqa: F401

        yield "uvloop"
    except ImportError:
        pass


def _run_in(loop_kind: str, coro):
    if loop_kind == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


@pytest.mark.parametrize("loop_kind", list(_loops()))
def test_a_verb_client_that_closes_right_after_its_handshake_is_no_500(tmp_path, loop_kind) -> None:
    pki = tls_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    ctx.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{"

    def client(service) -> None:
        port = service.addresses["verbs"][1]
        for _ in range(10):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
            obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            sock.sendall(out.read())
            while True:
                inc.write(sock.recv(65536))
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    if data := out.read():
                        sock.sendall(data)
            last = out.read()
            obj.write(head)
            sock.sendall(last + out.read())  # the end of the handshake and the request head together
            sock.close()

    service, _ = _run_in(loop_kind, _run(_settings(pki), client))
    reg = service.metrics.registry
    five = reg.get_sample_value("rlsched_extender_request_seconds_count", {"verb": "filter", "code": "500"})
    gone = reg.get_sample_value("rlsched_extender_request_seconds_count", {"verb": "filter", "code": "499"})
    assert not five, f"{five:g} of 10 answered 500 (499: {gone})"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's file descriptors")
@pytest.mark.parametrize("loop_kind", list(_loops()))
def test_idle_tls_connections_closed_at_the_cap_free_their_sockets(tmp_path, loop_kind) -> None:
    pki = tls_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))

    def client(service) -> int:
        port = service.addresses["status"][1]
        before = len(os.listdir("/proc/self/fd"))
        held = []
        for _ in range(60):  # each makes one request, then holds its connection without reading
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(65536)
            held.append(s)
        time.sleep(0.5)
        # this process is client and server: each connection the server still holds is one more fd
        # beyond the 60 client sockets
        extra = len(os.listdir("/proc/self/fd")) - before - len(held)
        for s in held:
            s.close()
        return extra

    _, server_sockets = _run_in(loop_kind, _run(_settings(pki, status_max_connections=6), client))
    assert server_sockets <= 6 + 2, f"the server holds {server_sockets} sockets with statusMaxConnections 6"
