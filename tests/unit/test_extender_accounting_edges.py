"""Card accounting edges that the rest of the suite left unchecked: each test fails if one rule of the
cache, bind or the verbs is dropped (a relist's grace window, the retry after holds are released, the
order uncounted pods are counted in, a nominated pod counted once, a bind's outcome handling)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import numpy as np
from test_extender_cache import Clock
from test_extender_card_lifecycle import usage
from test_extender_filter_nominated import share, watch

from rlsched.extender.cache import UNCERTAIN, ClusterCache
from rlsched.extender.kubeapi import ApiError
from rlsched.extender.objects import assignment_annotations, pod_info
from rlsched.extender.policy import Outcome, Verdict
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.verbs import HELD_FOR_NOMINATED, extender_scores
from rlsched.extender.wire import BindingArgs, ExtenderArgs, preemption_args
from rlsched.policy.decision import Decision
from rlsched.policy.scorers import NodeScores

GPU = GpuConventions()


def cache_with(
    nodes: list[dict[str, Any]], pods: Iterable[dict[str, Any]] = (), clock: Clock | None = None
) -> ClusterCache:
    c = ClusterCache(GPU, clock=clock or Clock(), scheduler_name="rl-scheduler")
    c.replace_nodes(nodes)
    c.replace_pods(list(pods))
    return c


def bound(name: str, node: str, cards: tuple[int, ...], milli: int = 1000, **kw: Any) -> dict[str, Any]:
    ann = assignment_annotations(GPU, node, cards, milli)
    if milli < 1000:
        return make_pod(name, node=node, gpu_milli=milli, annotations=ann, uid=name, **kw)
    return make_pod(name, node=node, gpus=len(cards), annotations=ann, uid=name, **kw)


def foreign(name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    """A pod another scheduler started on ``node`` (no card annotations)."""
    return make_pod(name, node=node, gpus=gpus, cpu="1", uid=name, scheduler="default-scheduler")


def pending(h: Harness, name: str, **kw: Any) -> dict[str, Any]:
    pod = h.add_pod(make_pod(name, uid=name, **kw))
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


async def filter_(h: Harness, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    return await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), list(nodes), None))


async def bind(h: Harness, pod: dict[str, Any], node: str, name: str | None = None) -> str:
    m = pod["metadata"]
    answer = await h.extender.bind(BindingArgs(name or m["name"], m["namespace"], m["uid"], node))
    return str(answer["Error"])


def clocked(h: Harness) -> list[float]:
    t = [1000.0]
    h.cache.clock = lambda: t[0]
    return t


# -- the cache ----------------------------------------------------------------------------------------


async def test_a_relist_a_second_after_a_bind_keeps_the_pod_held_as_uncertain() -> None:
    """A list that lacks a pod our bind wrote a moment ago may predate the binding: its cards stay
    held (uncertain) rather than being freed at once, even when the clock has moved on a little."""
    h = Harness([make_node("n", gpus=1)], [])
    t = clocked(h)
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"] and await bind(h, p, "n") == ""
    t[0] += 1.0
    h.cache.replace_pods([])
    assert h.cache.pods["p"].status == UNCERTAIN and usage(h) == {"n": [1000]}


async def test_a_relist_long_after_a_bind_the_watch_never_showed_frees_the_cards() -> None:
    h = Harness([make_node("n", gpus=1)], [])
    t = clocked(h)
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"] and await bind(h, p, "n") == ""
    t[0] += 6.0
    h.cache.replace_pods([])
    assert "p" not in h.cache.pods and usage(h) == {"n": [0]}


async def test_a_bound_pod_the_watch_has_not_shown_is_not_released_by_the_uncertain_ttl() -> None:
    """expire_uncertain is for unknown outcomes only: a binding that was written stays counted."""
    h = Harness([make_node("n", gpus=1)], [])
    t = clocked(h)
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"] and await bind(h, p, "n") == ""
    t[0] += 3600
    assert h.cache.expire_uncertain(30.0) == []
    assert h.cache.pods["p"].status == "assumed" and usage(h) == {"n": [1000]}


def test_releasing_holds_for_a_running_pod_counts_the_uncounted_pods_of_the_node() -> None:
    """Y (two cards, started by another scheduler) waits uncounted while a hold takes the card it
    lacks. X, a running pod short of cpu because of that hold, releases it: Y is counted at once."""
    c = cache_with([make_node("g", gpus=3)], [bound("a", "g", (0,), cpu="1"), bound("z", "g", (1,), cpu="1")])
    c.set_pod(make_pod("p", gpus=1, cpu="60", uid="p"))
    assert c.reserve(c.pending["p"], "g", (2,))
    c.set_pod(foreign("y", "g", gpus=2))
    assert c.pods["y"].placement is None and "p" not in c.pods  # y released the hold, still too few cards
    assert c.reserve(c.pending["p"], "g", (2,))
    c.delete_pod("z")
    assert c.pods["y"].placement is None  # card 1 free, card 2 held
    c.set_pod(make_pod("x", node="g", cpu="40", uid="x"))  # 35 cpu free with the hold: it releases it
    assert "p" not in c.pods and c.pods["x"].placement is not None
    assert c.pods["y"].placement is not None and c.pods["y"].cards == (1, 2)


def test_pods_forgotten_uncounted_do_not_crowd_out_the_retry_of_a_release() -> None:
    c = cache_with([make_node("g", gpus=1)], [bound("a", "g", (0,))])
    gone = [foreign(f"w{i}", "g") for i in range(70)]
    for pod in gone:
        c.set_pod(pod)
    for pod in gone:
        c.delete_pod(pod["metadata"]["uid"])
    c.set_pod(foreign("y", "g"))
    assert c.pods["y"].placement is None
    c.delete_pod("a")  # its card is free: y is counted by this release, not at the next sweep
    assert c.pods["y"].placement is not None


def test_a_release_counts_the_pod_seen_running_before_an_uncertain_one() -> None:
    clock = Clock()
    c = cache_with([make_node("g", gpus=1)], [bound("s", "g", (0,), milli=500)], clock)
    spec = pod_info(make_pod("u", gpus=1, uid="u"), GPU, "pod").spec
    assert spec is not None
    c.add("u", "default/u", "g", spec, (), UNCERTAIN)  # older, its binding's outcome unknown
    clock.t += 1
    c.set_pod(foreign("w", "g"))
    assert [e.uid for e in c.uncounted("g")] == ["w", "u"]
    c.delete_pod("s")
    assert c.pods["w"].placement is not None and c.pods["u"].placement is None


def test_a_release_counts_the_oldest_uncounted_running_pod_first() -> None:
    clock = Clock()
    c = cache_with([make_node("g", gpus=1)], [bound("s", "g", (0,), milli=500)], clock)
    c.set_pod(foreign("w1", "g"))
    clock.t += 1
    c.set_pod(foreign("w2", "g"))
    assert [e.uid for e in c.uncounted("g")] == ["w1", "w2"]
    c.delete_pod("s")
    assert c.pods["w1"].placement is not None and c.pods["w2"].placement is None


def test_a_reserve_that_cannot_take_its_cards_leaves_nothing_behind() -> None:
    c = cache_with([make_node("g", gpus=1)], [bound("a", "g", (0,))])
    c.set_pod(make_pod("p", gpus=1, uid="p"))
    assert not c.reserve(c.pending["p"], "g", (0,))
    assert "p" not in c.pods
    assert c.reserve(c.pending["p"], "g", (0,), provisional=True) is False


def test_a_provisional_hold_is_not_confirmed_by_a_pod_of_another_name_under_its_uid() -> None:
    clock = Clock()
    c = cache_with([make_node("g", gpus=1)], [], clock)
    made_up = pod_info(make_pod("p", gpus=1, uid="x"), GPU, "Pod")
    assert c.reserve(made_up, "g", (0,), provisional=True)
    c.set_pod(make_pod("q", gpus=1, uid="x"))  # the watch's pod under that UID has another name
    clock.t += 6
    assert c.expire_provisional() == ["x"] and "x" not in c.pods


async def test_a_node_change_places_running_pods_before_holds() -> None:
    """The node loses the card the running pod b was on; the state is rebuilt. b is counted on the
    card left (it runs there), and the hold that card carried is dropped, not the other way round."""
    b = make_pod("b", uid="b", gpus=1, node="n", annotations=assignment_annotations(GPU, "n", (1,), 1000))
    h = Harness([make_node("n", gpus=2)], [b])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"] and h.cache.pods["p"].cards == (0,)
    h.cache.set_node(make_node("n", gpus=1, rv="2"))
    h.cache.state  # noqa: B018 - the next read rebuilds the state
    assert h.cache.pods["b"].placement is not None and h.cache.pods["b"].cards == (0,)
    assert "p" not in h.cache.pods


# -- nominated pods -------------------------------------------------------------------------------------


async def test_a_nominated_pod_that_holds_its_cards_is_not_counted_again() -> None:
    running = make_pod("r", cpu="1", memory="1Gi", gpu_milli=600, uid="r", node="g0")
    h = Harness([make_node("g0", gpus=1)], [running])  # 400 milli free
    n = watch(h, share("n", 200, priority=1000, nominate="g0"))
    assert (await filter_(h, n, ["g0"]))["NodeNames"] == ["g0"]  # n holds 200 milli: 200 left
    p = watch(h, share("p", 200))
    assert (await filter_(h, p, ["g0"]))["NodeNames"] == ["g0"]


async def test_nominated_pods_are_counted_the_highest_priority_first() -> None:
    """Card 0 has 700 milli free, card 1 all of it. n1 (600, the higher priority) goes first and takes
    the tighter card 0; n2 (700) then card 1, leaving 300 there: p (350) does not fit. Counted the
    other way round, n2 took card 0 and left 400 on card 1 for p."""
    running = make_pod(
        "r",
        cpu="1",
        memory="1Gi",
        gpu_milli=300,
        uid="r",
        node="g0",
        annotations=assignment_annotations(GPU, "g0", (0,), 300),
    )
    h = Harness([make_node("g0", gpus=2)], [running])
    watch(h, share("n2", 700, priority=1000, nominate="g0"))
    watch(h, share("n1", 600, priority=2000, nominate="g0"))
    p = watch(h, share("p", 350))
    ans = await filter_(h, p, ["g0"])
    assert ans["NodeNames"] == [] and ans["FailedNodes"]["g0"].endswith(HELD_FOR_NOMINATED)


async def test_a_node_too_small_without_the_nominated_pods_does_not_blame_them() -> None:
    running = make_pod("r", cpu="1", memory="1Gi", gpu_milli=600, uid="r", node="g0")
    h = Harness([make_node("g0", gpus=1)], [running])  # 400 milli free
    watch(h, share("n", 200, priority=1000, nominate="g0"))
    p = watch(h, share("p", 500))  # does not fit g0 even alone
    ans = await filter_(h, p, ["g0"])
    reasons = {**ans["FailedNodes"], **ans["FailedAndUnresolvableNodes"]}
    assert ans["NodeNames"] == [] and HELD_FOR_NOMINATED not in reasons["g0"]


# -- filter and bind --------------------------------------------------------------------------------------


async def test_a_filter_elsewhere_keeps_the_cards_of_a_bind_whose_outcome_is_unknown() -> None:
    h = Harness([make_node("g0", gpus=1), make_node("g1", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["g0"]))["NodeNames"] == ["g0"]
    h.api.fail["bind"] = 0.01
    assert "cards stay reserved" in await bind(h, p, "g0")
    del h.api.fail["bind"]
    assert (await filter_(h, p, ["g1"]))["NodeNames"] == ["g1"]  # g0 not offered: decided as usual
    entry = h.cache.pods["p"]
    assert entry.status == UNCERTAIN and entry.node == "g0" and usage(h) == {"g0": [1000], "g1": [0]}
    assert "p" in h.cache.pending


async def test_a_bind_to_another_node_after_an_unknown_outcome_is_refused_without_a_write() -> None:
    h = Harness([make_node("g0", gpus=1), make_node("g1", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["g0"]))["NodeNames"] == ["g0"]
    h.api.fail["bind"] = 0.01
    assert "cards stay reserved" in await bind(h, p, "g0")
    del h.api.fail["bind"]
    writes = len([c for c in h.api.calls if c[0] == "bind"])
    assert "by an earlier bind" in await bind(h, p, "g1")
    assert len([c for c in h.api.calls if c[0] == "bind"]) == writes
    assert usage(h) == {"g0": [1000], "g1": [0]}


async def test_a_request_changed_after_the_hold_is_bound_and_counted_as_it_is_now() -> None:
    """p's share annotation went from 300 to 800 milli between filter's hold and the bind: the
    binding carries 800, and 800 is what the cache counts, not the hold's 300."""
    h = Harness([make_node("g0", gpus=1)], [])
    p = pending(h, "p", gpu_milli=300, share_as_resource=False)
    assert (await filter_(h, p, ["g0"]))["NodeNames"] == ["g0"] and usage(h) == {"g0": [300]}
    pending(h, "p", gpu_milli=800, share_as_resource=False, rv="2001")
    assert await bind(h, p, "g0") == ""
    assert h.cache.pods["p"].spec.gpu_milli == 800 and usage(h) == {"g0": [800]}


async def test_a_server_error_on_the_binding_write_keeps_the_cards_held() -> None:
    """500 (etcd timed out, say) may come after the write was applied: the outcome is unknown."""
    h = Harness([make_node("n", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"]
    h.api.fail["bind"] = ApiError(500, "InternalError", "etcdserver: request timed out")
    assert "cards stay reserved" in await bind(h, p, "n")
    assert h.cache.pods["p"].status == UNCERTAIN and usage(h) == {"n": [1000]}


async def test_already_assigned_here_is_a_success_that_a_later_relist_can_settle() -> None:
    """The binding was written by an earlier bind we lost track of: the 409 says the pod is on this
    node, so bind succeeds; when the pod is gone before the watch ever shows it, a relist frees it."""
    h = Harness([make_node("n", gpus=1)], [])
    t = clocked(h)
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"]
    h.api.pods[("default", "p")]["spec"]["nodeName"] = "n"  # written already; the watch is behind
    assert await bind(h, p, "n") == ""
    del h.api.pods[("default", "p")]
    t[0] += 6
    h.cache.replace_pods([])
    t[0] += 3600
    h.cache.expire_uncertain(30.0)
    assert "p" not in h.cache.pods and usage(h) == {"n": [0]}


async def test_already_assigned_with_the_pod_unreadable_holds_the_cards_as_uncertain() -> None:
    h = Harness([make_node("n", gpus=1)], [])
    t = clocked(h)
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"]
    h.api.pods[("default", "p")]["spec"]["nodeName"] = "m"  # somewhere, perhaps here
    h.api.fail["get"] = ApiError(503, "ServiceUnavailable", "try later")
    assert "already" in await bind(h, p, "n")
    assert h.cache.pods["p"].status == UNCERTAIN and usage(h) == {"n": [1000]}
    t[0] += 31
    assert h.cache.expire_uncertain(30.0) == ["p"] and usage(h) == {"n": [0]}


async def test_already_assigned_elsewhere_counts_the_pod_where_it_went() -> None:
    h = Harness([make_node("n", gpus=1), make_node("m", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"]
    h.api.pods[("default", "p")]["spec"]["nodeName"] = "m"
    assert "already bound to node m" in await bind(h, p, "n")
    assert h.cache.pods["p"].node == "m" and usage(h) == {"n": [0], "m": [1000]}


async def test_a_bind_naming_another_pod_under_a_bound_uid_is_refused() -> None:
    h = Harness([make_node("n", gpus=1)], [])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["n"]))["NodeNames"] == ["n"] and await bind(h, p, "n") == ""
    h.cache.set_pod(copy.deepcopy(h.api.pods[("default", "p")]))  # the watch shows it bound
    assert (await bind(h, p, "n", name="q")).startswith("refused: pod default/q does not have UID p")


# -- prioritize's scores ----------------------------------------------------------------------------------


def test_scores_without_the_decisions_node_go_to_the_best_ranked_of_the_best() -> None:
    feasible = np.array([0, 1, 2, 3])
    outcome = Outcome(Decision(0, (), feasible, NodeScores(np.array([9.0, 5.0, 5.0, 1.0]))), "policy", "ppo")
    rank = np.array([0, 2, 1, 3])  # node 2 before node 1 on ties
    scores = extender_scores(outcome, np.array([1, 2, 3]), rank)
    assert scores.tolist() == [9, 10, 0]


def test_a_node_named_twice_gets_the_top_score_once() -> None:
    feasible = np.array([0, 1])
    outcome = Outcome(Decision(0, (), feasible, NodeScores(np.array([2.0, 1.0]))), "policy", "ppo")
    scores = extender_scores(outcome, np.array([0, 1, 0]), np.arange(2))
    assert scores.tolist() == [10, 0, 0]


def test_an_outcome_with_a_verdict_scores_nothing() -> None:
    feasible = np.array([0, 1])
    outcome = Outcome(
        Decision(1, (), feasible, NodeScores(np.array([2.0, 1.0]))), "policy", "ppo", verdict=Verdict("delay", "")
    )
    assert extender_scores(outcome, np.array([0, 1]), np.arange(2)).tolist() == [0, 0]


# -- preempt's victims ------------------------------------------------------------------------------------


async def preempt(h: Harness, pod: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, Any]:
    meta = {node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for node, uids in victims.items()}
    return await h.extender.preempt(preemption_args({"Pod": pod, "NodeNameToMetaVictims": meta}))


async def test_preempt_drops_a_node_whose_victim_runs_on_another_node() -> None:
    """v runs on g1; a request naming it as g0's victim would evict it for a node it does not free."""
    h = Harness([make_node("g0", gpus=1), make_node("g1", gpus=1)], [make_pod("v", uid="v", gpus=1, node="g1")])
    p = pending(h, "p", gpus=1)
    assert await preempt(h, p, {"g0": ["v"]}) == {"NodeNameToMetaVictims": {}}


async def test_preempt_drops_a_node_whose_victim_is_only_a_hold() -> None:
    """q is pending with filter's hold on g0's card: evicting it frees nothing that runs there."""
    h = Harness([make_node("g0", gpus=1)], [])
    q = pending(h, "q", gpus=1)
    assert (await filter_(h, q, ["g0"]))["NodeNames"] == ["g0"]
    p = pending(h, "p", gpus=1)
    assert await preempt(h, p, {"g0": ["q"]}) == {"NodeNameToMetaVictims": {}}


async def test_preempt_ignores_a_preemptor_that_is_bound_already() -> None:
    """A late preempt for a pod that has since been bound must not evict anything for it."""
    h = Harness([make_node("g0", gpus=1), make_node("g1", gpus=1)], [make_pod("v", uid="v", gpus=1, node="g0")])
    p = pending(h, "p", gpus=1)
    assert (await filter_(h, p, ["g1"]))["NodeNames"] == ["g1"] and await bind(h, p, "g1") == ""
    h.cache.set_pod(copy.deepcopy(h.api.pods[("default", "p")]))  # the watch shows it bound
    assert await preempt(h, p, {"g0": ["v"]}) == {"NodeNameToMetaVictims": {}}


# -- whom filter holds cards for ----------------------------------------------------------------------------


async def test_filter_holds_nothing_for_another_schedulers_pod_the_watch_has_not_seen() -> None:
    h = Harness([make_node("g0", gpus=1)], [])
    other = make_pod("o", uid="o", gpus=1, scheduler="default-scheduler")
    assert (await filter_(h, other, ["g0"]))["NodeNames"] == ["g0"]
    assert "o" not in h.cache.pods and usage(h) == {"g0": [0]}


async def test_filter_holds_nothing_for_a_request_naming_the_uid_of_another_pod() -> None:
    h = Harness([make_node("g0", gpus=1)], [])
    pending(h, "p", gpus=1)
    forged = make_pod("q", uid="p", gpus=1)  # p's UID under another name
    assert (await filter_(h, forged, ["g0"]))["NodeNames"] == ["g0"]
    assert "p" not in h.cache.pods and usage(h) == {"g0": [0]}
