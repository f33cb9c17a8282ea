"""The operator's extender client against a status listener that serves HTTPS: the certificate is
verified against ``extender.caFile`` (read again when it changes) or the system's trust store, and
every failure — another CA, a certificate that does not name the host, plain HTTP on one side, an
unreadable CA file — is an :class:`ExtenderUnavailable` that says what to check (callers retry it),
never a crash. Certificates from the ``openssl`` command (skipped without it)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from rlsched.operator.decisionlog import Drainer
from rlsched.operator.extender_client import ExtenderClient, ExtenderUnavailable
from rlsched.operator.settings import SettingsError, load_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
try:
    from stacklib.pki import tls_pki
finally:
    sys.path.pop(0)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl missing (makes the test certificates)")

STATUS = {"policy": {"mode": "active", "fallback": "fgd", "model": {"loaded": False}}}


@asynccontextmanager
async def status_port(pki: dict[str, Path] | None, host: str = "127.0.0.1") -> AsyncIterator[int]:
    """A status listener on ``host`` (HTTPS with ``pki``'s server certificate; plain HTTP without);
    it answers /status and /decisions only with the operator's token."""

    async def status(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer op-token":
            return web.json_response({"Error": "no token"}, status=401)
        return web.json_response(STATUS)

    async def decisions(request: web.Request) -> web.Response:
        return web.json_response({"records": [], "next": 0})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/decisions", decisions)
    ctx = None
    if pki is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(pki["server_cert"]), str(pki["server_key"]))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=ctx)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@pytest.fixture
def pkis(tmp_path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The extender's PKI and a stranger's."""
    return tls_pki(tmp_path / "pki"), tls_pki(tmp_path / "rogue", "rogue")


@pytest.fixture
def token(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text("op-token")
    return str(path)


async def status_of(url: str, token: str, ca_file: str | None) -> str | None:
    client = ExtenderClient(url, 5.0, token_file=token, ca_file=ca_file)
    try:
        return (await client.status()).mode
    finally:
        await client.close()


async def test_https_is_verified_with_the_ca_file_and_the_token_still_sent(pkis, token) -> None:
    pki, _ = pkis
    async with status_port(pki) as port:
        for host in ("127.0.0.1", "localhost"):
            assert await status_of(f"https://{host}:{port}", token, str(pki["ca"])) == "active"


async def test_a_certificate_of_another_ca_is_a_clear_error_until_the_ca_file_is_right(pkis, token, tmp_path) -> None:
    pki, rogue = pkis
    ca = tmp_path / "ca.crt"
    shutil.copy(rogue["ca"], ca)
    async with status_port(pki) as port:
        client = ExtenderClient(f"https://127.0.0.1:{port}", 5.0, token_file=token, ca_file=str(ca))
        try:
            with pytest.raises(ExtenderUnavailable, match=rf"CERTIFICATE_VERIFY_FAILED.*extender\.caFile {ca}"):
                await client.status()
            # the mounted Secret gets the right CA (a new file swapped in): trusted without a restart
            fresh = tmp_path / "ca.new"
            shutil.copy(pki["ca"], fresh)
            os.replace(fresh, ca)
            assert (await client.status()).mode == "active"
        finally:
            await client.close()


async def test_the_system_store_does_not_know_a_private_ca(pkis, token) -> None:
    pki, _ = pkis
    async with status_port(pki) as port:
        with pytest.raises(ExtenderUnavailable, match="system's trust store"):
            await status_of(f"https://127.0.0.1:{port}", token, None)


async def test_a_certificate_that_does_not_name_the_host_is_refused(pkis, token) -> None:
    pki, _ = pkis
    async with status_port(pki, host="127.0.0.2") as port:  # the certificate names 127.0.0.1 and localhost
        with pytest.raises(ExtenderUnavailable, match="does not name the host"):
            await status_of(f"https://127.0.0.2:{port}", token, str(pki["ca"]))


async def test_plain_http_on_either_side_says_what_to_check(pkis, token) -> None:
    pki, _ = pkis
    async with status_port(None) as port:  # the extender without server.statusTls
        with pytest.raises(ExtenderUnavailable, match="serving HTTPS"):
            await status_of(f"https://127.0.0.1:{port}", token, str(pki["ca"]))
    async with status_port(pki) as port:  # an http:// URL to an HTTPS listener
        with pytest.raises(ExtenderUnavailable, match="must be https://"):
            await status_of(f"http://127.0.0.1:{port}", token, None)


async def test_an_unreadable_ca_file_is_named(pkis, token, tmp_path) -> None:
    pki, _ = pkis
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    async with status_port(pki) as port:
        for path in (tmp_path / "absent.crt", garbage):
            with pytest.raises(ExtenderUnavailable, match=rf"extender\.caFile {path}: not a readable PEM CA bundle"):
                await status_of(f"https://127.0.0.1:{port}", token, str(path))


async def test_the_drain_logs_a_verification_failure_and_keeps_retrying(pkis, token, caplog) -> None:
    pki, rogue = pkis
    async with status_port(pki) as port:
        client = ExtenderClient(f"https://127.0.0.1:{port}", 5.0, token_file=token, ca_file=str(rogue["ca"]))
        drainer = Drainer(client, None, interval_s=0.05)
        with caplog.at_level(logging.WARNING):
            task = asyncio.create_task(drainer.run())
            await asyncio.sleep(0.5)
            assert not task.done()  # retrying, not crashed
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await client.close()
    lines = [r.getMessage() for r in caplog.records if "cannot drain decisions" in r.getMessage()]
    assert len(lines) == 1 and "CERTIFICATE_VERIFY_FAILED" in lines[0] and str(rogue["ca"]) in lines[0]
    assert "CERTIFICATE_VERIFY_FAILED" in (drainer.last_error or "")


def test_ca_file_settings(tmp_path) -> None:
    import argparse

    from rlsched.operator.cli import _overrides, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--extender-url", "https://x.ns.svc:8889", "--extender-ca-file", "/ca/ca.crt"])
    s = load_settings(None, _overrides(args)).extender
    assert (s.status_url, s.ca_file) == ("https://x.ns.svc:8889", "/ca/ca.crt")
    assert load_settings(None, {}).extender.ca_file is None
    with pytest.raises(SettingsError, match="extender.caFile: set, but extender.statusUrl"):
        load_settings(None, {"extender.caFile": "/ca/ca.crt"})  # the default URL is http://
    with pytest.raises(SettingsError, match="extender.statusUrl: .* is not an http:// or https:// URL"):
        load_settings(None, {"extender.statusUrl": "ftp://x"})
