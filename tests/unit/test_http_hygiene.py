"""HTTP hygiene of both listeners, on real sockets through ``serve()`` with a fake API: slow clients
are dropped (headers and bodies), idle kept-alive connections are not, a client that disconnects is
no 500, open connections are capped, query parameters are bounded and blamed by name, the garbage
collector is not held off by a slow body, and the verbs can require client certificates (mutual TLS)."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import shutil
import ssl
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from rlsched.extender.server import StartupError, serve
from rlsched.extender.settings import AuthSettings, ExtenderSettings, ServerSettings, TlsSettings
from rlsched.extender.testing import FakeKubeApi, make_node, make_pod

HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5


def settings(**server: object) -> ExtenderSettings:
    base = dict(
        port=0,
        status_port=0,
        status_host="127.0.0.1",
        header_timeout_s=HEADER_TIMEOUT_S,
        body_timeout_s=BODY_TIMEOUT_S,
        idle_timeout_s=30.0,
        max_connections=4,
        status_max_connections=3,
    )
    base.update(server)
    return ExtenderSettings(server=ServerSettings(**base), auth=AuthSettings(mode="none"))


class Running:
    """serve() in this loop; ``verbs``/``status``: (host, port)."""

    def __init__(self, s: ExtenderSettings):
        self.settings, self.api = s, FakeKubeApi([make_node("g0", gpus=2), make_node("g1", gpus=2)])
        self.stop = asyncio.Event()

    async def __aenter__(self) -> Running:
        ready = asyncio.Event()
        box = {}

        def on_ready(service):
            box["service"] = service
            ready.set()

        self.task = asyncio.create_task(serve(self.settings, api=self.api, stop=self.stop, ready=on_ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait([self.task, waiter], return_when=asyncio.FIRST_COMPLETED)
        if self.task.done():
            waiter.cancel()
            self.task.result()
        self.service = box["service"]
        self.verbs, self.status = self.service.addresses["verbs"], self.service.addresses["status"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert await asyncio.wait_for(self.task, 10) == 0

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as http:
            return await (await http.get(f"http://{self.status[0]}:{self.status[1]}/metrics")).text()


async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (TimeoutError if it does not)."""
    return await asyncio.wait_for(reader.read(), timeout)


FILTER_BODY = orjson.dumps({"Pod": make_pod("p", gpus=1), "NodeNames": ["g0", "g1"]})


def request_head(path: str = "/filter", length: int = len(FILTER_BODY)) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def test_a_slowloris_client_is_dropped_and_others_are_served() -> None:
    async with Running(settings()) as run:
        reader, writer = await asyncio.open_connection(*run.verbs)
        t0 = time.monotonic()

        async def dribble() -> None:  # one byte every 50 ms: each arrives long before the deadline
            for byte in b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                if writer.is_closing():
                    return
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        slow = asyncio.create_task(dribble())
        # meanwhile a normal client is served
        async with aiohttp.ClientSession() as http:
            r = await http.post(f"http://{run.verbs[0]}:{run.verbs[1]}/filter", data=FILTER_BODY)
            assert r.status == 200 and (await r.json())["NodeNames"]
        answer = await read_until_closed(reader, 5.0)
        elapsed = time.monotonic() - t0
        slow.cancel()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"server.headerTimeoutS" in answer
        assert HEADER_TIMEOUT_S <= elapsed < HEADER_TIMEOUT_S + 1.0
        # a silent connection (not one byte) goes the same way
        reader, writer = await asyncio.open_connection(*run.status)
        assert (await read_until_closed(reader, 5.0)).startswith(b"HTTP/1.1 408 ")
        writer.close()
        text = await run.metrics()
    assert 'rlsched_extender_connections_dropped_total{listener="verbs",reason="header-timeout"} 1.0' in text
    assert 'rlsched_extender_connections_dropped_total{listener="status",reason="header-timeout"} 1.0' in text


async def test_an_idle_kept_alive_connection_is_not_cut_by_the_header_deadline() -> None:
    async with Running(settings()) as run:
        reader, writer = await asyncio.open_connection(*run.verbs)
        for _ in range(2):
            writer.write(request_head() + FILTER_BODY)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 ")
            length = int(
                next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            )
            await reader.readexactly(length)
            await asyncio.sleep(HEADER_TIMEOUT_S * 3)  # idle, well past the header deadline, far below idleTimeoutS
            assert not reader.at_eof()
        writer.close()


async def test_a_body_that_stalls_is_408_and_closes_the_connection() -> None:
    async with Running(settings()) as run:
        reader, writer = await asyncio.open_connection(*run.verbs)
        writer.write(request_head() + FILTER_BODY[:20])  # headers complete, the body stalls
        answer = await read_until_closed(reader, 5.0)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"server.bodyTimeoutS" in answer
        text = await run.metrics()
    assert 'rlsched_extender_request_seconds_count{code="408",verb="filter"} 1.0' in text


async def test_a_client_gone_mid_body_is_no_500_and_no_error(caplog) -> None:
    async with Running(settings(body_timeout_s=5.0)) as run:
        with caplog.at_level(logging.INFO):
            for verb in ("filter", "bind"):
                reader, writer = await asyncio.open_connection(*run.verbs)
                writer.write(request_head(f"/{verb}", 10_000) + b'{"Pod": {"metadata"')
                await writer.drain()
                await asyncio.sleep(0.1)
                writer.transport.abort()  # gone, mid-body
            for _ in range(100):
                if sum(r.__dict__.get("event") == "client_gone" for r in caplog.records) == 2:
                    break
                await asyncio.sleep(0.02)
        text = await run.metrics()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert sum(r.__dict__.get("event") == "client_gone" for r in caplog.records) == 2
    assert 'code="500"' not in text
    assert 'rlsched_extender_request_seconds_count{code="499",verb="filter"} 1.0' in text
    assert 'rlsched_extender_request_seconds_count{code="499",verb="bind"} 1.0' in text


async def test_open_connections_are_capped_per_listener() -> None:
    async with Running(settings(header_timeout_s=10.0)) as run:
        held = [await asyncio.open_connection(*run.verbs) for _ in range(4)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection(*run.verbs)
        answer = await read_until_closed(reader, 5.0)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"server.maxConnections" in answer
        # the status listener has its own cap: still reachable
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"http://{run.status[0]}:{run.status[1]}/healthz")).status == 200
        # connections closed: room again
        for _, w in held:
            w.close()
        await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as http:
            r = await http.post(f"http://{run.verbs[0]}:{run.verbs[1]}/filter", data=FILTER_BODY)
            assert r.status == 200
        text = await run.metrics()
    assert 'rlsched_extender_connections_dropped_total{listener="verbs",reason="over-limit"} 1.0' in text


@pytest.mark.parametrize(
    "query, blamed",
    [
        ("limit=1e3", "limit"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=%EF%BC%95", "limit"),
        ("limit=1_000", "limit"),
        ("limit=+5", "limit"),
        ("limit=%205", "limit"),
        ("after=1e3", "after"),
        ("after=-1", "after"),
        ("after=x", "after"),
        ("after=" + "9" * 5000, "after"),
        ("after=0&limit=abc", "limit"),
    ],
)
async def test_decisions_parameters_are_bounded_and_blamed_by_name(query, blamed) -> None:
    async with Running(settings()) as run:
        async with aiohttp.ClientSession() as http:
            t0 = time.monotonic()
            r = await http.get(f"http://{run.status[0]}:{run.status[1]}/decisions?{query}")
            message = (await r.json())["Error"]
            assert time.monotonic() - t0 < 1.0
    assert r.status == 400 and message.startswith(f"{blamed}: "), message
    assert len(message) < 200  # a 5,000-digit value is not echoed whole


async def test_decisions_accepts_good_parameters() -> None:
    async with Running(settings()) as run:
        async with aiohttp.ClientSession() as http:
            r = await http.get(f"http://{run.status[0]}:{run.status[1]}/decisions?after=0&limit=10000")
            assert r.status == 200 and (await r.json())["records"] == []


# -- mutual TLS on the verbs ------------------------------------------------------------------------


def _rlstack():
    spec = importlib.util.spec_from_file_location(
        "rlstack", Path(__file__).resolve().parents[2] / "hack" / "rlstack.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("rlstack", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules["rlstack"]


needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="openssl missing (makes the test certificates)"
)


@needs_openssl
async def test_verbs_over_mutual_tls_require_a_client_certificate_from_the_ca(tmp_path) -> None:
    rlstack = _rlstack()
    pki, rogue = rlstack.tls_pki(tmp_path / "pki"), rlstack.tls_pki(tmp_path / "rogue", "rogue")
    tls = TlsSettings(cert_file=str(pki["server_cert"]), key_file=str(pki["server_key"]), client_ca_file=str(pki["ca"]))
    async with Running(settings(tls=tls)) as run:
        url = f"https://127.0.0.1:{run.verbs[1]}/filter"

        def client(cert: dict | None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(pki["ca"]))
            if cert is not None:
                ctx.load_cert_chain(str(cert["client_cert"]), str(cert["client_key"]))
            return ctx

        async with aiohttp.ClientSession() as http:
            r = await http.post(url, data=FILTER_BODY, ssl=client(pki))
            assert r.status == 200 and (await r.json())["NodeNames"]
            for who in (None, rogue):  # no certificate; one from another CA
                with pytest.raises(aiohttp.ClientError):
                    await http.post(url, data=FILTER_BODY, ssl=client(who))
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served
                await http.post(f"http://127.0.0.1:{run.verbs[1]}/filter", data=FILTER_BODY)


async def test_unusable_tls_files_stop_startup_with_code_2(tmp_path) -> None:
    tls = TlsSettings(
        cert_file=str(tmp_path / "none.crt"),
        key_file=str(tmp_path / "none.key"),
        client_ca_file=str(tmp_path / "none-ca.crt"),
    )
    with pytest.raises(StartupError) as info:
        await serve(settings(tls=tls), api=FakeKubeApi([]), stop=asyncio.Event())
    assert info.value.code == 2 and "server.tls.clientCaFile" in str(info.value)
    with pytest.raises(StartupError, match="certFile, keyFile and clientCaFile together"):
        await serve(settings(tls=TlsSettings(cert_file="x")), api=FakeKubeApi([]), stop=asyncio.Event())


@needs_openssl
async def test_an_encrypted_verbs_key_is_refused_saying_so(tmp_path) -> None:
    from test_extender_status_tls import encrypted_copy

    pki = _rlstack().tls_pki(tmp_path / "pki")
    encrypted = encrypted_copy(pki["server_key"], tmp_path)
    tls = TlsSettings(cert_file=str(pki["server_cert"]), key_file=str(encrypted), client_ca_file=str(pki["ca"]))
    with pytest.raises(StartupError) as info:
        await serve(settings(tls=tls), api=FakeKubeApi([]), stop=asyncio.Event())
    assert info.value.code == 2
    assert f"server.tls.keyFile {encrypted}: encrypted private keys are not supported" in str(info.value)


def test_scheduler_config_carries_tls_only_when_asked() -> None:
    from rlsched.extender.scheduler_config import DEFAULT_URL, ClientTls, render, scheduler_config

    plain = scheduler_config()
    assert plain["extenders"][0]["enableHTTPS"] is False and "tlsConfig" not in plain["extenders"][0]
    assert render() == (Path(__file__).resolve().parents[2] / "extender" / "scheduler-config.yaml").read_text()
    tls = scheduler_config(url="https://127.0.0.1:8888", tls=ClientTls("/c/client.crt", "/c/client.key", "/c/ca.crt"))
    ext = tls["extenders"][0]
    assert ext["enableHTTPS"] is True and ext["urlPrefix"] == "https://127.0.0.1:8888"
    assert ext["tlsConfig"] == {"certFile": "/c/client.crt", "keyFile": "/c/client.key", "caFile": "/c/ca.crt"}
    with pytest.raises(ValueError, match="https"):
        scheduler_config(url=DEFAULT_URL, tls=ClientTls("a", "b", "c"))


def test_cli_prints_the_mutual_tls_scheduler_config(capsys) -> None:
    import argparse

    from rlsched.extender.cli import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    tls = [
        "--tls-cert-file",
        "s.crt",
        "--tls-key-file",
        "s.key",
        "--tls-client-ca-file",
        "ca.crt",
        "--print-scheduler-config",
    ]
    assert run(parser.parse_args(tls)) == 2
    assert "needs --client-cert-file, --client-key-file, --server-ca-file" in capsys.readouterr().err
    assert (
        run(
            parser.parse_args(
                tls
                + ["--client-cert-file", "/k/c.crt", "--client-key-file", "/k/c.key", "--server-ca-file", "/k/ca.crt"]
            )
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "urlPrefix: https://127.0.0.1:8888" in out and "enableHTTPS: true" in out and "caFile: /k/ca.crt" in out


async def test_a_body_still_arriving_does_not_keep_the_garbage_collector_off() -> None:
    """The GC pause covers parsing and deciding, not the wait for a slow body."""
    assert gc.isenabled()
    async with Running(settings(body_timeout_s=5.0)) as run:
        reader, writer = await asyncio.open_connection(*run.verbs)
        writer.write(request_head() + FILTER_BODY[:20])
        await writer.drain()
        await asyncio.sleep(0.3)  # the handler waits for the rest of the body
        on_while_waiting = gc.isenabled()
        writer.write(FILTER_BODY[20:])
        await writer.drain()
        answer = await reader.readuntil(b"\r\n\r\n")
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert on_while_waiting and gc.isenabled()


async def test_at_the_cap_the_longest_idle_connection_makes_room_for_a_probe() -> None:
    async with Running(settings(header_timeout_s=10.0)) as run:
        held = []
        for _ in range(3):  # the status listener's cap: each sends one request, then idles (kept alive)
            reader, writer = await asyncio.open_connection(*run.status)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            held.append((reader, writer))
        await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"http://{run.status[0]}:{run.status[1]}/healthz")).status == 200
        await asyncio.wait_for(held[0][0].read(), 5)  # the one idle longest was closed
        assert not held[2][0].at_eof()
        # fill the cap again, then use the oldest remaining one: the next in line is idle longest now
        for k in (3, 1):
            if k == 3:
                held.append(await asyncio.open_connection(*run.status))
            reader, writer = held[k]
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"http://{run.status[0]}:{run.status[1]}/healthz")).status == 200
        await asyncio.wait_for(held[2][0].read(), 5)
        assert not held[1][0].at_eof()
        for _, w in held:
            w.close()
        text = await run.metrics()
    assert 'rlsched_extender_connections_dropped_total{listener="status",reason="idle-at-limit"} 2.0' in text


async def test_compressed_bodies_are_refused_unread_and_never_a_500() -> None:
    import gzip

    async with Running(settings()) as run:
        url = f"http://{run.verbs[0]}:{run.verbs[1]}/filter"
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            for body in (gzip.compress(FILTER_BODY), b"not gzip at all"):
                r = await http.post(url, data=body, headers={"Content-Encoding": "gzip"})
                assert r.status == 415 and "Content-Encoding" in (await r.json())["Error"]
            bomb = gzip.compress(b" " * (64 << 20))  # 64 MiB of spaces in ~64 KiB
            r = await http.get(
                f"http://{run.status[0]}:{run.status[1]}/healthz", data=bomb, headers={"Content-Encoding": "gzip"}
            )
            assert r.status == 200
        text = await run.metrics()
    assert 'code="500"' not in text


async def test_bad_requests_are_logged_a_few_times_not_once_each(caplog) -> None:
    async with Running(settings()) as run:
        with caplog.at_level(logging.WARNING):
            async with aiohttp.ClientSession() as http:
                for _ in range(20):
                    r = await http.post(f"http://{run.verbs[0]}:{run.verbs[1]}/filter", data=b"{not json")
                    assert r.status == 400
    lines = [r for r in caplog.records if r.__dict__.get("event") == "bad_request"]
    assert len(lines) == 1


async def test_readyz_says_not_ready_while_shutting_down() -> None:
    async with Running(settings()) as run:
        run.service.health.stopping = True
        async with aiohttp.ClientSession() as http:
            r = await http.get(f"http://{run.status[0]}:{run.status[1]}/readyz")
            assert r.status == 503 and "shutdown" in (await r.json())["problems"]
