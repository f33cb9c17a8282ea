"""The read-only listener: /metrics, /healthz, /readyz, /status, /decisions; and the decision ring."""

from __future__ import annotations

import orjson
from aiohttp.test_utils import TestClient, TestServer

from rlsched.extender.app import HEALTH
from rlsched.extender.decision_ring import DecisionRing
from rlsched.extender.testing import Harness, make_node, make_pod

NODES = [make_node(f"g{i}", gpus=2) for i in range(3)]


def test_ring_cursor_and_drops() -> None:
    ring = DecisionRing(3, clock=lambda: 5.0)
    assert ring.read(0) == {"epoch": ring.epoch, "next": 0, "last": 0, "dropped": 0, "reset": False, "records": []}
    for i in range(5):
        ring.append({"i": i})
    out = ring.read(0)
    assert [r["seq"] for r in out["records"]] == [3, 4, 5] and out["dropped"] == 2 and out["next"] == 5
    out = ring.read(3, limit=1)
    assert [r["seq"] for r in out["records"]] == [4] and out["dropped"] == 0 and out["next"] == 4
    assert ring.read(5)["records"] == [] and ring.read(5)["next"] == 5
    stale = ring.read(99)  # a cursor from an earlier process
    assert stale["reset"] and [r["seq"] for r in stale["records"]] == [3, 4, 5]


async def test_status_endpoints() -> None:
    h = Harness(NODES)
    pod = make_pod("p", gpus=1)
    async with TestClient(TestServer(h.app())) as verbs, TestClient(TestServer(h.status_app())) as status:
        await verbs.post("/filter", data=orjson.dumps({"Pod": pod, "NodeNames": ["g0", "g1", "g2"]}))
        await verbs.post("/filter", data=b"nope")
        r = await status.get("/healthz")
        assert r.status == 200 and (await r.json())["ok"]
        r = await status.get("/readyz")
        assert r.status == 200 and (await r.json())["ready"]
        st = await (await status.get("/status")).json()
        assert st["policy"]["mode"] == "active" and st["policy"]["fallback"] == "fgd"
        assert st["policy"]["model"]["loaded"] is False and st["policy"]["fallbacks"]["no-model"] == 1
        assert st["cache"]["nodes"] == 3 and st["cache"]["ready"] and st["decisions"]["outcomes"] == {"fallback": 1}
        assert st["policy"]["typicalPods"] == {"source": "built-in", "count": 35}
        d = await (await status.get("/decisions?after=0")).json()
        rec = d["records"][0]
        assert d["next"] == 1 and rec["pod"]["name"] == "p" and rec["node"] in ("g0", "g1", "g2")
        assert {"cards", "topScores", "servedBy", "modelVersion", "features", "fallbackReason"} <= set(rec)
        assert (await status.get("/decisions?after=x")).status == 400
        text = await (await status.get("/metrics")).text()
    assert 'rlsched_extender_request_seconds_count{code="200",verb="filter"} 1.0' in text
    assert 'rlsched_extender_request_seconds_count{code="400",verb="filter"} 1.0' in text
    assert 'rlsched_extender_decisions_total{outcome="fallback"} 1.0' in text
    assert 'rlsched_extender_bad_requests_total{verb="filter"} 1.0' in text
    assert 'rlsched_extender_model_info{digest="none",mode="active",version="none"} 1.0' in text


async def test_readyz_is_503_until_listed() -> None:
    h = Harness(NODES)
    h.cache.synced["pods"] = False
    async with TestClient(TestServer(h.status_app())) as status:
        r = await status.get("/readyz")
        assert r.status == 503 and (await r.json())["problems"] == {"cache": "not listed"}


def test_lazy_records_take_their_cursor_and_time_at_once_and_are_built_once() -> None:
    t = [5.0]
    ring = DecisionRing(3, clock=lambda: t[0])
    built = []
    ring.append({"i": 0})
    assert ring.append_lazy(lambda: built.append(1) or {"i": 1}) == 2
    t[0] = 9.0
    out = ring.read(0)["records"]
    assert out == [{"i": 0, "seq": 1, "time": 5.0}, {"i": 1, "seq": 2, "time": 5.0}] and built == [1]
    assert ring.read(1)["records"][0] is out[1] and built == [1]


async def test_open_probes_name_failing_checks_and_keep_their_reasons_for_status() -> None:
    """With authentication on, /readyz and /healthz (open to anyone, for the kubelet) say which check
    fails; the reason — an API server's error text, with its URL and our ServiceAccount — is on
    /status, which needs a token."""
    from test_extender_auth import FakeReviewApi, bearer, status_client

    client, _ = status_client(FakeReviewApi())
    secret = "pods is forbidden: User system:serviceaccount:ns:rl at https://10.0.0.1:6443"
    health = client.server.app[HEALTH]
    health.checks["watches"] = lambda: f"watch down: pods for 75 s ({secret})"
    health.liveness["tasks"] = lambda: f"background task(s) stopped: watch-pods ({secret})"
    async with client:
        r = await client.get("/readyz")
        body = await r.json()
        assert r.status == 503 and set(body["problems"]) == {"watches"} and secret not in str(body)
        r = await client.get("/healthz")
        body = await r.json()
        assert r.status == 503 and set(body["problems"]) == {"tasks"} and secret not in str(body)
        assert (await client.get("/status")).status == 401
        st = await (await client.get("/status", headers=bearer("op-token"))).json()
    assert secret in st["health"]["ready"]["watches"] and secret in st["health"]["live"]["tasks"]
