"""Placement rules as Kubernetes allows them: no list has a cap of its own (a required ``In`` of 1,100
hostnames is valid), one object's entries together do; an over-long requirement value fails only its
term; and a pending pod whose rules still cannot be read is answered unschedulable by filter, with
the reason, holding no cards (bind would refuse it on every node)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rlsched.extender.cache import RESERVED
from rlsched.extender.node_rules import MAX_ITEMS, MAX_STRING, NodeFacts, RuleError, pod_rules, refusal
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import extender_args

NODES = [make_node(f"g{i}", gpus=4) for i in range(4)]
NAMES = [n["metadata"]["name"] for n in NODES]
HOSTNAME = "kubernetes.io/hostname"


def with_terms(pod: dict[str, Any], *terms: list[dict[str, Any]]) -> dict[str, Any]:
    """``pod`` with a required node affinity of these terms (each a list of matchExpressions)."""
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": exprs} for exprs in terms]
            }
        }
    }
    return pod


def hosts_in(values: list[str]) -> list[dict[str, Any]]:
    return [{"key": HOSTNAME, "operator": "In", "values": values}]


def facts(name: str) -> NodeFacts:
    return NodeFacts(name, {HOSTNAME: name})


def test_a_long_list_is_read_the_object_total_is_bounded() -> None:
    long = pod_rules(with_terms(make_pod("p"), hosts_in([f"h-{i}" for i in range(5000)] + ["g1"])))
    assert refusal(long, facts("g1")) is None and refusal(long, facts("g2")) is not None
    # many lists, each short, together over the budget: refused, naming where the budget ran out
    many = with_terms(make_pod("p"), *[hosts_in(["x"] * 999) for _ in range(MAX_ITEMS // 999 + 1)])
    with pytest.raises(RuleError, match=f"over {MAX_ITEMS} entries in all") as info:
        pod_rules(many)
    assert info.value.field.endswith(".values")
    assert MAX_ITEMS >= 100_000


@pytest.mark.parametrize(
    "bad",
    [
        {"key": HOSTNAME, "operator": "In", "values": ["g0", "v" * (MAX_STRING + 5)]},
        {"key": HOSTNAME, "operator": "NotIn", "values": ["v" * (MAX_STRING + 5)]},  # fails, not "every node"
        {"key": "k" * (MAX_STRING + 5), "operator": "DoesNotExist"},
        {"key": HOSTNAME, "operator": "N" * (MAX_STRING + 5), "values": ["g0"]},
    ],
)
def test_an_over_long_requirement_fails_only_its_own_term(bad: dict[str, Any]) -> None:
    rules = pod_rules(with_terms(make_pod("p"), [bad], hosts_in(["g1"])))
    assert refusal(rules, facts("g0")) is not None  # the bad term matches nothing, not even g0
    assert refusal(rules, facts("g1")) is None  # the other term still counts
    assert all(len(v) <= MAX_STRING + 1 for t in rules.required_terms or () for r in t.expressions for v in r.values)


def test_an_over_long_match_fields_value_matches_no_node_name() -> None:
    pod = make_pod("p")
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n" * 5000]}]}
                ]
            }
        }
    }
    assert refusal(pod_rules(pod), facts("g0")) is None  # NotIn a name no node has: every node


async def test_a_pod_pinned_to_1100_hostnames_is_filtered_and_bound() -> None:
    pod = with_terms(make_pod("pinned", uid="pin", gpus=1), hosts_in(NAMES + [f"spare-{i}" for i in range(1096)]))
    h = Harness(copy.deepcopy(NODES), [pod])
    h.add_pod(pod)
    assert h.cache.rejections.totals == {} and "pin" in h.cache.pod_rules
    body = await h.extender.filter(extender_args({"Pod": pod, "NodeNames": NAMES}))
    assert len(body["NodeNames"]) == 1
    result = await h.binder.bind("pin", "default", "pinned", body["NodeNames"][0])
    assert result.error == "" and result.result == "ok"


def over_budget(pod: dict[str, Any]) -> dict[str, Any]:
    return with_terms(pod, hosts_in(NAMES + ["x"] * MAX_ITEMS))


async def test_a_pod_whose_rules_cannot_be_read_is_unschedulable_and_holds_nothing() -> None:
    pod = over_budget(make_pod("odd", uid="odd", gpus=1))
    h = Harness(copy.deepcopy(NODES), [pod])
    h.add_pod(pod)
    assert h.cache.rejections.totals == {"Pod/placement-rules": 1} and "odd" in h.cache.pending
    body = await h.extender.filter(extender_args({"Pod": pod, "NodeNames": NAMES}))
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    assert set(body["FailedAndUnresolvableNodes"]) == set(NAMES)
    why = body["FailedAndUnresolvableNodes"]["g0"]
    assert "placement rules cannot be read" in why and f"over {MAX_ITEMS} entries" in why and len(why) <= 256
    assert "odd" not in h.cache.pods  # no cards held for a pod bind would refuse
    assert h.extender.counts == {"invalid": 1}
    # a later version that reads is scheduled as any other
    fixed = with_terms(copy.deepcopy(pod), hosts_in(NAMES))
    fixed["metadata"]["resourceVersion"] = "2001"
    h.cache.set_pod(fixed)
    assert "odd" not in h.cache.rules_problems
    body = await h.extender.filter(extender_args({"Pod": fixed, "NodeNames": NAMES}))
    assert len(body["NodeNames"]) == 1


async def test_a_provisional_hold_ends_when_the_watch_cannot_read_the_rules() -> None:
    h = Harness(copy.deepcopy(NODES))
    pod = over_budget(make_pod("late", uid="late", gpus=1))
    body = await h.extender.filter(extender_args({"Pod": pod, "NodeNames": NAMES[:1]}))
    assert body["NodeNames"] == ["g0"] and h.cache.pods["late"].status == RESERVED  # held provisionally
    h.cache.set_pod(pod)  # the watch delivers it
    assert "late" not in h.cache.pods and "late" in h.cache.rules_problems
    h.cache.delete_pod("late")
    assert "late" not in h.cache.rules_problems
