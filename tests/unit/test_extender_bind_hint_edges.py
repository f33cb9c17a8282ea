"""Bind's trust edges the rest of the suite left unchecked: each test fails if one check is dropped
(filter's card hint used only for this pod version and this node, the duplicate shortcut only for our
own binds, a recreated pod forgotten, a remembered verdict honoured only under the pod's own name)."""

from __future__ import annotations

import copy
from typing import Any

from test_extender_verbs import fake_loader, model_file

from rlsched.extender.kubeapi import ApiError
from rlsched.extender.objects import assignment_annotations
from rlsched.extender.settings import ExtenderSettings, GpuConventions, PolicySettings
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import BindingArgs, ExtenderArgs, preemption_args

GPU = GpuConventions()


def holder(name: str, node: str) -> dict[str, Any]:
    """A running 2-card pod of ours on cards 0 and 1 of ``node``."""
    ann = assignment_annotations(GPU, node, (0, 1), 1000)
    return make_pod(name, gpus=2, node=node, uid=name, annotations=ann)


def half_full() -> tuple[Harness, dict[str, Any]]:
    """``g0`` and ``g1``: 4 cards each, 0 and 1 held; pending ``p`` (2 cards, rv 2000). Filter keeps
    every feasible node (topK 0), so it holds nothing: bind's cards come from the hint or the rule."""
    s = ExtenderSettings(policy=PolicySettings(top_k=0))
    h = Harness([make_node("g0", gpus=4), make_node("g1", gpus=4)], [holder("h-g0", "g0"), holder("h-g1", "g1")], s)
    p = h.add_pod(make_pod("p", gpus=2, uid="p", rv="2000"))
    h.cache.set_pod(copy.deepcopy(p))
    return h, p


async def hinted_node(h: Harness, pod: dict[str, Any]) -> str:
    """Filter ``pod``; the node of its decision, whose cards (2, 3) are remembered as the hint."""
    body = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), ["g0", "g1"], None))
    assert sorted(body["NodeNames"]) == ["g0", "g1"] and "p" not in h.cache.pods  # nothing held
    decision = h.extender.memory.get("p").outcome.decision
    assert decision.cards == (2, 3)
    return h.cache.state.names[decision.node]


async def test_a_hint_from_an_older_pod_version_does_not_choose_the_cards() -> None:
    """Filter saw version 1999 while cards 0 and 1 were held; they are free by the bind. The current
    version (2000) did not get that decision: the card rule chooses on the node as it is now."""
    for rv, cards in (("2000", (2, 3)), ("1999", (0, 1))):  # this version's hint is used; an older one's not
        h, p = half_full()
        sent = copy.deepcopy(p)
        sent["metadata"]["resourceVersion"] = rv
        node = await hinted_node(h, sent)
        h.cache.delete_pod(f"h-{node}")
        res = await h.binder.bind("p", "default", "p", node)
        assert res.error == "" and res.cards == cards, (rv, res)


async def test_a_hint_for_another_node_does_not_choose_the_cards() -> None:
    """kube-scheduler bound to the other kept node: the decision's cards are indices on its node."""
    h, p = half_full()
    hinted = await hinted_node(h, p)
    other = "g1" if hinted == "g0" else "g0"
    h.cache.delete_pod(f"h-{other}")  # cards 2 and 3 are free there, but the rule takes 0 and 1
    res = await h.binder.bind("p", "default", "p", other)
    assert res.error == "" and res.cards == (0, 1), res


async def test_a_pod_another_scheduler_bound_is_refused_not_a_duplicate() -> None:
    """The cache's entry is bound where the bind asks, but not by us (no bind_done): the current pod
    is read and refused as another scheduler's, never answered as our own bind's duplicate."""
    theirs = make_pod("t", cpu="1", node="n", uid="t", scheduler="default-scheduler")
    h = Harness([make_node("n")], [theirs])
    assert h.cache.pods["t"].status == "bound" and not h.cache.pods["t"].bind_done
    res = await h.binder.bind("t", "default", "t", "n")
    assert res.result == "refused" and "is not scheduled by rl-scheduler" in res.error, res


async def test_a_bind_met_by_a_recreated_pod_forgets_the_old_one() -> None:
    """The binding is refused as "already assigned" and the pod under the name has another UID: the
    pod bind was asked for is gone, so it leaves the pending pods at once (not at its delete event)."""
    h = Harness([make_node("n")])
    old = make_pod("p", cpu="1", uid="old")
    h.cache.set_pod(copy.deepcopy(old))
    h.add_pod(make_pod("p", cpu="1", uid="new", node="n"))
    h.api.fail["bind"] = ApiError(409, "Conflict", 'pod p is already assigned to node "n"')
    res = await h.binder.bind("old", "default", "p", "n")
    assert res.result == "error" and "already bound to node n" in res.error, res
    assert "old" not in h.cache.pods and "old" not in h.cache.pending and "old" not in h.cache.pod_rules


async def test_a_delay_remembered_for_another_name_does_not_refuse_the_bind(tmp_path) -> None:
    """A filter under the real pod's UID but another name got a delay: bind of the real pod is not
    held back by it (the verdict is about a pod that does not exist)."""
    s = ExtenderSettings(policy=PolicySettings(model_path=model_file(tmp_path, verdict="delay")))
    h = Harness([make_node("n")], [], s, model_loader=fake_loader)
    real = h.add_pod(make_pod("p", cpu="1", uid="u"))
    h.cache.set_pod(copy.deepcopy(real))
    body = await h.extender.filter(ExtenderArgs(make_pod("forged", cpu="1", uid="u"), ["n"], None))
    assert body["NodeNames"] == [] and body["FailedNodes"]["n"].startswith("delayed by policy")
    answer = await h.extender.bind(BindingArgs("p", "default", "u", "n"))
    assert answer == {"Error": ""} and h.api.pods[("default", "p")]["spec"]["nodeName"] == "n"


async def test_a_delay_remembered_for_another_name_does_not_stop_preemption(tmp_path) -> None:
    """As for bind: preempt for the real pod is not held back by a forged filter's delay under its UID."""
    s = ExtenderSettings(policy=PolicySettings(model_path=model_file(tmp_path, verdict="delay")))
    a = make_pod("a", gpus=4, node="g0", uid="a")
    h = Harness([make_node("g0", gpus=4)], [a], s, model_loader=fake_loader)
    real = h.add_pod(make_pod("p", gpus=4, uid="u"))
    h.cache.set_pod(copy.deepcopy(real))
    body = await h.extender.filter(ExtenderArgs(make_pod("forged", cpu="1", uid="u"), ["g0"], None))
    assert body["NodeNames"] == [] and body["FailedNodes"]["g0"].startswith("delayed by policy")
    victims = {"g0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}
    answer = await h.extender.preempt(preemption_args({"Pod": real, "NodeNameToMetaVictims": victims}))
    assert answer == {"NodeNameToMetaVictims": victims}
