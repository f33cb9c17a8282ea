"""HTTPS on the status listener (``server.statusTls``), on real sockets through ``serve()``:

- the settings come as a pair (file, environment, flags), and a file that cannot be used stops
  start-up with code 2, naming it;
- a client that trusts the CA gets /healthz over TLS; /status still wants a token and reports the
  certificate; plain HTTP on the TLS port is closed without a 5xx and without a traceback;
- the TLS handshake happens under the listener's guard: ``statusMaxConnections`` counts connections
  still in their handshake (a flood of silent ones cannot take the process's file descriptors), and
  a handshake that times out or fails closes the connection, frees its place and is counted, without
  a traceback; the same under uvloop, the loop the CLI runs;
- rotation: a Secret volume's symlink swap to a new pair is picked up and new connections get it, even
  when the key type changes (RSA ↔ ECDSA); a pair that does not load (a key of another certificate, a
  half-written file, files that change while they are read) leaves the old one serving, and is
  counted and logged once; an encrypted key is refused, saying so.

The certificates come from the ``openssl`` command (skipped without it), as in test_http_hygiene.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from test_extender_auth import FakeReviewApi
from test_http_hygiene import Running

from rlsched.extender import status_tls as status_tls_module
from rlsched.extender.server import StartupError, serve
from rlsched.extender.settings import (
    AuthSettings,
    ConfigError,
    ExtenderSettings,
    ServerSettings,
    StatusTlsSettings,
    TlsSettings,
    load_settings,
)
from rlsched.extender.status_tls import StatusTls
from rlsched.extender.testing import FakeKubeApi, make_node

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
try:
    from stacklib.pki import tls_pki
finally:
    sys.path.pop(0)

needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="openssl missing (makes the test certificates)"
)


def settings(tls: StatusTlsSettings, auth: str = "kubernetes") -> ExtenderSettings:
    server = ServerSettings(port=0, status_port=0, status_host="127.0.0.1", status_tls=tls)
    return ExtenderSettings(server=server, auth=AuthSettings(mode=auth))


def kubelet_volume(folder: Path, pki: dict[str, Path], version: str) -> StatusTlsSettings:
    """A Secret volume as the kubelet lays it out: ``tls.crt -> ..data/tls.crt``, ``..data -> ..<version>``;
    called again with another version, it swaps ``..data`` atomically, as the kubelet does."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"..{version}"
    target.mkdir()
    shutil.copy(pki["server_cert"], target / "tls.crt")
    shutil.copy(pki["server_key"], target / "tls.key")
    tmp = folder / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, folder / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    return StatusTlsSettings(cert_file=str(folder / "tls.crt"), key_file=str(folder / "tls.key"))


async def served_certificate(port: int) -> bytes:
    """The DER certificate a new connection to the status port gets (not verified)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        return writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()


async def served_to_key_type(port: int, kind: str) -> bytes | None:
    """The DER certificate a TLS 1.2 client that accepts only ``kind`` (``ec``, ``rsa``) signatures gets
    (not verified), or None when the handshake fails: the server has no certificate of that type."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers({"ec": "ECDHE-ECDSA-AES128-GCM-SHA256", "rsa": "ECDHE-RSA-AES128-GCM-SHA256"}[kind])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except (ssl.SSLError, ConnectionError):
        return None
    try:
        return writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def encrypted_copy(key: Path, folder: Path) -> Path:
    """``key`` encrypted with a passphrase (AES-256), as ``openssl pkey -aes256`` writes it."""
    out = folder / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret", "-out", str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def dropped(run: Running, reason: str, listener: str = "status") -> float | None:
    return run.service.metrics.registry.get_sample_value(
        "rlsched_extender_connections_dropped_total", {"listener": listener, "reason": reason}
    )


def open_connections(run: Running, listener: str = "status") -> float | None:
    return run.service.metrics.registry.get_sample_value("rlsched_extender_connections", {"listener": listener})


def reviewed(s: ExtenderSettings) -> Running:
    """serve() with a fake API that also answers TokenReviews and SubjectAccessReviews."""
    run = Running(s)
    run.api.request = FakeReviewApi().request  # type: ignore[attr-defined]
    return run


# -- settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given, missing", [("certFile", "keyFile"), ("keyFile", "certFile")])
def test_one_file_without_the_other_is_refused_naming_the_missing_one(tmp_path, given, missing) -> None:
    path = tmp_path / "extender.yaml"
    path.write_text(f"server:\n  statusTls:\n    {given}: /etc/tls/x\n")
    with pytest.raises(ConfigError, match=rf"server\.statusTls\.{missing}: .*certFile and keyFile together"):
        load_settings(path)
    # the pair may come from two sources: the file and the environment
    other = "RLSCHED_SERVER_STATUS_TLS_" + ("KEY_FILE" if missing == "keyFile" else "CERT_FILE")
    s = load_settings(path, env={other: "/etc/tls/y"})
    assert {s.server.status_tls.cert_file, s.server.status_tls.key_file} == {"/etc/tls/x", "/etc/tls/y"}


def test_the_cli_flags_set_the_pair() -> None:
    import argparse

    from rlsched.extender.cli import _overrides, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--status-tls-cert-file", "/c/tls.crt", "--status-tls-key-file", "/c/tls.key"])
    s = load_settings(None, {}, _overrides(args)).server.status_tls
    assert (s.cert_file, s.key_file) == ("/c/tls.crt", "/c/tls.key")
    with pytest.raises(ConfigError, match="statusTls.keyFile"):
        load_settings(None, {}, _overrides(parser.parse_args(["--status-tls-cert-file", "/c/tls.crt"])))


def test_tls_is_no_authentication_auth_none_stays_on_loopback() -> None:
    tls = {"server.statusTls.certFile": "/c/tls.crt", "server.statusTls.keyFile": "/c/tls.key"}
    with pytest.raises(ConfigError, match="server.statusHost"):
        load_settings(None, {}, {**tls, "server.statusHost": "0.0.0.0", "auth.mode": "none"})


@needs_openssl
async def test_files_that_cannot_be_used_stop_startup_naming_them(tmp_path) -> None:
    pki, other = tls_pki(tmp_path / "pki"), tls_pki(tmp_path / "other", "other")
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    cases = [
        (StatusTlsSettings(str(tmp_path / "none.crt"), str(pki["server_key"])), "certFile", "none.crt"),
        (StatusTlsSettings(str(pki["server_cert"]), str(tmp_path / "none.key")), "keyFile", "none.key"),
        (StatusTlsSettings(str(tmp_path), str(pki["server_key"])), "certFile", str(tmp_path)),  # a folder
        (StatusTlsSettings(str(garbage), str(pki["server_key"])), "certFile", "garbage.crt"),
        (StatusTlsSettings(str(pki["server_cert"]), str(other["server_key"])), "keyFile", "server.key"),
    ]
    for tls, key, named in cases:
        with pytest.raises(StartupError) as info:
            await serve(settings(tls, auth="none"), api=FakeKubeApi([]), stop=asyncio.Event())
        assert info.value.code == 2, info.value
        assert f"server.statusTls.{key} " in str(info.value) and named in str(info.value), str(info.value)


@needs_openssl
async def test_an_encrypted_key_is_refused_saying_so_and_never_asks_for_a_passphrase(tmp_path, capfd) -> None:
    pki = tls_pki(tmp_path / "pki")
    encrypted = encrypted_copy(pki["server_key"], tmp_path)
    with pytest.raises(StartupError) as info:
        await serve(
            settings(StatusTlsSettings(str(pki["server_cert"]), str(encrypted)), auth="none"),
            api=FakeKubeApi([]),
            stop=asyncio.Event(),
        )
    assert info.value.code == 2
    assert f"server.statusTls.keyFile {encrypted}: encrypted private keys are not supported" in str(info.value)
    # a rotation to an encrypted key: the old pair serves on, and the reload error says why
    key = tmp_path / "tls.key"
    shutil.copy(pki["server_key"], key)
    live = StatusTls(StatusTlsSettings(str(pki["server_cert"]), str(key)))
    await asyncio.sleep(0.01)  # a later mtime
    shutil.copy(encrypted, key)
    assert live.check() is False
    assert "encrypted private keys are not supported" in live.status()["reloadError"]
    assert "pass phrase" not in capfd.readouterr().err  # OpenSSL's prompt (on a terminal it would wait)


# -- the listener -----------------------------------------------------------------------------------------


@needs_openssl
async def test_https_status_listener_verified_with_the_ca_and_tokens_still_needed(tmp_path, caplog) -> None:
    pki = tls_pki(tmp_path / "pki")
    tls = StatusTlsSettings(str(pki["server_cert"]), str(pki["server_key"]))
    async with reviewed(settings(tls)) as run:
        port = run.status[1]
        trusting = ssl.create_default_context(cafile=str(pki["ca"]))
        ctx = run.service.status_tls.context
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and ctx.verify_mode == ssl.CERT_NONE
        async with aiohttp.ClientSession() as http:
            for host in ("127.0.0.1", "localhost"):  # the names the certificate carries
                r = await http.get(f"https://{host}:{port}/healthz", ssl=trusting)
                assert r.status == 200 and (await r.json())["ok"]
            r = await http.get(f"https://127.0.0.1:{port}/status", ssl=trusting)
            assert r.status == 401  # TLS authenticates the server, not the caller
            r = await http.get(
                f"https://127.0.0.1:{port}/status", ssl=trusting, headers={"Authorization": "Bearer op-token"}
            )
            assert r.status == 200
            shown = (await r.json())["statusTls"]
            assert shown["enabled"] is True and shown["certFile"] == str(pki["server_cert"])
            assert shown["loadedAt"] > 0 and shown["reloadError"] is None
            assert shown["notAfter"] is None or shown["notAfter"] > shown["loadedAt"]  # 2 days (stacklib.pki)
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the system store does not know the CA
                await http.get(f"https://127.0.0.1:{port}/healthz")
        # plain HTTP to the TLS port: closed, never a 5xx, nothing alarming in the log
        with caplog.at_level(logging.DEBUG):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert not answer.startswith(b"HTTP/1.1 5"), answer[:100]
            async with aiohttp.ClientSession() as http:  # the listener serves on
                assert (await http.get(f"https://127.0.0.1:{port}/healthz", ssl=trusting)).status == 200
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]


@needs_openssl
async def test_plain_http_status_listener_without_the_settings(tmp_path) -> None:
    async with reviewed(settings(StatusTlsSettings())) as run:
        async with aiohttp.ClientSession() as http:
            r = await http.get(f"http://127.0.0.1:{run.status[1]}/status", headers={"Authorization": "Bearer op-token"})
            assert (await r.json())["statusTls"] == {"enabled": False}


@needs_openssl
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's file descriptors in /proc")
async def test_status_max_connections_counts_connections_still_in_their_tls_handshake(tmp_path) -> None:
    pki = tls_pki(tmp_path / "pki")
    s = settings(StatusTlsSettings(str(pki["server_cert"]), str(pki["server_key"])))
    s.server.status_max_connections = 4
    async with reviewed(s) as run:
        before = len(os.listdir("/proc/self/fd"))
        held = [(await asyncio.open_connection(*run.status))[1] for _ in range(60)]  # never a ClientHello
        await asyncio.sleep(0.5)
        kept_by_the_server = len(os.listdir("/proc/self/fd")) - before - len(held)
        assert open_connections(run) == 4 and dropped(run, "over-limit") == 56
        for writer in held:
            writer.close()
    assert kept_by_the_server <= 4 + 2, f"{kept_by_the_server} server-side sockets open (statusMaxConnections 4)"


@needs_openssl
async def test_a_tls_handshake_that_times_out_or_fails_is_dropped_counted_and_logged_quietly(tmp_path, caplog) -> None:
    pki = tls_pki(tmp_path / "pki")
    s = settings(StatusTlsSettings(str(pki["server_cert"]), str(pki["server_key"])))
    s.server.header_timeout_s, s.server.status_max_connections = 0.3, 2
    trusting = ssl.create_default_context(cafile=str(pki["ca"]))
    async with reviewed(s) as run:
        with caplog.at_level(logging.DEBUG):
            silent = [await asyncio.open_connection(*run.status) for _ in range(3)]  # the cap (2) and one more
            for reader, writer in silent:
                assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
                writer.close()
            reader, writer = await asyncio.open_connection(*run.status)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP: no TLS handshake
            await asyncio.wait_for(reader.read(), 5)
            writer.close()
            await asyncio.sleep(0.05)
            # every place is free again, and a client that speaks TLS is served
            assert open_connections(run) == 0
            async with aiohttp.ClientSession() as http:
                assert (await http.get(f"https://127.0.0.1:{run.status[1]}/healthz", ssl=trusting)).status == 200
        assert (dropped(run, "tls-handshake-timeout"), dropped(run, "over-limit")) == (2, 1)
        assert dropped(run, "tls-handshake-failed") == 1
    drops = [r for r in caplog.records if r.__dict__.get("event") == "connection_dropped"]
    assert {r.__dict__["reason"] for r in drops} == {"tls-handshake-timeout", "tls-handshake-failed", "over-limit"}
    assert sum(r.__dict__["reason"] == "tls-handshake-timeout" for r in drops) == 1  # throttled: 2 drops, 1 line
    handshakes = [r for r in drops if r.__dict__["reason"].startswith("tls-")]
    assert all(r.levelno == logging.INFO for r in handshakes)  # a client's mistake, as plain HTTP on the port
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


@needs_openssl
def test_the_tls_listener_under_uvloop_caps_and_drops_handshakes_and_serves(tmp_path) -> None:
    uvloop = pytest.importorskip("uvloop")  # what the CLI runs the extender on
    pki = tls_pki(tmp_path / "pki")
    s = settings(StatusTlsSettings(str(pki["server_cert"]), str(pki["server_key"])))
    s.server.header_timeout_s, s.server.status_max_connections = 0.3, 2
    trusting = ssl.create_default_context(cafile=str(pki["ca"]))

    async def main() -> None:
        async with reviewed(s) as run:
            silent = [await asyncio.open_connection(*run.status) for _ in range(5)]
            await asyncio.sleep(0.1)
            assert open_connections(run) == 2 and dropped(run, "over-limit") == 3
            for reader, writer in silent:
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            async with aiohttp.ClientSession() as http:
                for _ in range(5):  # a new connection each time
                    r = await http.get(f"https://localhost:{run.status[1]}/healthz", ssl=trusting)
                    assert r.status == 200 and (await r.json())["ok"]
                    await http.close()
                    http = aiohttp.ClientSession()
            assert dropped(run, "tls-handshake-timeout") == 2

    uvloop.run(main())


@needs_openssl
@pytest.mark.parametrize("key_type", ["rsa", "ec"])
def test_a_client_that_sends_its_hello_at_once_is_served_under_uvloop(tmp_path, key_type) -> None:
    """uvloop starts reading as soon as connection_made returns, whatever it paused: a client hello
    sent at once reached the guard before start_tls took the connection over, was taken for
    decrypted data, and the handshake waited for it until the deadline (about 1 in 10 connections of
    curl against the chart's RSA certificate). A client in another thread, as curl or Prometheus."""
    uvloop = pytest.importorskip("uvloop")
    import urllib.request

    pki = tls_pki(tmp_path / "pki", key_type=key_type)
    s = settings(StatusTlsSettings(str(pki["server_cert"]), str(pki["server_key"])))
    s.server.header_timeout_s = 3.0
    trusting = ssl.create_default_context(cafile=str(pki["ca"]))

    def client(port: int) -> list[str]:
        failures = []
        for _ in range(60):  # a new connection each time
            try:
                with urllib.request.urlopen(f"https://localhost:{port}/healthz", timeout=2, context=trusting) as r:
                    assert r.status == 200
            except OSError as exc:
                failures.append(repr(exc))
        return failures

    async def main() -> list[str]:
        async with reviewed(s) as run:
            return await asyncio.get_running_loop().run_in_executor(None, client, run.status[1])

    failures = uvloop.run(main())
    assert failures == []


# -- rotation -----------------------------------------------------------------------------------------------


@needs_openssl
async def test_a_rotated_pair_serves_new_connections(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(status_tls_module, "RELOAD_CHECK_S", 0.05)
    first, second = tls_pki(tmp_path / "first"), tls_pki(tmp_path / "second", "second")
    tls = kubelet_volume(tmp_path / "volume", first, "v1")
    async with reviewed(settings(tls)) as run:
        port = run.status[1]
        assert await served_certificate(port) == der(first["server_cert"])
        loaded = run.service.status_tls.loaded_at
        kubelet_volume(tmp_path / "volume", second, "v2")  # the kubelet's symlink swap
        for _ in range(100):  # the background check (every 0.05 s here)
            if await served_certificate(port) == der(second["server_cert"]):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the new certificate was not served within 5 s")
        assert run.service.status_tls.loaded_at >= loaded
        trusting = ssl.create_default_context(cafile=str(second["ca"]))
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"https://localhost:{port}/healthz", ssl=trusting)).status == 200
        assert 'rlsched_extender_status_tls_reloads_total{result="ok"} 1.0' in run.service.metrics.render().decode()


def openssl_not_after(cert: Path) -> float:
    """notAfter as openssl prints it (an independent reading of the date the extender exports)."""
    done = subprocess.run(
        ["openssl", "x509", "-noout", "-enddate", "-in", str(cert)], capture_output=True, text=True, check=True
    )
    return float(ssl.cert_time_to_seconds(done.stdout.strip().removeprefix("notAfter=")))


def self_signed(folder: Path, days: int) -> dict[str, Path]:
    """A self-signed EC pair for localhost valid ``days`` days: another notAfter than tls_pki's."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", str(days), "-subj", "/CN=localhost"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return {"server_cert": cert, "server_key": key}


@needs_openssl
async def test_the_certificate_expiry_is_exported_and_follows_a_rotation(tmp_path) -> None:
    first = tls_pki(tmp_path / "first")  # valid 2 days
    if status_tls_module.not_after(str(first["server_cert"])) is None:
        pytest.skip("this Python cannot decode a certificate file (ssl._ssl._test_decode_cert): no gauge")
    tls = kubelet_volume(tmp_path / "volume", first, "v1")
    name = "rlsched_extender_status_tls_not_after_seconds"
    async with reviewed(settings(tls)) as run:
        exported = lambda: run.service.metrics.registry.get_sample_value(name)  # noqa: E731
        assert exported() == openssl_not_after(first["server_cert"])
        assert 0 < exported() - time.time() <= 2 * 86400
        later = self_signed(tmp_path / "later", days=40)
        kubelet_volume(tmp_path / "volume", later, "v2")
        assert run.service.status_tls.check() is True
        assert exported() == openssl_not_after(later["server_cert"])
        assert 39 * 86400 < exported() - time.time() <= 40 * 86400


async def test_no_expiry_gauge_without_status_tls() -> None:
    async with reviewed(settings(StatusTlsSettings())) as run:
        assert run.service.status_tls is None
        assert "rlsched_extender_status_tls_not_after_seconds" not in run.service.metrics.render().decode()


@needs_openssl
async def test_a_pair_that_does_not_load_keeps_the_old_one_counted_and_logged_once(tmp_path, caplog) -> None:
    first, second = tls_pki(tmp_path / "first"), tls_pki(tmp_path / "second", "second")
    tls = kubelet_volume(tmp_path / "volume", first, "v1")
    async with reviewed(settings(tls)) as run:
        port, live = run.status[1], run.service.status_tls
        text = lambda: run.service.metrics.render().decode()  # noqa: E731
        with caplog.at_level(logging.WARNING, logger="rlsched.extender.tls"):
            # the new certificate, the old key (a rotation half done), twice: one line in the log
            for version in ("v2", "v3"):
                mixed = {"server_cert": second["server_cert"], "server_key": first["server_key"]}
                kubelet_volume(tmp_path / "volume", mixed, version)
                assert live.check() is False and live.check() is False  # tried once per change
                assert await served_certificate(port) == der(first["server_cert"])
            assert 'rlsched_extender_status_tls_reloads_total{result="error"} 2.0' in text()
            assert [r.__dict__.get("event") for r in caplog.records] == ["tls_reload_failed"]
            assert "server.statusTls.keyFile" in caplog.records[0].getMessage()
            # a half-written certificate file
            Path(tls.cert_file).write_text(second["server_cert"].read_text()[:200])
            assert live.check() is False
            assert await served_certificate(port) == der(first["server_cert"])
            assert "server.statusTls.certFile" in live.status()["reloadError"]
        # the rotation completes: the new pair serves
        kubelet_volume(tmp_path / "volume", second, "v4")
        assert live.check() is True and live.status()["reloadError"] is None
        assert await served_certificate(port) == der(second["server_cert"])
        assert 'rlsched_extender_status_tls_reloads_total{result="ok"} 1.0' in text()


@needs_openssl
def test_the_check_survives_a_missing_file(tmp_path) -> None:
    pki = tls_pki(tmp_path / "pki")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki["server_cert"], cert)
    shutil.copy(pki["server_key"], key)
    results: list[str] = []
    live = StatusTls(StatusTlsSettings(str(cert), str(key)), results.append)
    cert.unlink()
    assert live.check() is False and live.check() is False and results == ["error"]
    shutil.copy(pki["server_cert"], cert)
    assert live.check() is True and results == ["error", "ok"]


@needs_openssl
@pytest.mark.parametrize("first, second", [("ec", "rsa"), ("rsa", "ec")])
async def test_a_rotation_to_another_key_type_serves_the_new_certificate(tmp_path, first, second) -> None:
    pairs = {kind: tls_pki(tmp_path / kind, kind, key_type=kind) for kind in (first, second)}
    tls = kubelet_volume(tmp_path / "volume", pairs[first], "v1")
    async with reviewed(settings(tls)) as run:
        port, live = run.status[1], run.service.status_tls
        assert await served_certificate(port) == der(pairs[first]["server_cert"])
        kubelet_volume(tmp_path / "volume", pairs[second], "v2")
        assert live.check() is True
        assert await served_certificate(port) == der(pairs[second]["server_cert"]), f"{first} still served"
        assert await served_to_key_type(port, first) is None  # the old pair is gone from every handshake
        trusting = ssl.create_default_context(cafile=str(pairs[second]["ca"]))
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"https://localhost:{port}/healthz", ssl=trusting)).status == 200


@needs_openssl
async def test_files_that_change_during_a_reload_never_leave_the_listener_without_a_key(tmp_path, monkeypatch) -> None:
    first, second, third = (tls_pki(tmp_path / n, n) for n in ("first", "second", "third"))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first["server_cert"], cert)
    shutil.copy(first["server_key"], key)
    live = StatusTls(StatusTlsSettings(str(cert), str(key)))
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=live.context)
    port = server.sockets[0].getsockname()[1]
    load, loads = ssl.SSLContext.load_cert_chain, []

    def racing(ctx: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        load(ctx, *args, **kwargs)
        loads.append(ctx)
        if len(loads) == 1:  # the next rotation lands right after the pair was read: a half-written one
            shutil.copy(third["server_cert"], cert)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", racing)
    try:
        await asyncio.sleep(0.01)  # a later mtime
        shutil.copy(second["server_cert"], cert)
        shutil.copy(second["server_key"], key)
        for _ in range(3):
            live.check()
        assert live.status()["reloadError"] and "server.statusTls.keyFile" in live.status()["reloadError"]
        assert await served_certificate(port) == der(second["server_cert"])  # the last pair that loaded
    finally:
        server.close()


# -- how TLS connections end -----------------------------------------------------------------------
# How TLS connections end on the extender's listeners (both loops the extender may run on).
#
# - A mutual-TLS verb client whose request arrives with the end of its handshake and that closes at
#   once (Finished + request head + FIN in one write) is a client gone (499), not a 500 with a
#   traceback: the request was parsed from bytes held during the handshake, and aiohttp's connection
#   was lost before the handler read the body (``RuntimeError("Connection closed.")``).
# - Idle TLS connections closed to make room at the cap free their sockets at once: a closed TLS
#   connection waited for the client's close_notify up to asyncio's 30 s default, so the process held
#   far more sockets than ``statusMaxConnections``.


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


@needs_openssl
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


@needs_openssl
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
