"""Many binds race for the last free card(s): no card is ever handed out twice."""

from __future__ import annotations

import asyncio
import copy
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


def watched(h: Harness, pod: dict) -> dict:
    """A pending pod in the API and, as the watch delivers it, in the extender's cache: filter holds
    cards only for pods the watch knows."""
    h.add_pod(pod)
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


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
    racers = [watched(h, make_pod(f"r{i}", uid=f"r{i}", **kwargs)) for i in range(n_pods)]
    async with TestClient(TestServer(h.app())) as c:
        # kube-scheduler filters the next pods while earlier binds are in flight: filter holds the
        # cards it chose until the bind comes, so only the pods that fit get node b; then every pod's
        # bind arrives at once anyway (as from a scheduler that ignored filter, or several of them).
        kept = []
        for p in racers:
            r = await c.post("/filter", data=orjson.dumps({"Pod": p, "NodeNames": ["a", "b"]}))
            kept.append((await r.json())["NodeNames"])
        assert kept == [["b"]] * winners + [[]] * (n_pods - winners)

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


async def filter_call(c, pod, names=("a", "b")) -> list:
    r = await c.post("/filter", data=orjson.dumps({"Pod": pod, "NodeNames": list(names)}))
    return (await r.json())["NodeNames"]


async def bind_call(c, pod, node) -> str:
    body = {
        "PodName": pod["metadata"]["name"],
        "PodNamespace": "default",
        "PodUID": pod["metadata"]["uid"],
        "Node": node,
    }
    return (await (await c.post("/bind", data=orjson.dumps(body))).json())["Error"]


async def test_filter_holds_its_choice_until_the_bind_comes() -> None:
    """kube-scheduler filters the next pod before the last one's bind arrives: the filter's choice
    holds the card, so the next pod is not sent to it, and the bind keeps exactly that hold."""
    from rlsched.extender.cache import ASSUMED, RESERVED

    nodes, pods = cluster(free_cards_on_last=1)
    h = Harness(nodes, pods)
    first, second = (watched(h, make_pod(n, uid=n, gpus=1)) for n in ("first", "second"))
    b = h.cache.state.index["b"]
    async with TestClient(TestServer(h.app())) as c:
        assert await filter_call(c, first) == ["b"]
        assert h.cache.pods["first"].status == RESERVED and h.cache.state.full_free[b] == 0
        assert await filter_call(c, first) == ["b"]  # decided again: its own hold does not stand in the way
        assert await filter_call(c, second) == []  # the card is held for "first"
        assert await bind_call(c, first, "b") == ""
    assert h.cache.pods["first"].status == ASSUMED and h.cache.state.full_free[b] == 0
    assert "first" in {e.uid for e in h.cache.pods.values()} and "second" not in h.cache.pods


async def test_an_unused_hold_expires_and_a_bind_elsewhere_moves_it() -> None:
    nodes = [make_node("a", gpus=4), make_node("b", gpus=4)]
    h = Harness(nodes, [make_pod("part-b", gpus=3, node="b", uid="part-b")])
    now = [1000.0]
    h.cache.clock = lambda: now[0]
    pod = watched(h, make_pod("p", uid="p", gpus=1))
    state = h.cache.state
    a, b = state.index["a"], state.index["b"]
    async with TestClient(TestServer(h.app())) as c:
        chosen = (await filter_call(c, pod))[0]
        held = a if chosen == "a" else b
        free = int(state.full_free[held])
        assert h.cache.expire_reserved(30.0) == []  # not yet
        now[0] += 31
        assert h.cache.expire_reserved(30.0) == ["p"] and state.full_free[held] == free + 1
        assert "p" not in h.cache.pods
        # decided again, then kube-scheduler binds the other node (another profile's choice, say)
        chosen = (await filter_call(c, pod))[0]
        other = "b" if chosen == "a" else "a"
        before = {n: int(state.full_free[state.index[n]]) for n in ("a", "b")}
        assert await bind_call(c, pod, other) == ""
    assert h.cache.pods["p"].node == other
    assert int(state.full_free[state.index[chosen]]) == before[chosen] + 1  # the hold was released
    assert int(state.full_free[state.index[other]]) == before[other] - 1


async def test_no_hold_when_kube_scheduler_chooses_among_several() -> None:
    from rlsched.extender.settings import ExtenderSettings, PolicySettings

    h = Harness([make_node("a", gpus=4), make_node("b", gpus=4)], [], ExtenderSettings(policy=PolicySettings(top_k=0)))
    pod = watched(h, make_pod("p", uid="p", gpus=1))
    async with TestClient(TestServer(h.app())) as c:
        assert sorted(await filter_call(c, pod)) == ["a", "b"]  # every feasible node, best first
    # topK 0 keeps every feasible node: kube-scheduler may bind any of them, so nothing is held
    assert "p" not in h.cache.pods
    assert h.cache.state.full_free.tolist() == [4, 4]
