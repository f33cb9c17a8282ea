"""Filter counts the pods that kube-scheduler's preemption nominated to a node (``status.
nominatedNodeName``) ahead of a pod of no higher priority, as kube-scheduler's own filters do
(RunFilterPluginsWithNominatedPods): a card share is an ignored resource to kube-scheduler, so
without this a lower-priority share pod took the share that preemption had freed for the preemptor.
Also the index of nominated pods those lookups use (``PendingPods``). The first test, the one of equal
priority and the one of victims still leaving fail without the count; the others guard what it must
not hold back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rlsched.extender.pending import PendingPods
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.verbs import HELD_FOR_NOMINATED
from rlsched.extender.wire import ExtenderArgs


def share(
    name: str, milli: int, priority: int = 0, node: str = "", nominate: str = "", rv: str = "2000"
) -> dict[str, Any]:
    pod = make_pod(name, cpu="1", memory="1Gi", gpu_milli=milli, uid=name, node=node, rv=rv)
    pod["spec"]["priority"] = priority
    if nominate:
        pod["status"]["nominatedNodeName"] = nominate
    return pod


def cluster(*nodes: str) -> Harness:
    """One card per node, 600 milli of it taken by a running pod: 400 milli free on each."""
    running = [share(f"run-{n}", 600, node=n) for n in nodes]
    return Harness([make_node(n, gpus=1) for n in nodes], running)


def watch(h: Harness, pod: dict[str, Any]) -> dict[str, Any]:
    h.add_pod(copy.deepcopy(pod))
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


async def filter_on(h: Harness, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    return await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), nodes, None))


async def test_a_lower_priority_share_pod_does_not_take_the_share_kept_for_a_nominated_pod() -> None:
    """N (400 milli, priority 1000) is nominated to g0, whose 400 milli free preemption made for it. P
    (300 milli, priority 0) fits g0 by itself: filter kept g0 and P took the share, leaving N short
    again. Now g0 fails with the reason, and a node without a nomination is still kept."""
    h = cluster("g0")
    watch(h, share("n", 400, priority=1000, nominate="g0"))
    pod = watch(h, share("p", 300))
    ans = await filter_on(h, pod, ["g0"])
    assert ans["NodeNames"] == []
    assert ans["FailedNodes"]["g0"].endswith(HELD_FOR_NOMINATED)  # resolvable: kube-scheduler may preempt
    assert ans["FailedAndUnresolvableNodes"] == {}
    assert h.cache.state.card_free[h.cache.state.index["g0"], 0] == 400  # the trial left the state as it was

    h2 = cluster("g0", "g1")
    watch(h2, share("n", 400, priority=1000, nominate="g0"))
    pod = watch(h2, share("p", 300))
    assert (await filter_on(h2, pod, ["g0", "g1"]))["NodeNames"] == ["g1"]


async def test_the_nominated_pod_itself_and_pods_of_higher_priority_are_not_held_back() -> None:
    h = cluster("g0")
    n = watch(h, share("n", 400, priority=1000, nominate="g0"))
    assert (await filter_on(h, n, ["g0"]))["NodeNames"] == ["g0"]  # its own nomination is no obstacle

    h = cluster("g0")
    watch(h, share("n", 400, priority=1000, nominate="g0"))
    urgent = watch(h, share("u", 300, priority=2000))
    assert (await filter_on(h, urgent, ["g0"]))["NodeNames"] == ["g0"]  # kube-scheduler schedules it first too


async def test_a_pod_of_equal_priority_is_held_back() -> None:
    """kube-scheduler counts nominated pods of at least the pod's priority."""
    h = cluster("g0")
    watch(h, share("n", 400, priority=500, nominate="g0"))
    assert (await filter_on(h, watch(h, share("p", 300, priority=500)), ["g0"]))["NodeNames"] == []


async def test_a_nominated_pod_whose_victims_are_still_leaving_holds_the_room_it_could_use() -> None:
    """kube-scheduler adds a nominated pod to its node whether it fits or not. Victims hold their cards
    until they are gone: P (two whole cards) is nominated to g0, where victim A still holds card 0
    and card 1 is free. S (500 milli, lower priority) took card 1, and once A left P did not fit, and
    kube-scheduler, counting whole cards only, found it room and nothing to evict: P stuck."""
    h = Harness([make_node("g0", gpus=2)], [make_pod("a", cpu="1", memory="1Gi", gpus=1, uid="a", node="g0")])
    nominated = watch(h, make_pod("p", cpu="1", memory="1Gi", gpus=2, uid="p"))
    nominated["spec"]["priority"] = 1000
    nominated["status"]["nominatedNodeName"] = "g0"
    watch(h, nominated)
    s = watch(h, share("s", 500))
    ans = await filter_on(h, s, ["g0"])
    assert ans["NodeNames"] == [] and ans["FailedNodes"]["g0"].endswith(HELD_FOR_NOMINATED)
    h.cache.delete_pod("a")
    assert (await filter_on(h, nominated, ["g0"]))["NodeNames"] == ["g0"]

    # A share pod that does not fit yet holds up to its share of every card: N (700 milli) is nominated
    # to g0, whose card has 400 free while N's victims leave; P (300 milli) does not take the 400.
    h = cluster("g0")
    watch(h, share("n", 700, priority=1000, nominate="g0"))
    assert (await filter_on(h, watch(h, share("p", 300)), ["g0"]))["NodeNames"] == []


async def test_the_room_is_free_again_once_the_nominated_pod_is_held_or_gone() -> None:
    """N's own filter holds its cards (the hold counts from then on, N is not counted twice); when N
    is deleted, or its nomination cleared, nothing is kept for it."""
    h = cluster("g0", "g1")
    n = watch(h, share("n", 400, priority=1000, nominate="g0"))
    assert (await filter_on(h, n, ["g0"]))["NodeNames"] == ["g0"]  # holds g0's 400 milli
    p = watch(h, share("p", 300))
    assert (await filter_on(h, p, ["g0", "g1"]))["NodeNames"] == ["g1"]

    h = cluster("g0")
    watch(h, share("n", 400, priority=1000, nominate="g0"))
    p = watch(h, share("p", 300))
    h.cache.set_pod(share("n", 400, priority=1000, rv="2001"))  # kube-scheduler cleared the nomination
    assert (await filter_on(h, p, ["g0"]))["NodeNames"] == ["g0"]

    h = cluster("g0")
    watch(h, share("n", 400, priority=1000, nominate="g0"))
    p = watch(h, share("p", 300))
    h.cache.delete_pod("n")
    assert (await filter_on(h, p, ["g0"]))["NodeNames"] == ["g0"]


async def test_a_nomination_to_a_node_not_offered_costs_no_trial() -> None:
    h = cluster("g0", "g1")
    watch(h, share("n", 400, priority=1000, nominate="g1"))
    info = h.cache.pending["n"]
    state = h.cache.state
    cand = __import__("numpy").array([state.index["g0"]])
    p = h.cache.pending[watch(h, share("p", 300))["metadata"]["uid"]]
    assert h.extender._with_nominated(state, p, cand) == (state, [])
    assert h.cache.nominated_ahead_of(p) == {"g1": [info]}


def test_pending_pods_keep_the_index_of_nominated_pods_in_step() -> None:
    h = cluster("g0")
    pending = h.cache.pending
    assert isinstance(pending, PendingPods)
    h.cache.set_pod(share("n", 400, nominate="g0"))
    h.cache.set_pod(share("m", 100, nominate="g0"))
    assert set(pending.nominated["g0"]) == {"n", "m"}
    h.cache.set_pod(share("n", 400, nominate="g1", rv="2001"))  # nominated elsewhere
    assert set(pending.nominated["g0"]) == {"m"} and set(pending.nominated["g1"]) == {"n"}
    h.cache.set_pod(share("n", 400, node="g1", rv="2002"))  # bound: no longer pending
    assert "g1" not in pending.nominated and "n" not in pending
    h.cache.delete_pod("m")
    assert pending.nominated == {}
    h.cache.set_pod(share("k", 100, nominate="g0"))
    h.cache.replace_pods([])  # a relist without it
    assert pending.nominated == {} and pending == {}


def test_pending_pods_refuse_writes_that_would_bypass_the_index() -> None:
    pending = PendingPods()
    for write in (pending.clear, lambda: pending.update({}), lambda: pending.setdefault("x"), pending.popitem):
        with pytest.raises(TypeError):
            write()
    assert pending.pop("absent", None) is None
    with pytest.raises(KeyError):
        pending.pop("absent")
    with pytest.raises(KeyError):
        del pending["absent"]


async def test_prioritize_without_filters_memory_counts_them_too() -> None:
    """When prioritize decides afresh (filter's decision expired, or another replica filtered), the
    node kept for the nominated pod is not the one it scores highest."""
    h = cluster("g0", "g1")
    watch(h, share("n", 400, priority=1000, nominate="g0"))
    pod = watch(h, share("p", 300))
    scores = await h.extender.prioritize(ExtenderArgs(copy.deepcopy(pod), ["g0", "g1"], None))
    assert {s["Host"]: s["Score"] for s in scores} == {"g0": 0, "g1": 10}
