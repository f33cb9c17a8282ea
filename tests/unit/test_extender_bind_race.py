"""Many binds race for the last free card(s): no card is ever handed out twice."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlsched.extender.testing import FakeKubeApi, Harness, make_node, make_pod


def cluster(free_cards_on_last: int):
    """Two GPU nodes: ``a`` full, ``b`` with ``free_cards_on_last`` free cards of 4."""
    nodes = [make_node("a", gpus=4), make_node("b", gpus=4)]
    pods = [make_pod("full-a", gpus=4, node="a", uid="full-a")]
    if free_cards_on_last < 4:
        pods.append(make_pod("part-b", gpus=4 - free_cards_on_last, node="b", uid="part-b"))
    return nodes, pods


def card_usage(api: FakeKubeApi) -> dict[tuple[str, int], int]:
    """Milli per (node, card) from what the binds wrote on the pods that were bound."""
    used: dict[tuple[str, int], int] = defaultdict(int)
    for pod in api.pods.values():
        ann = pod["metadata"].get("annotations", {})
        node = pod["spec"].get("nodeName")
        if node and "rlsched.io/gpu-cards" in ann:
            for card in ann["rlsched.io/gpu-cards"].split(","):
                used[(node, int(card))] += int(ann["rlsched.io/gpu-card-milli"])
    return used


@pytest.mark.parametrize("kind, n_pods, winners", [("whole", 40, 1), ("share", 40, 3), ("pair", 20, 0)])
async def test_binds_race_for_the_last_card(kind, n_pods, winners) -> None:
    nodes, pods = cluster(free_cards_on_last=1)
    h = Harness(nodes, pods)
    h.api.delay_s = 0.002  # every write awaits, so the binds interleave at every step
    kwargs = {"whole": {"gpus": 1}, "share": {"gpu_milli": 300}, "pair": {"gpus": 2}}[kind]
    racers = [h.add_pod(make_pod(f"r{i}", uid=f"r{i}", **kwargs)) for i in range(n_pods)]
    async with TestClient(TestServer(h.app())) as c:
        # Every pod passed filter while the card was still free (kube-scheduler filters the next pods
        # while earlier binds are in flight), then all binds arrive at once.
        for p in racers:
            r = await c.post("/filter", data=orjson.dumps({"Pod": p, "NodeNames": ["a", "b"]}))
            assert (await r.json())["NodeNames"] == (["b"] if kind != "pair" else [])

        async def bind(p):
            r = await c.post(
                "/bind",
                data=orjson.dumps(
                    {
                        "PodName": p["metadata"]["name"],
                        "PodNamespace": "default",
                        "PodUID": p["metadata"]["uid"],
                        "Node": "b",
                    }
                ),
            )
            assert r.status == 200
            return (await r.json())["Error"]

        errors = await asyncio.gather(*(bind(p) for p in racers))
    ok = [e for e in errors if not e]
    assert len(ok) == winners
    assert all("no longer fits node b" in e for e in errors if e)
    assert all(v <= 1000 for v in card_usage(h.api).values())
    state = h.cache.state
    assert (state.card_free >= 0).all()
    b = state.index["b"]
    assert state.card_free[b].sum() == {"whole": 0, "share": 100, "pair": 1000}[kind]


async def test_filter_sees_a_reservation_while_its_bind_is_in_flight() -> None:
    nodes, pods = cluster(free_cards_on_last=1)
    h = Harness(nodes, pods)
    h.api.delay_s = 0.05
    first = h.add_pod(make_pod("first", uid="first", gpus=1))
    second = make_pod("second", uid="second", gpus=1)
    async with TestClient(TestServer(h.app())) as c:
        h.cache.set_pod(first)  # the watch delivered it: bind reads it from the cache, no GET
        await c.post("/filter", data=orjson.dumps({"Pod": first, "NodeNames": ["a", "b"]}))
        bind = asyncio.create_task(
            c.post(
                "/bind",
                data=orjson.dumps({"PodName": "first", "PodNamespace": "default", "PodUID": "first", "Node": "b"}),
            )
        )
        await asyncio.sleep(0.01)  # the bind has reserved and is now waiting on the API
        r = await c.post("/filter", data=orjson.dumps({"Pod": second, "NodeNames": ["a", "b"]}))
        body = await r.json()
        assert body["NodeNames"] == [] and "needs 1 whole free GPU card" in body["FailedNodes"]["b"]
        assert (await (await bind).json()) == {"Error": ""}
    assert first["metadata"]["uid"] in h.cache.pods


async def test_duplicate_concurrent_binds_join_one_another() -> None:
    nodes, pods = cluster(free_cards_on_last=2)
    h = Harness(nodes, pods)
    h.api.delay_s = 0.01
    h.add_pod(make_pod("p", uid="p", gpus=1))
    results = await asyncio.gather(*(h.binder.bind("p", "default", "p", "b") for _ in range(5)))
    assert [r.error for r in results] == [""] * 5
    assert [c[0] for c in h.api.calls].count("bind") == 1
    assert h.cache.state.full_free[h.cache.state.index["b"]] == 1
