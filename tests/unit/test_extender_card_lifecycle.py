"""Card accounting through filter → bind → watch when things go wrong in between: retried binds,
lost answers, relists, a node that loses cards, pods other schedulers bound, edited annotations.

Each test is a sequence that once left a card counted twice or never again (docs/extender.md,
"Bind"). ``usage`` is the milli the cache counts per card; ``real`` what the pods' annotations say
is used — the two must agree."""

from __future__ import annotations

import asyncio
import copy
from collections import defaultdict
from typing import Any

import pytest

from rlsched.extender.kubeapi import ApiError
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import BindingArgs, ExtenderArgs


def card_annotations(cards: str, node: str, milli: int = 1000) -> dict[str, str]:
    return {"rlsched.io/gpu-cards": cards, "rlsched.io/gpu-card-milli": str(milli), "rlsched.io/gpu-node": node}


async def filter_(h: Harness, pod: dict, nodes: list[str]) -> list[str]:
    answer = await h.extender.filter(ExtenderArgs(pod, list(nodes), None))
    return list(answer["NodeNames"] or [])


async def bind(h: Harness, pod: dict, node: str) -> str:
    m = pod["metadata"]
    answer = await h.extender.bind(BindingArgs(m["name"], m["namespace"], m["uid"], node))
    return str(answer["Error"])


def pending(h: Harness, name: str, **kw: Any) -> dict:
    pod = h.add_pod(make_pod(name, uid=name, **kw))
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


def usage(h: Harness) -> dict[str, list[int]]:
    state = h.cache.state
    assert state is not None
    return {
        n: [1000 - int(x) for x in state.card_free[state.index[n], : state.gpu_count[state.index[n]]]]
        for n in state.names
    }


def real(h: Harness) -> dict[tuple[str, int], int]:
    used: dict[tuple[str, int], int] = defaultdict(int)
    for pod in h.api.pods.values():
        ann = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("nodeName") and "rlsched.io/gpu-cards" in ann:
            for c in ann["rlsched.io/gpu-cards"].split(","):
                used[(pod["spec"]["nodeName"], int(c))] += int(ann["rlsched.io/gpu-card-milli"])
    return dict(used)


def watch(h: Harness, name: str) -> None:
    """The watch delivers the pod as the API server has it now."""
    h.cache.set_pod(copy.deepcopy(h.api.pods[("default", name)]))


async def test_a_bind_retried_to_another_node_keeps_the_first_nodes_card() -> None:
    """kube-scheduler retried a bind that had succeeded, to another node: the retry used to release
    the first node's card, which the next pod then got, while p ran on it."""
    h = Harness([make_node("x", gpus=1), make_node("y", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    first = (await filter_(h, p, ["x", "y"]))[0]
    assert await bind(h, p, first) == ""
    other = "y" if first == "x" else "x"
    error = await bind(h, p, other)
    assert f"was bound to node {first} by an earlier bind" in error
    assert usage(h)[first] == [1000] and usage(h)[other] == [0]
    q = pending(h, "q", gpus=1)
    assert await filter_(h, q, ["x", "y"]) == [other] and await bind(h, q, other) == ""
    watch(h, "p")
    watch(h, "q")
    assert usage(h) == {"x": [1000], "y": [1000]} and all(e.placement is not None for e in h.cache.pods.values())
    assert real(h) == {("x", 0): 1000, ("y", 0): 1000}


async def test_a_retry_after_a_lost_answer_leaves_nothing_behind_when_the_pod_goes_unseen() -> None:
    """The first binding was applied but its answer lost; the retry's 409 said it was bound there.
    The pod was then deleted while the watch was down: after the relist its card is free again."""
    h = Harness([make_node("n", gpus=1)], [])
    t = [1000.0]
    h.cache.clock = lambda: t[0]
    p = pending(h, "p", gpus=1)
    assert await filter_(h, p, ["n"]) == ["n"]
    applied = h.api.create_binding

    async def applied_then_lost(*a: Any, **kw: Any) -> None:
        await applied(*a, **kw)
        raise ApiError(0, "Timeout", "no answer within 2 s")

    h.api.create_binding = applied_then_lost  # type: ignore[method-assign]
    assert "cards stay reserved" in await bind(h, p, "n")
    h.api.create_binding = applied  # type: ignore[method-assign]
    assert await bind(h, p, "n") == ""  # 409 "already assigned" to n: ours
    assert h.cache.pods["p"].bind_done
    del h.api.pods[("default", "p")]
    t[0] += 3600
    items, _ = await h.api.list("/api/v1/pods")
    h.cache.replace_pods(items)
    h.cache.expire_uncertain(30.0)
    assert "p" not in h.cache.pods and usage(h) == {"n": [0]}


async def bound_on_one_card() -> tuple[Harness, list[float]]:
    """Pod p bound by our bind to the one card of node n; the watch has not shown it yet. ``t[0]`` is
    the cache's clock."""
    h = Harness([make_node("n", gpus=1)], [])
    t = [1000.0]
    h.cache.clock = lambda: t[0]
    p = pending(h, "p", gpus=1)
    await filter_(h, p, ["n"])
    assert await bind(h, p, "n") == ""
    return h, t


async def test_a_relist_right_after_a_bind_hands_the_pod_to_the_uncertain_ttl() -> None:
    h, t = await bound_on_one_card()
    del h.api.pods[("default", "p")]  # deleted before the relist: no event will say so
    items, _ = await h.api.list("/api/v1/pods")
    h.cache.replace_pods(items)
    assert h.cache.pods["p"].status == "uncertain" and usage(h) == {"n": [1000]}  # held for now
    t[0] += 31
    h.cache.expire_uncertain(30.0)
    assert "p" not in h.cache.pods and usage(h) == {"n": [0]}


async def test_a_relist_right_after_a_bind_keeps_a_pod_the_watch_then_shows() -> None:
    h, t = await bound_on_one_card()
    stale = copy.deepcopy(h.api.pods[("default", "p")])
    h.cache.replace_pods([])  # a list served before the binding landed
    h.cache.set_pod(stale)  # the watch, from there on, shows it bound
    t[0] += 3600
    h.cache.expire_uncertain(30.0)
    assert h.cache.pods["p"].status == "bound" and usage(h) == {"n": [1000]}


async def test_a_node_that_loses_a_card_keeps_the_running_pod_and_drops_the_hold() -> None:
    b = make_pod("b", uid="b", gpus=1, node="n", annotations=card_annotations("0", "n"))
    h = Harness([make_node("n", gpus=2)], [b])
    p = pending(h, "p", gpus=1)
    assert await filter_(h, p, ["n"]) == ["n"] and h.cache.pods["p"].cards == (1,)
    h.cache.set_node(make_node("n", gpus=1, rv="2"))  # a card fell off the bus
    h.cache.state  # noqa: B018 - the next read rebuilds the state
    assert h.cache.pods["b"].placement is not None and h.cache.pods["b"].cards == (0,)
    assert "p" not in h.cache.pods and usage(h) == {"n": [1000]}
    assert "no longer fits node n" in await bind(h, p, "n")
    assert not [c for c in h.api.calls if c[0] == "bind"]


async def test_a_node_that_loses_its_only_card_refuses_the_held_bind() -> None:
    h = Harness([make_node("n", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert await filter_(h, p, ["n"]) == ["n"]
    h.cache.set_node(make_node("n", gpus=0, rv="2"))
    assert "no longer fits node n" in await bind(h, p, "n")
    assert not [c for c in h.api.calls if c[0] == "bind"]


async def test_a_pod_another_scheduler_bound_goes_before_a_hold_and_is_counted() -> None:
    """q, bound by another scheduler onto card 0, used to be left uncounted because p's hold was on
    it; when p went away the card looked free for r while q ran on it."""
    h = Harness([make_node("n", gpus=1)], [])
    p = pending(h, "p", gpu_milli=600)
    assert await filter_(h, p, ["n"]) == ["n"]
    q = make_pod(
        "q",
        uid="q",
        gpu_milli=600,
        node="n",
        scheduler="default-scheduler",
        annotations=card_annotations("0", "n", 600),
    )
    h.api.pods[("default", "q")] = copy.deepcopy(q)
    h.cache.set_pod(copy.deepcopy(q))
    assert h.cache.pods["q"].placement is not None and "p" not in h.cache.pods  # the hold gave way
    assert usage(h) == {"n": [600]}
    r = pending(h, "r", gpu_milli=700)
    assert await filter_(h, r, ["n"]) == []


def test_a_pod_that_did_not_fit_is_counted_once_its_node_has_room() -> None:
    a = make_pod("a", uid="a", gpus=1, node="n", annotations=card_annotations("0", "n"))
    b = make_pod("b", uid="b", gpus=1, node="n", annotations=card_annotations("0", "n"))
    h = Harness([make_node("n", gpus=1)], [a, b])  # both claim card 0: the second cannot be counted
    unplaced = [e.key for e in h.cache.pods.values() if e.placement is None]
    assert len(unplaced) == 1 and usage(h) == {"n": [1000]}
    placed = next(e.uid for e in h.cache.pods.values() if e.placement is not None)
    h.cache.delete_pod(placed)
    assert all(e.placement is not None for e in h.cache.pods.values()) and usage(h) == {"n": [1000]}


def test_an_edited_card_annotation_does_not_move_a_running_pod() -> None:
    a = make_pod("a", uid="a", gpus=1, node="n", annotations=card_annotations("0", "n"))
    h = Harness([make_node("n", gpus=2)], [a])
    edited = copy.deepcopy(a)
    edited["metadata"]["annotations"].update(card_annotations("1", "n"))
    edited["metadata"]["resourceVersion"] = "3000"
    h.cache.set_pod(edited)
    assert h.cache.pods["a"].cards == (0,) and usage(h) == {"n": [1000, 0]}


async def test_a_bound_pod_with_an_unreadable_gpu_request_holds_what_it_can() -> None:
    """Another scheduler's pod: one card, and a share annotation that is not a number. It runs all
    the same: its cpu, memory and a whole card are counted, so the card is not offered again."""
    h = Harness([make_node("n", gpus=1)], [])
    x = make_pod(
        "x", uid="x", gpus=1, node="n", scheduler="default-scheduler", annotations={"rlsched.io/gpu-milli": "half"}
    )
    h.cache.set_pod(copy.deepcopy(x))
    assert usage(h) == {"n": [1000]} and h.cache.pods["x"].spec.num_gpu == 1
    p = pending(h, "p", gpus=1)
    assert await filter_(h, p, ["n"]) == []


async def test_a_bind_whose_node_list_changed_meanwhile_answers_cleanly() -> None:
    """A node removed while the binding was written rebuilt the state: reading the decision's node
    by its old index raised (a 500 for a bind that had succeeded)."""
    h = Harness([make_node("a", gpus=0), make_node("b", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert await filter_(h, p, ["a", "b"]) == ["b"]
    h.api.delay_s = 0.05
    task = asyncio.create_task(bind(h, p, "b"))
    await asyncio.sleep(0.01)
    h.cache.delete_node("a")
    assert await task == ""
    assert h.api.pods[("default", "p")]["spec"]["nodeName"] == "b"


async def test_a_failed_bind_leaves_alone_a_pod_the_watch_saw_bound_elsewhere() -> None:
    h = Harness([make_node("x", gpus=1), make_node("y", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    await filter_(h, p, ["x", "y"])
    h.api.delay_s = 0.05
    h.api.fail["bind"] = ApiError(0, "Timeout", "no answer")
    task = asyncio.create_task(bind(h, p, "x"))
    await asyncio.sleep(0.01)
    bound = copy.deepcopy(h.api.pods[("default", "p")])
    bound["spec"]["nodeName"] = "y"
    bound["metadata"]["resourceVersion"] = "9999"
    bound["metadata"]["annotations"].update(card_annotations("0", "y"))
    h.cache.set_pod(bound)
    assert "already bound to node y" in await task
    assert h.cache.pods["p"].status == "bound" and usage(h) == {"x": [0], "y": [1000]}
    h.cache.clock = lambda: 10.0**9
    h.cache.expire_uncertain(30.0)
    assert h.cache.pods["p"].status == "bound" and usage(h) == {"x": [0], "y": [1000]}


async def test_a_cpu_only_pod_bound_by_another_scheduler_goes_before_a_hold() -> None:
    """c (no GPU) is running where p's filter held cpu and cards: c is counted, the hold gives way."""
    a = make_pod("a", uid="a", gpus=2, cpu="1", node="g0", annotations=card_annotations("0,1", "g0"))
    h = Harness([make_node("g0", gpus=4, cpu="32")], [a])
    p = pending(h, "p", gpus=2, cpu="4")
    assert await filter_(h, p, ["g0"]) == ["g0"] and h.cache.pods["p"].status == "reserved"
    c = make_pod("c", uid="c", cpu="28", node="g0", scheduler="default-scheduler")
    h.cache.set_pod(copy.deepcopy(c))
    assert h.cache.pods["c"].placement is not None and "p" not in h.cache.pods
    state = h.cache.state
    assert state is not None and int(state.cpu_free[state.index["g0"]]) == 32_000 - 1_000 - 28_000


async def test_a_running_pod_takes_its_own_card_when_several_holds_give_way() -> None:
    """Two holds on a 2-card node; q, bound elsewhere's way onto card 1, arrives. Releasing the holds
    must not let q land on card 0 by the default rule (it runs on card 1), nor anything else first."""
    h = Harness([make_node("n", gpus=2)], [])
    p1, p2 = pending(h, "p1", gpus=1), pending(h, "p2", gpus=1)
    assert await filter_(h, p1, ["n"]) == ["n"] and await filter_(h, p2, ["n"]) == ["n"]
    assert {h.cache.pods["p1"].cards, h.cache.pods["p2"].cards} == {(0,), (1,)}
    q = make_pod("q", uid="q", gpus=1, node="n", scheduler="default-scheduler", annotations=card_annotations("1", "n"))
    h.cache.set_pod(copy.deepcopy(q))
    assert h.cache.pods["q"].cards == (1,) and usage(h) == {"n": [0, 1000]}
    r = pending(h, "r", gpus=1)
    assert await filter_(h, r, ["n"]) == ["n"] and h.cache.pods["r"].cards == (0,)


@pytest.mark.parametrize("answer", ["ok", "504"])
async def test_a_node_change_during_the_binding_write_leaves_the_pod_counted(answer: str) -> None:
    """The node's allocatable shrank by 100m while p's Binding was on its way: the rebuild could not
    fit p (not written yet: not running), and when the write succeeded (or ended in a 5xx: maybe
    written) nothing counted it again, so q got the same card."""
    h = Harness([make_node("g", cpu="8", gpus=1)], [])
    h.api.delay_s = 0.05
    p = pending(h, "p", cpu="8", gpus=1)
    assert await filter_(h, p, ["g"]) == ["g"]
    if answer == "504":
        h.api.fail["bind"] = ApiError(504, "Timeout", "gateway timeout")
    task = asyncio.create_task(bind(h, p, "g"))
    await asyncio.sleep(0.01)
    h.cache.set_node(make_node("g", cpu="7900m", gpus=1, rv="2"))
    assert h.cache.state is not None  # rebuilt during the write
    await task
    h.api.fail.pop("bind", None)
    assert h.cache.pods["p"].placement is not None and usage(h) == {"g": [1000]}
    q = pending(h, "q", cpu="1", gpus=1)
    assert await filter_(h, q, ["g"]) == []


async def test_a_released_binding_leaves_the_pod_pending_for_its_next_filter() -> None:
    """A binding outcome that stayed unknown past its TTL released the cards with forget(), which also
    dropped the pod from the pending pods: its next filters could not hold cards for it."""
    h = Harness([make_node("g", gpus=1)], [])
    clock = {"now": 100.0}
    h.cache.clock = lambda: clock["now"]
    p = pending(h, "p", gpus=1)
    assert await filter_(h, p, ["g"]) == ["g"]
    h.api.fail["bind"] = ApiError(0, "Timeout", "no answer")
    assert "cards stay reserved" in await bind(h, p, "g")
    h.api.fail.pop("bind")
    clock["now"] += 31
    assert h.cache.expire_uncertain(30) == ["p"] and "p" in h.cache.pending
    h.extender.memory.pop("p")
    assert await filter_(h, p, ["g"]) == ["g"] and h.cache.pods["p"].status == "reserved"
    clock["now"] += 10  # past a provisional hold's life: this one is not provisional
    assert h.cache.expire_provisional() == [] and "p" in h.cache.pods


async def test_a_running_pod_of_another_gpu_model_leaves_the_holds_alone() -> None:
    """x runs on a V100 node although it asks for A100 (another scheduler ignores the annotation): the
    model check failed its first placement, and every hold on the node was released for nothing."""
    h = Harness([make_node("g", cpu="16", gpus=4, model="V100M16")], [])
    q = pending(h, "q", cpu="1", gpus=1)
    assert await filter_(h, q, ["g"]) == ["g"]
    x = make_pod("x", uid="x", cpu="1", gpus=1, node="g", gpu_models="A100", scheduler="default-scheduler")
    h.cache.set_pod(copy.deepcopy(x))
    assert h.cache.pods["x"].placement is not None and h.cache.pods["q"].status == "reserved"
    assert sorted(usage(h)["g"]) == [0, 0, 1000, 1000]
