"""The API client against a fake API server over HTTP, and the informer's resume/relist rules."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from loop_watch import loop_stalls
from sleep_clock import SleepClock

from rlsched.extender.kubeapi import MAX_WATCH_LINE_BYTES, ApiError, BadWatchLine, Informer, KubeApi
from rlsched.extender.metrics import Metrics
from rlsched.extender.settings import KubeSettings
from rlsched.extender.testing import ScriptedWatchApi, make_node, make_pod


def status(code, reason, message):
    return web.json_response(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code},
        status=code,
    )


def write_kubeconfig(path: Path, cluster: dict, user: dict) -> Path:
    """A kubeconfig of one cluster, one user and the context joining them."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": cluster}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


class FakeServer:
    """Just enough of kube-apiserver: paginated lists, a chunked watch, binding."""

    def __init__(self) -> None:
        self.nodes = [make_node(f"n{i}", gpus=1) for i in range(5)]
        self.pod = make_pod("p", uid="uid-p", gpus=1)
        self.requests: list[tuple[str, str, dict]] = []
        self.watch_events: list[bytes] = []
        self.expire_continue = False
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self.nodes_handler)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self.bind)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.get)
        self.app = app

    async def nodes_handler(self, request):
        self.requests.append(("GET", request.path, dict(request.query)))
        assert request.headers["Authorization"] == "Bearer secret"
        if request.query.get("watch"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            for chunk in self.watch_events:
                await resp.write(chunk)
                await asyncio.sleep(0)
            return resp
        if "limit" not in request.query:
            return web.json_response({"kind": "NodeList", "metadata": {"resourceVersion": "78"}, "items": self.nodes})
        if self.expire_continue and request.query.get("continue"):
            return status(410, "Expired", "The provided continue parameter is too old")
        limit = int(request.query["limit"])
        start = int(request.query.get("continue") or 0)
        items = self.nodes[start : start + limit]
        cont = str(start + limit) if start + limit < len(self.nodes) else ""
        return web.json_response(
            {"kind": "NodeList", "metadata": {"resourceVersion": "77", "continue": cont}, "items": items}
        )

    async def bind(self, request):
        body = await request.json()
        self.requests.append(("POST", request.path, body))
        if body["metadata"]["uid"] != self.pod["metadata"]["uid"]:
            return status(409, "Conflict", "Precondition failed: UID in precondition: other, UID in object meta: uid-p")
        if self.pod["spec"].get("nodeName"):
            return status(409, "Conflict", f'pod p is already assigned to node "{self.pod["spec"]["nodeName"]}"')
        self.pod["spec"]["nodeName"] = body["target"]["name"]
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    async def get(self, request):
        if request.match_info["name"] != "p":
            return status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        return web.json_response(self.pod)


@pytest.fixture
async def server():
    fake = FakeServer()
    async with TestServer(fake.app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: "Bearer secret")
        yield fake, api
        await api.close()


async def test_list_is_paginated(server) -> None:
    fake, api = server
    items, rv = await api.list("/api/v1/nodes", limit=2)
    assert [i["metadata"]["name"] for i in items] == [f"n{i}" for i in range(5)] and rv == "77"
    assert [r[2].get("continue") for r in fake.requests] == [None, "2", "4"]


async def test_watch_splits_lines_across_chunks(server) -> None:
    fake, api = server
    ev = [orjson.dumps({"type": "MODIFIED", "object": n}) + b"\n" for n in fake.nodes[:3]]
    blob = b"".join(ev)
    fake.watch_events = [blob[:100], blob[100:5000], blob[5000:]]  # boundaries inside the objects
    got = [e async for e in api.watch("/api/v1/nodes", "77", 5)]
    assert [e["object"]["metadata"]["name"] for e in got] == ["n0", "n1", "n2"]
    q = fake.requests[-1][2]
    assert q["resourceVersion"] == "77" and q["allowWatchBookmarks"] == "true" and q["timeoutSeconds"] == "5"


async def test_writes_and_their_errors(server) -> None:
    fake, api = server
    with pytest.raises(ApiError) as info:
        await api.create_binding("default", "p", "other", "n1", 2)
    assert info.value.status == 409 and "UID" in info.value.message
    await api.create_binding("default", "p", "uid-p", "n1", 2, {"rlsched.io/gpu-cards": "0"})
    assert fake.requests[-1][2]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert fake.requests[-1][2]["metadata"] == {
        "name": "p",
        "namespace": "default",
        "uid": "uid-p",
        "annotations": {"rlsched.io/gpu-cards": "0"},
    }
    with pytest.raises(ApiError) as info:
        await api.create_binding("default", "p", "uid-p", "n2", 2)
    assert info.value.status == 409 and "already assigned" in info.value.message
    with pytest.raises(ApiError) as info:
        await api.get_pod("default", "gone", 2)
    assert info.value.status == 404 and info.value.reason == "NotFound"


async def test_unreachable_server() -> None:
    api = KubeApi("http://127.0.0.1:1", None, lambda: None)
    with pytest.raises(ApiError) as info:
        await api.list("/api/v1/nodes", timeout=2)
    await api.close()
    assert info.value.status == 0 and "cannot reach the API server" in str(info.value)


def ev(kind, name, rv):
    n = make_node(name, rv=rv)
    return {"type": kind, "object": n}


async def test_informer_resumes_and_relists_on_410() -> None:
    seen = []
    api = ScriptedWatchApi(
        [
            ("list", [make_node("a", rv="1")], "10"),
            (
                "watch",
                [
                    ev("ADDED", "b", "11"),
                    {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "15"}}},
                ],
            ),
            ("watch", [ApiError(0, "Unreachable", "connection reset")]),
            (
                "watch",
                [
                    ev("MODIFIED", "b", "16"),
                    {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}},
                ],
            ),
            ("list", [make_node("c", rv="20")], "20"),
            ("watch", [ev("DELETED", "c", "21")]),
        ]
    )
    sleeps = []

    async def sleep(s):
        sleeps.append(s)

    inf = Informer(
        api,
        "nodes",
        "/api/v1/nodes",
        lambda items: seen.append(("replace", [i["metadata"]["name"] for i in items])),
        lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        KubeSettings(),
        sleep=sleep,
        jitter=lambda: 1.0,
    )  # the longest backoff of the jittered range
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert seen == [("replace", ["a"]), ("ADDED", "b"), ("MODIFIED", "b"), ("replace", ["c"]), ("DELETED", "c")]
    assert [c[1] for c in api.calls if c[0] == "watch"] == ["10", "15", "15", "20", "21"]
    assert sleeps == [1.0] and inf.resource_version == "21"


async def test_watch_refuses_a_line_longer_than_the_cap(server) -> None:
    fake, api = server
    pad = b"x" * (1 << 16)
    chunks = MAX_WATCH_LINE_BYTES // len(pad) * 3  # a valid event three times the cap, never read whole
    fake.watch_events = [b'{"type":"ADDED","object":{"pad":"'] + [pad] * chunks + [b'"}}\n']
    with pytest.raises(BadWatchLine, match="longer than"):
        async for _ in api.watch("/api/v1/nodes", "77", 5):
            pass


async def test_informer_relists_after_an_overlong_watch_line() -> None:
    api = ScriptedWatchApi(
        [
            ("list", [make_node("a", rv="1")], "10"),
            ("watch", [ev("ADDED", "b", "11"), BadWatchLine("watch /api/v1/nodes: an event longer than 16 MiB")]),
            ("list", [make_node("c", rv="20")], "20"),
        ]
    )
    metrics = Metrics()
    sleeps = []

    async def sleep(s):
        sleeps.append(s)

    inf = Informer(
        api, "nodes", "/api/v1/nodes", lambda items: None, lambda kind, obj: None, KubeSettings(), metrics, sleep=sleep
    )
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert api.calls == [("list",), ("watch", "10"), ("list",), ("watch", "20")] and len(sleeps) == 1
    restarts = {"resource": "nodes", "reason": "bad-event"}
    assert metrics.registry.get_sample_value("rlsched_extender_watch_restarts_total", restarts) == 1


GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}


async def test_410_after_410_backs_off_and_reports_the_watch_down() -> None:
    """A list slower than the server's history answers every watch 410: the informer relisted at
    once every time (~2,000 full lists a second against a fake server) while /status said it was up."""
    api = ScriptedWatchApi(
        [
            ("list", [], "10"),
            ("watch", [GONE]),
            ("list", [], "11"),
            ("watch", [GONE]),
            ("list", [], "12"),
            ("watch", [GONE]),
            ("list", [], "13"),
            ("watch", [ev("ADDED", "a", "14")]),
        ]
    )
    sleeps, states = [], []
    inf = None
    clock = SleepClock()

    async def sleep(s):
        await clock.sleep(s)
        sleeps.append(s)
        states.append((inf.up, inf.failures))

    inf = Informer(
        api,
        "nodes",
        "/x",
        lambda items: None,
        lambda k, o: None,
        KubeSettings(),
        sleep=sleep,
        jitter=lambda: 1.0,
        clock=clock,
    )
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    # The first 410 relists at once; a list in between does not reset the backoff, and the backoff's
    # wait counts towards the lists' pace (no second wait).
    assert sleeps == [1.0, 2.0]
    assert states == [(False, 1), (False, 2)]
    assert inf.up and inf.failures == 0 and inf.gone_in_a_row == 0


async def test_an_expired_continue_token_falls_back_to_one_full_list(server) -> None:
    """A paginated list slower than the server's history gets 410 on a later page; as client-go's
    pager does, one full list follows (relisting page by page met the same 410 again)."""
    fake, api = server
    fake.expire_continue = True
    items, rv = await api.list("/api/v1/nodes", limit=2)
    assert [i["metadata"]["name"] for i in items] == [f"n{i}" for i in range(5)] and rv == "78"
    assert [r[2] for r in fake.requests] == [{"limit": "2"}, {"limit": "2", "continue": "2"}, {}]


async def test_a_5xx_to_the_binding_write_keeps_the_cards_held() -> None:
    """A 504 from a proxy (or etcd timing out) after the write was carried out: the cards were freed and
    the next pod was bound to the same card."""
    from rlsched.extender.testing import Harness
    from rlsched.extender.wire import BindingArgs

    h = Harness([make_node("b", gpus=1)], [])
    p1 = h.add_pod(make_pod("p1", uid="p1", gpus=1))
    h.cache.set_pod(dict(p1))
    real = h.api.create_binding

    async def commits_then_504(*args, **kwargs):
        await real(*args, **kwargs)
        raise ApiError(504, "Timeout", "the server was unable to return a response in the time allotted")

    h.api.create_binding = commits_then_504
    result = await h.extender.bind(BindingArgs("p1", "default", "p1", "b"))
    assert "unable to return a response" in result["Error"]
    assert h.cache.pods["p1"].status == "uncertain" and h.cache.state.full_free[0] == 0


async def test_answers_are_read_within_caps_and_errors_cut(monkeypatch) -> None:
    """Every answer but the watch was read whole: a 400 MiB pod took 1.2 GiB; an error's JSON message
    went whole into logs and into bind's answer."""
    import rlsched.extender.kubeapi as kubeapi

    monkeypatch.setattr(kubeapi, "MAX_ANSWER_BYTES", 1 << 16)

    async def big(request):
        return web.json_response({"kind": "Pod", "pad": "x" * (1 << 17)})

    async def long_error(request):
        return status(500, "InternalError", "y" * int(request.query["n"]))

    async def not_json(request):
        return web.Response(text="<html>oops</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_get("/error", long_error)
    app.router.add_post("/html", not_json)
    async with TestServer(app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: None)
        try:
            with pytest.raises(ApiError) as info:
                await api.request("GET", "/big")
            assert info.value.status == 0 and "cap" in info.value.message
            with pytest.raises(ApiError) as info:
                await api.request("GET", "/error?n=10000")
            assert info.value.status == 500 and len(info.value.message) == kubeapi.MAX_ERROR_MESSAGE_CHARS
            with pytest.raises(ApiError) as info:  # past the error read's cap: only its head, as text
                await api.request("GET", "/error?n=1000000")
            assert info.value.status == 500 and len(info.value.message) <= kubeapi.MAX_ERROR_MESSAGE_CHARS
            with pytest.raises(ApiError) as info:  # a write that may have been carried out: outcome unknown
                await api.request("POST", "/html", {"a": 1})
            assert info.value.status == 0 and "not JSON" in info.value.message
        finally:
            await api.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl missing (makes the test certificates)")
async def test_kubeconfig_tls_server_name_is_the_name_checked(tmp_path) -> None:
    """A cluster reached by an address its certificate does not name (kubeconfig ``tls-server-name``):
    kubectl and client-go connect, the extender checked the URL's host and could not."""
    import ssl

    from rlsched.extender.settings import KubeSettings as Settings

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
    try:
        from stacklib.pki import tls_pki
    finally:
        sys.path.pop(0)
    pki = tls_pki(tmp_path / "pki")  # a server certificate for 127.0.0.1 and localhost only

    async def pod(request):
        return web.json_response({"kind": "Pod"})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default/pods/p", pod)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(str(pki["server_cert"]), str(pki["server_key"]))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0, ssl_context=server_tls)  # an address the certificate lacks
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        for name, works in ((None, False), ("localhost", True)):
            cluster = {"server": f"https://127.0.0.2:{port}", "certificate-authority": str(pki["ca"])}
            if name:
                cluster["tls-server-name"] = name
            kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster, {"token": "t"})
            api = KubeApi.from_settings(Settings(kubeconfig=str(kubeconfig)))
            try:
                if works:
                    assert await api.get_pod("default", "p", 5) == {"kind": "Pod"}
                else:
                    with pytest.raises(ApiError, match="certificate"):
                        await api.get_pod("default", "p", 5)
            finally:
                await api.close()
    finally:
        await runner.cleanup()


async def test_an_exec_plugin_refreshes_the_token_off_the_event_loop(tmp_path) -> None:
    """The kubernetes loaders run their token refresh (here an exec plugin of 0.3 s issuing 4-minute
    tokens) inside every token read: twice per request, on the event loop, stalling it 0.6 s a call."""
    import datetime as dt
    import json

    from rlsched.extender.settings import KubeSettings as Settings

    runs = tmp_path / "runs"
    plugin = tmp_path / "plugin.sh"
    expiry = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    credential = json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {"token": "tok", "expirationTimestamp": expiry},
        }
    )
    plugin.write_text(f"#!/bin/sh\necho x >> {runs}\nsleep 0.3\necho '{credential}'\n")
    plugin.chmod(0o755)

    async def pod(request):
        assert request.headers["Authorization"] == "Bearer tok"
        return web.json_response({"kind": "Pod"})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default/pods/p", pod)
    async with TestServer(app) as ts:
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": str(plugin),
                "interactiveMode": "Never",
            }
        }
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", {"server": str(ts.make_url("")).rstrip("/")}, user)
        api = KubeApi.from_settings(Settings(kubeconfig=str(kubeconfig)))
        at_load = len(runs.read_text().split())
        try:
            async with loop_stalls() as gaps:
                for _ in range(5):
                    assert await api.get_pod("default", "p", 5) == {"kind": "Pod"}
                await asyncio.sleep(0.5)  # the refresh started by the first call ends in its thread ...
                for _ in range(3):  # ... and put its hook back on the configuration: never called here
                    assert await api.get_pod("default", "p", 5) == {"kind": "Pod"}
        finally:
            await api.close()
    assert len(runs.read_text().split()) - at_load <= 1
    assert max(gaps) < 0.2


async def test_a_410_after_a_quiet_watch_that_ended_relists_at_once() -> None:
    """A watch that ran to its end (no events: a server that sends no bookmarks) works: the next 410 is
    the first in a row, not the second."""
    api = ScriptedWatchApi(
        [
            ("list", [], "10"),
            ("watch", [GONE]),
            ("list", [], "11"),
            ("watch", []),
            ("watch", [GONE]),
            ("list", [], "12"),
            ("watch", [ev("ADDED", "a", "13")]),
        ]
    )
    clock = SleepClock(step=2.0)  # every reading 2 s later: the quiet watch ran, it did not end at once

    inf = Informer(
        api,
        "nodes",
        "/x",
        lambda items: None,
        lambda k, o: None,
        KubeSettings(),
        sleep=clock.sleep,
        jitter=lambda: 1.0,
        clock=clock,
    )
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert clock.sleeps == []  # no backoff for the 410 after it, and the two lists were far enough apart
    assert inf.last_error is None and inf.resolved is None


async def test_informer_lets_other_tasks_run_between_the_slices_of_a_list() -> None:
    """A list applied in slices (``replace`` returns its steps) leaves the event loop to requests
    between the slices; a plain function is applied in one step."""
    order = []

    def replace(items):
        for item in items:
            order.append(item["metadata"]["name"])
            yield

    async def request() -> None:
        order.append("request")

    api = ScriptedWatchApi([("list", [make_node(n, rv="1") for n in "abc"], "10")])
    inf = Informer(api, "nodes", "/api/v1/nodes", replace, lambda kind, obj: None, KubeSettings())
    task = asyncio.ensure_future(request())
    await inf.sync()
    await task
    assert order == ["a", "request", "b", "c"] and inf.resource_version == "10"
