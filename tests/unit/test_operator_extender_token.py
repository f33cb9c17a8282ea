"""The operator's extender client: it sends its ServiceAccount token, re-read when the kubelet rotates
it, and takes the extender's answers as untrusted input (read up to a cap, fields checked for type)."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.operator import extender_client
from rlsched.operator.extender_client import ExtenderClient, ExtenderUnavailable, ExtenderView, TokenFile
from rlsched.operator.rollout import load_failed, serves
from rlsched.operator.settings import IN_CLUSTER_TOKEN, load_settings
from rlsched.operator.sink import Bundle


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


def test_status_fields_of_another_type_read_as_absent() -> None:
    view = ExtenderView.from_status(
        {
            "policy": {
                "mode": 5,
                "fallback": "fgd",
                "deadlineMs": "fast",
                "topK": True,
                "policyFileError": ["x"],
                "model": {"path": 7, "loaded": "yes", "version": 2, "error": 5, "errorAt": "yesterday"},
                "counters": {
                    "decisions": 1e400,  # JSON reads it as inf
                    "policy": float("nan"),
                    "fallback": 10**400,
                    "shadowAgree": -1,
                    "shadowDisagree": True,
                    "rejected": 3.0,
                    "delayed": 4,
                },
            }
        }
    )
    assert view == ExtenderView(fallback="fgd", counters={"rejected": 3, "delayed": 4})
    assert ExtenderView.from_status({"policy": {"model": "loaded", "counters": [1, 2]}}) == ExtenderView()
    assert ExtenderView.from_status({"policy": {"deadlineMs": float("inf"), "topK": 2.5}}) == ExtenderView()
    for body in ([], {"policy": "x"}, None):
        with pytest.raises(ExtenderUnavailable, match="no 'policy' object"):
            ExtenderView.from_status(body)
    # what the rollout compares is well-typed: these answers used to raise ValueError/TypeError there
    bundle = Bundle({"mode": "active", "fallback": "fgd", "deadlineMs": 100.0, "modelPath": "/m/model-0123.npz"})
    for policy in (
        {"mode": "active", "fallback": "fgd", "deadlineMs": "fast"},
        {"mode": "x", "model": {"error": "boom", "errorAt": "yesterday", "path": "/other"}},
        {"mode": "x", "model": {"error": 5, "errorAt": 9e18, "path": "/other"}},
    ):
        view = ExtenderView.from_status({"policy": policy})
        assert not serves(view, bundle) and not load_failed(view, bundle, 0.0)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve(handlers: dict[str, Handler], run: Callable[[ExtenderClient], Awaitable[None]]) -> None:
    """``run(client)`` against a server with ``handlers`` (path → handler)."""
    app = web.Application()
    for path, handler in handlers.items():
        app.router.add_get(path, handler)
    async with TestServer(app) as server:
        client = ExtenderClient(str(server.make_url("")), token_file=None)
        try:
            await run(client)
        finally:
            await client.close()


async def test_answers_are_read_up_to_a_cap(monkeypatch) -> None:
    monkeypatch.setattr(extender_client, "STATUS_MAX_BYTES", 4096)
    body = {"big": b'{"policy": {"mode": "' + b"a" * 10_000 + b'"}}'}

    async def status(request: web.Request) -> web.StreamResponse:
        if request.query.get("chunked"):  # no Content-Length: the cap applies while reading
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(body["big"]), 1000):
                await resp.write(body["big"][i : i + 1000])
            await resp.write_eof()
            return resp
        return web.Response(body=body["big"], content_type="application/json")

    async def error(request: web.Request) -> web.Response:
        return web.Response(status=500, body=b"\xff" + b"e" * 5_000_000)

    async def run(client: ExtenderClient) -> None:
        with pytest.raises(ExtenderUnavailable, match="larger than 4,096 bytes"):
            await client.status()
        with pytest.raises(ExtenderUnavailable, match="larger than 4,096 bytes"):
            await client._get("/status", {"chunked": "1"}, extender_client.STATUS_MAX_BYTES)
        body["big"] = b'{"policy": {"mode": "active"}}'
        assert (await client.status()).mode == "active"
        for garbage in (b"[" * 3000, b'{"policy": ', b"\xff\xfe"):  # nested too deep, truncated, not UTF-8
            body["big"] = garbage
            with pytest.raises(ExtenderUnavailable):
                await client.status()
        with pytest.raises(ExtenderUnavailable, match="HTTP 500") as err:
            await client._get("/error", None, 10)
        assert len(str(err.value)) < 400

    await _serve({"/status": status, "/error": error}, run)


async def test_decisions_pages_that_do_not_fit_are_asked_for_in_halves(monkeypatch) -> None:
    monkeypatch.setattr(extender_client, "DECISION_RECORD_BYTES", 100)
    asked: list[int] = []

    async def decisions(request: web.Request) -> web.Response:
        limit = int(request.query["limit"])
        asked.append(limit)
        records = [{"seq": i + 1, "pad": "x" * 300} for i in range(min(limit, 3))]  # ~320 bytes each
        return web.json_response({"next": len(records), "last": 3, "records": records})

    async def run(client: ExtenderClient) -> None:
        body = await client.decisions(0, limit=4)  # the cap: 4 x 100 bytes; one record fits, two do not
        assert [r["seq"] for r in body["records"]] == [1] and asked == [4, 2, 1]
        monkeypatch.setattr(extender_client, "DECISION_RECORD_BYTES", 10)
        with pytest.raises(ExtenderUnavailable, match="larger than"):  # not even one record fits
            await client.decisions(0, limit=2)

    await _serve({"/decisions": decisions}, run)
