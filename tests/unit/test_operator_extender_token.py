"""The operator's extender client sends its ServiceAccount token, re-read when the kubelet rotates it."""

from __future__ import annotations

import logging
import os

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.operator.extender_client import ExtenderClient, ExtenderUnavailable, TokenFile
from rlsched.operator.settings import IN_CLUSTER_TOKEN, load_settings


async def test_token_is_sent_and_rotation_is_picked_up(tmp_path) -> None:
    seen: list[str | None] = []

    async def decisions(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer new-token":
            return web.json_response({"Error": "user 'x' may not get /decisions"}, status=403)
        return web.json_response({"records": [], "next": 0})

    app = web.Application()
    app.router.add_get("/decisions", decisions)
    token = tmp_path / "token"
    token.write_text("old-token\n")
    async with TestServer(app) as server:
        client = ExtenderClient(str(server.make_url("")), token_file=str(token))
        try:
            with pytest.raises(ExtenderUnavailable, match="403.*needs get on the non-resource URL /decisions"):
                await client.decisions(0)
            # the kubelet swaps the file (a new inode, like its ..data symlink flip)
            fresh = tmp_path / "token.new"
            fresh.write_text("new-token")
            os.replace(fresh, token)
            assert (await client.decisions(0))["records"] == []
        finally:
            await client.close()
    assert seen == ["Bearer old-token", "Bearer new-token"]


async def test_no_token_file_sends_no_header_and_says_so(tmp_path, caplog) -> None:
    seen: list[str | None] = []

    async def status(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"Error": "authentication required"}, status=401)

    app = web.Application()
    app.router.add_get("/status", status)
    async with TestServer(app) as server:
        client = ExtenderClient(str(server.make_url("")), token_file=str(tmp_path / "absent"))
        try:
            with caplog.at_level(logging.WARNING), pytest.raises(ExtenderUnavailable, match="no token sent"):
                await client.status()
        finally:
            await client.close()
    assert seen == [None] and "absent missing" in caplog.text


def test_token_file_bounds_and_quiet_default(tmp_path, caplog) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 70000)
    with caplog.at_level(logging.WARNING):
        assert TokenFile(str(big)).token() is None
        assert TokenFile(str(tmp_path / "nope"), quiet_if_missing=True).token() is None
    assert "larger than" in caplog.text and "nope" not in caplog.text
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe")
    assert TokenFile(str(binary)).token() is None and TokenFile(None).token() is None


def test_setting_defaults_to_the_in_cluster_token() -> None:
    assert load_settings(None, {}).extender.token_file == IN_CLUSTER_TOKEN
    assert load_settings(None, {"extender.tokenFile": "/run/t"}).extender.token_file == "/run/t"
