"""Bind and preempt trust nobody: the pod's current spec decides (ours? how much? which nodes may it
use?), filter's memory is a hint, and names that no object can have never reach an API path."""

from __future__ import annotations

import copy

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rlsched.extender.kubeapi import KubeApi, pod_path
from rlsched.extender.names import (
    InvalidName,
    check_node_name,
    check_pod_ref,
    check_uid,
    label_problem,
    subdomain_problem,
)
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import ExtenderArgs, extender_args


def writes(h: Harness) -> list[tuple]:
    return [c for c in h.api.calls if c[0] == "bind"]


def full_cluster() -> Harness:
    """``g0``: 8 cards, all held; ``g1``: 8 free cards, tainted; ``cpu``: no GPU."""
    g1 = make_node("g1", gpus=8, labels={"pool": "b"})
    g1["spec"]["taints"] = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    nodes = [make_node("g0", gpus=8, labels={"pool": "a"}), g1, make_node("cpu", labels={"pool": "a"})]
    holders = [make_pod(f"h{i}", gpus=4, node="g0", uid=f"h{i}") for i in range(2)]
    return Harness(nodes, holders)


async def post(h: Harness, verb: str, body: dict) -> tuple[int, dict]:
    async with TestClient(TestServer(h.app())) as c:
        r = await c.post(f"/{verb}", data=orjson.dumps(body))
        return r.status, await r.json()


def bind_args(pod: dict, node: str) -> dict:
    m = pod["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}


# -- the issue's attacks ------------------------------------------------------------------------------


async def test_a_forged_filter_cannot_make_bind_place_a_pod_where_it_does_not_fit() -> None:
    h = full_cluster()
    victim = h.add_pod(make_pod("victim", gpus=8, uid="victim"))
    h.cache.set_pod(victim)
    forged = make_pod("victim", uid="victim", rv="1")  # the victim's UID, no GPU request
    body = await h.extender.filter(extender_args({"Pod": forged, "NodeNames": ["g0"]}))
    assert body["NodeNames"] == ["g0"]  # filter judged the forged pod: it fits
    status, answer = await post(h, "bind", bind_args(victim, "g0"))
    assert status == 200 and "no longer fits node g0" in answer["Error"] and "8 whole free GPU card" in answer["Error"]
    assert writes(h) == [] and "victim" not in h.cache.pods
    assert h.cache.state.full_free[h.cache.state.index["g0"]] == 0


async def test_a_forged_hint_does_not_choose_the_cards() -> None:
    h = Harness([make_node("g0", gpus=4)])
    real = h.add_pod(make_pod("p", gpus=2, uid="p", rv="5"))
    h.cache.set_pod(real)
    forged = make_pod("p", gpus=1, uid="p", rv="4")  # another version: one card
    await h.extender.filter(extender_args({"Pod": forged, "NodeNames": ["g0"]}))
    status, answer = await post(h, "bind", bind_args(real, "g0"))
    assert answer == {"Error": ""}
    ((_, _, _, _, ann),) = writes(h)
    assert len(ann["rlsched.io/gpu-cards"].split(",")) == 2  # the current spec's two cards, not the hint's one


async def test_another_schedulers_pod_is_never_bound() -> None:
    h = full_cluster()
    theirs = h.add_pod(make_pod("theirs", cpu="1", namespace="other", uid="theirs", scheduler="default-scheduler"))
    for cached in (False, True):
        if cached:
            h.cache.set_pod(theirs)
        status, answer = await post(h, "bind", bind_args(theirs, "cpu"))
        assert status == 200 and answer["Error"].startswith(
            "refused: pod other/theirs is not scheduled by rl-scheduler"
        )
    assert writes(h) == []
    assert h.metrics.registry.get_sample_value("rlsched_extender_binds_total", {"result": "refused"}) == 2


async def test_the_request_cannot_claim_a_pod_is_ours() -> None:
    """kube-scheduler's copy is not asked: a GET of the pod says whose it is."""
    h = full_cluster()
    theirs = h.add_pod(make_pod("theirs", cpu="1", uid="theirs", scheduler="default-scheduler"))
    ours_copy = copy.deepcopy(theirs)
    ours_copy["spec"]["schedulerName"] = "rl-scheduler"
    await h.extender.filter(extender_args({"Pod": ours_copy, "NodeNames": ["cpu"]}))
    _, answer = await post(h, "bind", bind_args(theirs, "cpu"))
    assert "is not scheduled by rl-scheduler" in answer["Error"] and writes(h) == []


@pytest.mark.parametrize(
    "change, node, words",
    [
        ({}, "g1", "taint the pod does not tolerate (dedicated=ml:NoSchedule)"),
        ({"nodeSelector": {"pool": "b"}}, "g0", "nodeSelector (pool=b)"),
        ({"nodeSelector": {"pool": "nowhere"}}, "cpu", "nodeSelector (pool=nowhere)"),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            },
            "cpu",
            "required node affinity",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["g0"]}]}
                            ]
                        }
                    }
                }
            },
            "cpu",
            "required node affinity",
        ),
    ],
)
async def test_placement_rules_are_checked(change, node, words) -> None:
    h = full_cluster()
    p = make_pod("p", cpu="1", uid="p")
    p["spec"].update(change)
    h.add_pod(p)
    for cached in (False, True):
        if cached:
            h.cache.set_pod(p)
        res = await h.binder.bind("p", "default", "p", node)
        assert res.result == "refused" and words in res.error, res.error
    assert writes(h) == []


@pytest.mark.parametrize(
    "change",
    [
        {
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "b"},
        },
        {
            "tolerations": [{"operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]},
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["g1"]}]},
                        ]
                    }
                }
            },
        },
    ],
)
async def test_a_pod_that_follows_the_rules_binds(change) -> None:
    h = full_cluster()
    p = make_pod("p", gpus=8, uid="p")
    p["spec"].update(change)
    h.cache.set_pod(h.add_pod(p))
    res = await h.binder.bind("p", "default", "p", "g1")
    assert res.error == "" and len(res.cards) == 8 and [c[0] for c in h.api.calls] == ["bind"]


async def test_cordoned_and_unreadable_nodes_are_refused() -> None:
    h = full_cluster()
    cordoned = make_node("cordoned", gpus=2)
    cordoned["spec"]["unschedulable"] = True
    odd = make_node("odd", gpus=2)
    odd["spec"]["taints"] = [{"key": "k", "effect": ["NoSchedule"]}]
    h.cache.set_node(cordoned)
    h.cache.set_node(odd)
    h.cache.set_pod(h.add_pod(make_pod("p", gpus=1, uid="p")))  # tolerates nvidia.com/gpu and not-ready only
    res = await h.binder.bind("p", "default", "p", "cordoned")
    assert res.result == "refused" and "node.kubernetes.io/unschedulable:NoSchedule" in res.error
    res = await h.binder.bind("p", "default", "p", "odd")
    assert res.result == "refused" and "taints of node odd could not be read" in res.error
    assert writes(h) == []


async def test_a_recreated_pod_is_refused_without_repeating_its_uid() -> None:
    h = full_cluster()
    h.add_pod(make_pod("p", cpu="1", uid="the-real-uid"))
    res = await h.binder.bind("a-guessed-uid", "default", "p", "cpu")
    assert res.result == "refused" and "recreated" in res.error and "the-real-uid" not in res.error


async def test_a_cached_pod_under_another_name_is_not_taken() -> None:
    """The cache entry for the UID is another pod: the request's name is read afresh and must agree."""
    h = full_cluster()
    h.cache.set_pod(h.add_pod(make_pod("real", cpu="1", uid="u1")))
    h.add_pod(make_pod("other", cpu="1", uid="u2"))
    res = await h.binder.bind("u1", "default", "other", "cpu")
    assert res.result == "refused" and "does not have UID u1" in res.error and writes(h) == []


async def test_an_unreadable_current_pod_is_refused_not_a_500() -> None:
    h = full_cluster()
    p = make_pod("p", uid="p")
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = {"a": 1}
    h.add_pod(p)
    status, answer = await post(h, "bind", bind_args(p, "cpu"))
    assert status == 200 and answer["Error"].startswith("refused: pod default/p cannot be read")


# -- names ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("PodName", "../../../nodes/X"),
        ("PodName", "a/b"),
        ("PodName", "UPPER"),
        ("PodName", "x" * 254),
        ("PodName", "a..b"),
        ("PodName", "-a"),
        ("PodName", "a\n"),
        ("PodName", "ａ"),
        ("PodName", "%2e%2e"),
        ("PodNamespace", "kube-system/../x"),
        ("PodNamespace", "a.b"),
        ("PodNamespace", "x" * 64),
        ("Node", "../x"),
        ("Node", "node with spaces"),
        ("PodUID", "x" * 200),
        ("PodUID", "a b"),
    ],
)
async def test_names_no_object_can_have_are_a_400_and_no_api_call(field, value) -> None:
    h = full_cluster()
    p = h.add_pod(make_pod("p", cpu="1", uid="p"))
    body = dict(bind_args(p, "cpu"), **{field: value})
    status, answer = await post(h, "bind", body)
    assert status == 400 and answer["Error"].startswith(f"{field}:") and h.api.calls == []
    res = await h.binder.bind(body["PodUID"], body["PodNamespace"], body["PodName"], body["Node"])
    assert res.result == "refused" and h.api.calls == []


async def test_the_path_traversal_of_the_issue_never_reaches_the_api_server() -> None:
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"kind": "Node", "metadata": {"name": "X", "uid": "secret-node-uid"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    async with TestServer(app) as server:
        api = KubeApi(str(server.make_url("")), None, lambda: None)
        try:
            with pytest.raises(InvalidName):
                await api.get_pod("default", "../../../nodes/X", 2)
            with pytest.raises(InvalidName):
                await api.create_binding("default/../..", "p", "u", "n", 2)
            await api.get_pod("default", "p.1", 2)
        finally:
            await api.close()
    assert seen == ["/api/v1/namespaces/default/pods/p.1"]


def test_paths_are_quoted_and_checked() -> None:
    assert pod_path("ns-1", "web-0.a") == "/api/v1/namespaces/ns-1/pods/web-0.a"
    with pytest.raises(InvalidName):
        pod_path("ns", "a%2fb")


@pytest.mark.parametrize(
    "name, ok",
    [
        ("a", True),
        ("a-b.c-d", True),
        ("0.1", True),
        ("a" * 253, True),
        ("a" * 63 + "." + "b" * 63, True),
        ("", False),
        ("A", False),
        ("a_b", False),
        ("a.", False),
        (".a", False),
        ("a..b", False),
        ("a-", False),
        ("a" * 254, False),
        ("é", False),
        ("a/b", False),
        (None, False),
        (7, False),
    ],
)
def test_subdomain(name, ok) -> None:
    assert (subdomain_problem(name) is None) is ok


@pytest.mark.parametrize(
    "name, ok",
    [
        ("default", True),
        ("kube-system", True),
        ("a" * 63, True),
        ("a.b", False),
        ("a" * 64, False),
        ("-a", False),
    ],
)
def test_label(name, ok) -> None:
    assert (label_problem(name) is None) is ok


def test_messages_are_short_whatever_the_input() -> None:
    with pytest.raises(InvalidName) as info:
        check_pod_ref("default", "X" * 200)
    assert len(str(info.value)) < 200 and info.value.field == "PodName"
    with pytest.raises(InvalidName):
        check_node_name("a" * 300)
    with pytest.raises(InvalidName):
        check_uid("")


# -- preempt ---------------------------------------------------------------------------------------------


def preempt_cluster() -> tuple[Harness, dict]:
    a = make_pod("a", gpus=4, node="g0", uid="a")
    b = make_pod("b", cpu="1", node="g1", uid="b")
    c = make_pod("c", gpus=4, node="g1", uid="c")
    h = Harness([make_node("g0", gpus=4), make_node("g1", gpus=4)], [a, b, c])
    return h, {
        "g0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0},
        "g1": {"Pods": [{"UID": "b"}], "NumPDBViolations": 0},
    }


async def test_preempt_reads_the_preemptor_from_the_api_not_the_request() -> None:
    h, victims = preempt_cluster()
    h.add_pod(make_pod("p", gpus=2, uid="p"))
    lying = make_pod("p", cpu="1", uid="p")  # says: no GPU, so freeing b's cpu on g1 would do
    status, body = await post(h, "preempt", {"Pod": lying, "NodeNameToMetaVictims": victims})
    assert status == 200 and set(body["NodeNameToMetaVictims"]) == {"g0"}  # g1's victim frees no card


async def test_preempt_for_another_schedulers_pod_keeps_nothing() -> None:
    h, victims = preempt_cluster()
    theirs = h.add_pod(make_pod("p", gpus=2, uid="p", scheduler="default-scheduler"))
    status, body = await post(h, "preempt", {"Pod": theirs, "NodeNameToMetaVictims": victims})
    assert status == 200 and body == {"NodeNameToMetaVictims": {}}
    status, body = await post(h, "preempt", {"Pod": make_pod("ghost", gpus=2), "NodeNameToMetaVictims": victims})
    assert status == 200 and body == {"NodeNameToMetaVictims": {}}


async def test_preempt_keeps_a_node_only_when_it_sees_every_victim_there() -> None:
    """kube-scheduler evicts the victims we answer without checking them again: answering g0 with a
    alone (dropping the victim we do not see) would evict a and could leave the preemptor without
    room. A node with a victim we cannot see, or one listed under another node, is dropped."""
    h, _ = preempt_cluster()
    h.cache.set_pod(h.add_pod(make_pod("p", gpus=2, uid="p")))
    victims = {
        "g0": {"Pods": [{"UID": "a"}, {"UID": "unknown"}], "NumPDBViolations": 0},
        "g1": {"Pods": [{"UID": "c"}, {"UID": "a"}], "NumPDBViolations": 1},  # a is on g0
    }
    status, body = await post(h, "preempt", {"Pod": make_pod("p", gpus=2, uid="p"), "NodeNameToMetaVictims": victims})
    assert status == 200 and body == {"NodeNameToMetaVictims": {}}
    victims = {"g0": {"Pods": [{"UID": "a"}, {"UID": "a"}], "NumPDBViolations": 2}}  # named twice: once
    status, body = await post(h, "preempt", {"Pod": make_pod("p", gpus=2, uid="p"), "NodeNameToMetaVictims": victims})
    assert body == {"NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 2}}}
    assert [c[0] for c in h.api.calls] == []  # the preemptor came from the cache


async def test_preempt_does_not_count_the_preemptors_own_hold_against_it() -> None:
    """p's filter holds the two cards of g0 that a does not use: counted against p, its own hold
    would leave no two cards free whatever is evicted, and the node would be dropped."""
    a = make_pod("a", gpus=2, node="g0", uid="a", cpu="4")
    h = Harness([make_node("g0", gpus=4, cpu="32")], [a])
    p = h.add_pod(make_pod("p", gpus=2, uid="p", cpu="4"))
    h.cache.set_pod(copy.deepcopy(p))
    answer = await h.extender.filter(ExtenderArgs(copy.deepcopy(p), ["g0"], None))
    assert answer["NodeNames"] == ["g0"] and h.cache.pods["p"].status == "reserved"
    c = make_pod("c", cpu="22", node="g0", uid="c")  # bound by another scheduler
    h.cache.set_pod(copy.deepcopy(c))
    victims = {"g0": {"Pods": [{"UID": "c"}], "NumPDBViolations": 0}}
    status, body = await post(h, "preempt", {"Pod": p, "NodeNameToMetaVictims": victims})
    assert status == 200 and body == {"NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": "c"}], "NumPDBViolations": 0}}}


@pytest.mark.parametrize("per_node, nodes", [(5_001, 1), (4_000, 13)])
async def test_preempt_refuses_victim_lists_no_node_can_hold(per_node: int, nodes: int) -> None:
    h, _ = preempt_cluster()
    victims = {
        f"g{k}": {"Pods": [{"UID": f"v{k}-{i}"} for i in range(per_node)], "NumPDBViolations": 0} for k in range(nodes)
    }
    status, body = await post(h, "preempt", {"Pod": make_pod("p", gpus=2, uid="p"), "NodeNameToMetaVictims": victims})
    assert status == 400 and "at most 5000 per node and 50000 in all" in body["Error"]


async def test_preempt_with_an_impossible_name_is_a_400() -> None:
    h, victims = preempt_cluster()
    status, body = await post(h, "preempt", {"Pod": make_pod("../nodes/x", gpus=2), "NodeNameToMetaVictims": victims})
    assert status == 400 and body["Error"].startswith("Pod.metadata.name:") and h.api.calls == []
