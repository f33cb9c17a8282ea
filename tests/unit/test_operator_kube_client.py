"""The operator's API wrapper (rlsched.operator.kube.Kube): answers are read and decoded off the event
loop, and whatever goes wrong reading them is a KubeError (the callers catch nothing else)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from loop_watch import loop_stalls

from rlsched.operator.kube import Kube, KubeError

BODY = b'{"kind":"ConfigMap","metadata":{"name":"x","resourceVersion":"1"},"data":{"k":"v"}}'


def head(length: int, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (content_type, length)


@pytest.fixture
def server() -> Iterator[tuple[dict[str, str], int]]:
    """One HTTP/1.1 server answering every request as ``state["mode"]`` says: slow (the body in two
    pieces 0.4 s apart), cut (the body stops short) or garbage (not JSON)."""
    state = {"mode": "slow"}
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                if state["mode"] == "slow":
                    conn.sendall(head(len(BODY)) + BODY[:20])
                    time.sleep(0.4)
                    conn.sendall(BODY[20:])
                elif state["mode"] == "cut":
                    conn.sendall(head(len(BODY)) + BODY[:20])
                    time.sleep(0.05)
                else:
                    conn.sendall(head(15, b"text/html") + b"<html>oops</ht>")

    threading.Thread(target=serve, daemon=True).start()
    yield state, srv.getsockname()[1]
    srv.close()


def kube_at(port: int) -> Kube:
    import kubernetes

    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    return Kube(cfg, timeout_s=5.0)


async def test_a_slow_answer_does_not_hold_the_event_loop(server) -> None:
    state, port = server
    kube = kube_at(port)
    async with loop_stalls() as gaps:
        cm = await kube.get_configmap("default", "x")
    assert cm is not None and cm["metadata"]["name"] == "x"
    assert max(gaps) < 0.3  # the body's 0.4 s pause was spent in the worker thread


@pytest.mark.parametrize("mode", ["cut", "garbage"])
async def test_a_broken_answer_is_a_kube_error(server, mode: str) -> None:
    state, port = server
    state["mode"] = mode
    kube = kube_at(port)
    with pytest.raises(KubeError) as err:
        await kube.get_configmap("default", "x")
    assert err.value.status == 0
