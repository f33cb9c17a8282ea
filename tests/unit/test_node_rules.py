"""Taints, nodeSelector and required node affinity: golden tables with kube-scheduler's answers.

Each row is a case whose answer follows from kube-scheduler v1.37's TaintToleration, NodeUnschedulable
and NodeAffinity filters (k8s.io/api core/v1 Toleration.ToleratesTaint, component-helpers
nodeaffinity); the comment says which rule decides it.
"""

from __future__ import annotations

import pytest

from rlsched.extender.node_rules import (
    MAX_ITEMS,
    NO_RULES,
    NodeFacts,
    RuleError,
    Taint,
    Toleration,
    node_facts,
    pod_rules,
    refusal,
    tolerates,
)


def node(
    name: str = "n1", labels: dict | None = None, taints: list | None = None, unschedulable: bool | None = None
) -> dict:
    spec: dict = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def pod(
    tolerations: list | None = None,
    selector: dict | None = None,
    terms: list | None = None,
    affinity: dict | None = None,
) -> dict:
    spec: dict = {}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if selector is not None:
        spec["nodeSelector"] = selector
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"name": "p"}, "spec": spec}


def allowed(p: dict, n: dict) -> bool:
    return refusal(pod_rules(p), node_facts(n)) is None


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict:
    return {"key": key, "value": value, "effect": effect}


# -- Toleration.ToleratesTaint ---------------------------------------------------------------------

T = Taint("gpu", "a100", "NoSchedule")


@pytest.mark.parametrize(
    "tol, taint_, want",
    [
        (Toleration("gpu", "Equal", "a100", "NoSchedule"), T, True),  # key, value, effect equal
        (Toleration("gpu", "", "a100", "NoSchedule"), T, True),  # empty operator means Equal
        (Toleration("gpu", "Equal", "v100", "NoSchedule"), T, False),  # Equal compares the value
        (Toleration("gpu", "Exists", "", "NoSchedule"), T, True),  # Exists ignores the value
        (Toleration("gpu", "Exists", "", ""), T, True),  # empty effect matches every effect
        (Toleration("gpu", "Exists", "", "NoExecute"), T, False),  # another effect
        (Toleration("", "Exists", "", ""), T, True),  # empty key + Exists: everything
        (Toleration("other", "Exists", "", ""), T, False),  # another key
        (Toleration("gpu", "Equal", "", "NoSchedule"), Taint("gpu", "", "NoSchedule"), True),  # both values empty
        (Toleration("gpu", "Bogus", "a100", "NoSchedule"), T, False),  # unknown operator tolerates nothing
        (Toleration("t", "Lt", "10", ""), Taint("t", "5", "NoSchedule"), True),  # Lt: taint 5 < toleration 10
        (Toleration("t", "Lt", "10", ""), Taint("t", "10", "NoSchedule"), False),  # not strictly less
        (Toleration("t", "Gt", "10", ""), Taint("t", "11", "NoSchedule"), True),  # Gt: taint 11 > 10
        (Toleration("t", "Gt", "10", ""), Taint("t", "-3", "NoSchedule"), False),
        # Lt/Gt operands are canonical decimal integers (apimachinery's IsDecimalInteger, v1.37)
        (Toleration("t", "Gt", "1", ""), Taint("t", "+2", "NoSchedule"), False),
        (Toleration("t", "Gt", "1", ""), Taint("t", "05", "NoSchedule"), False),
        (Toleration("t", "Gt", "1", ""), Taint("t", "5", "NoSchedule"), True),
        (Toleration("t", "Lt", "-0", ""), Taint("t", "-5", "NoSchedule"), False),
        (Toleration("t", "Gt", "1", ""), Taint("t", "2.5", "NoSchedule"), False),  # not an int64
        (Toleration("t", "Gt", "1", ""), Taint("t", " 2", "NoSchedule"), False),  # no spaces
        (Toleration("t", "Gt", "1", ""), Taint("t", "1_0", "NoSchedule"), False),  # no underscores
        (Toleration("t", "Gt", "1", ""), Taint("t", "٣", "NoSchedule"), False),  # ASCII digits only
        (Toleration("t", "Gt", "1", ""), Taint("t", "9223372036854775808", "NoSchedule"), False),  # beyond int64
        (Toleration("t", "Lt", "9223372036854775807", ""), Taint("t", "-9223372036854775808", "NoSchedule"), True),
    ],
)
def test_toleration_tolerates_taint(tol, taint_, want) -> None:
    assert tolerates(tol, taint_) is want


# -- TaintToleration + NodeUnschedulable filters ---------------------------------------------------

GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "tolerations, taints, unschedulable, want",
    [
        ([], [], None, True),  # no taints
        ([], [taint("dedicated", "x", "PreferNoSchedule")], None, True),  # a preference never blocks
        ([], [taint("dedicated", "x", "NoSchedule")], None, False),  # untolerated NoSchedule
        ([], [taint("dedicated", "x", "NoExecute")], None, False),  # untolerated NoExecute
        ([GPU_TOL], [taint("nvidia.com/gpu", "present")], None, True),  # tolerated
        ([GPU_TOL], [taint("nvidia.com/gpu", "present"), taint("dedicated", "x")], None, False),  # every taint must be
        ([{"key": "dedicated", "operator": "Equal", "value": "x"}], [taint("dedicated", "x", "NoExecute")], None, True),
        ([{"operator": "Exists"}], [taint("a"), taint("b", "v", "NoExecute")], None, True),  # tolerate everything
        ([], [], True, False),  # cordoned
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}], [], True, True),
        ([{"operator": "Exists"}], [], True, True),  # DaemonSet-style toleration
        ([], [], False, True),
    ],
)
def test_taints(tolerations, taints, unschedulable, want) -> None:
    assert allowed(pod(tolerations=tolerations), node(taints=taints, unschedulable=unschedulable)) is want


def test_taint_refusal_names_the_taint() -> None:
    why = refusal(pod_rules(pod()), node_facts(node(taints=[taint("dedicated", "ml", "NoSchedule")])))
    assert why == "node has a taint the pod does not tolerate (dedicated=ml:NoSchedule)"


# -- NodeAffinity filter: nodeSelector and required node affinity ----------------------------------

LABELS = {"zone": "a", "gpu": "a100", "cards": "8", "big": "99999999999999999999", "padded": "0" * 21 + "5"}


def expr(key: str, op: str, *values: str) -> dict:
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    "selector, terms, want",
    [
        (None, None, True),  # no rules
        ({}, None, True),  # empty selector: no constraint
        ({"zone": "a"}, None, True),
        ({"zone": "a", "gpu": "a100"}, None, True),  # every key must match
        ({"zone": "a", "gpu": "v100"}, None, False),
        ({"missing": ""}, None, False),  # a missing label never equals, not even ""
        (None, [], False),  # no terms: matches nothing
        (None, [{}], False),  # an empty term matches nothing
        (None, [{"matchExpressions": []}], False),
        (None, [{"matchExpressions": [expr("zone", "In", "a", "b")]}], True),
        (None, [{"matchExpressions": [expr("zone", "In", "b")]}], False),
        (None, [{"matchExpressions": [expr("zone", "NotIn", "b")]}], True),
        (None, [{"matchExpressions": [expr("zone", "NotIn", "a")]}], False),
        (None, [{"matchExpressions": [expr("missing", "NotIn", "a")]}], True),  # absent label satisfies NotIn
        (None, [{"matchExpressions": [expr("zone", "Exists")]}], True),
        (None, [{"matchExpressions": [expr("missing", "Exists")]}], False),
        (None, [{"matchExpressions": [expr("missing", "DoesNotExist")]}], True),
        (None, [{"matchExpressions": [expr("zone", "DoesNotExist")]}], False),
        (None, [{"matchExpressions": [expr("cards", "Gt", "4")]}], True),  # 8 > 4
        (None, [{"matchExpressions": [expr("cards", "Gt", "8")]}], False),
        (None, [{"matchExpressions": [expr("cards", "Lt", "9")]}], True),
        (None, [{"matchExpressions": [expr("missing", "Lt", "9")]}], False),  # Gt/Lt need the label
        (None, [{"matchExpressions": [expr("zone", "Gt", "1")]}], False),  # label not an integer
        (None, [{"matchExpressions": [expr("big", "Gt", "1")]}], False),  # label beyond int64
        (None, [{"matchExpressions": [expr("padded", "Gt", "1")]}], True),  # ParseInt reads 22 digits, zeros first
        # every value must be a label value (NewRequirement): else the term fails
        (None, [{"matchExpressions": [expr("zone", "NotIn", "a b")]}], False),
        (None, [{"matchExpressions": [expr("zone", "In", "a", "a/b")]}], False),
        (None, [{"matchExpressions": [expr("cards", "Gt", "-1")]}], False),
        (None, [{"matchExpressions": [expr("zone", "NotIn", "x" * 64)]}], False),
        # AND inside a term, OR across terms
        (None, [{"matchExpressions": [expr("zone", "In", "a"), expr("gpu", "In", "v100")]}], False),
        (
            None,
            [{"matchExpressions": [expr("zone", "In", "b")]}, {"matchExpressions": [expr("gpu", "In", "a100")]}],
            True,
        ),
        # a malformed requirement fails its term only
        (None, [{"matchExpressions": [expr("zone", "In")]}], False),  # In without values
        (None, [{"matchExpressions": [expr("zone", "Exists", "a")]}], False),  # Exists with values
        (None, [{"matchExpressions": [expr("cards", "Gt", "4", "5")]}], False),  # Gt with two values
        (None, [{"matchExpressions": [expr("cards", "Gt", "x")]}], False),  # Gt with a non-integer
        (None, [{"matchExpressions": [expr("zone", "Equals", "a")]}], False),  # unknown operator
        (None, [{"matchExpressions": [expr("zone", "Bad")]}, {"matchExpressions": [expr("zone", "In", "a")]}], True),
        # matchFields: metadata.name, In/NotIn with one value
        (None, [{"matchFields": [expr("metadata.name", "In", "n1")]}], True),
        (None, [{"matchFields": [expr("metadata.name", "In", "n2")]}], False),
        (None, [{"matchFields": [expr("metadata.name", "NotIn", "n2")]}], True),
        (None, [{"matchFields": [expr("metadata.name", "In", "n1", "n2")]}], False),  # more than one value: malformed
        (None, [{"matchFields": [expr("metadata.name", "Exists")]}], False),  # unsupported operator
        (
            None,
            [{"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "n2")]}],
            False,
        ),
        # nodeSelector AND affinity
        ({"zone": "a"}, [{"matchExpressions": [expr("gpu", "In", "v100")]}], False),
        ({"zone": "b"}, [{"matchExpressions": [expr("gpu", "In", "a100")]}], False),
        ({"zone": "a"}, [{"matchExpressions": [expr("gpu", "In", "a100")]}], True),
    ],
)
def test_node_affinity(selector, terms, want) -> None:
    assert allowed(pod(selector=selector, terms=terms), node(labels=LABELS)) is want


def test_affinity_without_required_part_constrains_nothing() -> None:
    preferred = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "b")]}}
            ]
        }
    }
    rules = pod_rules(pod(affinity=preferred))
    assert rules is NO_RULES and refusal(rules, node_facts(node(labels=LABELS))) is None


def test_a_node_without_a_name_skips_field_requirements() -> None:
    term = [{"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "n2")]}]
    assert refusal(pod_rules(pod(terms=term)), NodeFacts("", LABELS)) is None


def test_messages() -> None:
    assert (
        refusal(pod_rules(pod(selector={"zone": "b"})), node_facts(node(labels=LABELS)))
        == "node does not match the pod's nodeSelector (zone=b)"
    )
    assert (
        refusal(pod_rules(pod(terms=[])), node_facts(node(labels=LABELS)))
        == "node does not match the pod's required node affinity"
    )


# -- reading -----------------------------------------------------------------------------------------


def test_node_facts_keep_only_blocking_taints() -> None:
    facts = node_facts(
        node(
            labels={"a": "b"},
            taints=[taint("x", "1", "PreferNoSchedule"), taint("y", "", "NoExecute")],
            unschedulable=True,
        )
    )
    assert facts.taints == (Taint("y", "", "NoExecute"),) and facts.unschedulable and facts.labels == {"a": "b"}


def test_pods_without_rules_share_one_value() -> None:
    assert pod_rules(pod()) is NO_RULES and pod_rules({"spec": {"tolerations": [], "nodeSelector": {}}}) is NO_RULES


@pytest.mark.parametrize(
    "obj, field",
    [
        (pod(tolerations="all"), "pod.spec.tolerations"),
        (pod(tolerations=[{"key": 7}]), "pod.spec.tolerations[0].key"),
        (pod(selector={"zone": 1}), "pod.spec.nodeSelector.zone"),
        (
            pod(terms=[{"matchExpressions": [{"key": "k", "operator": "In", "values": "a"}]}]),
            "pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0].values",
        ),
        (pod(tolerations=[{"operator": "Exists"}] * (MAX_ITEMS + 1)), "pod.spec.tolerations"),
        (pod(selector={"k": "v" * 5000}), "pod.spec.nodeSelector.k"),
    ],
)
def test_malformed_rules_name_the_field(obj, field) -> None:
    with pytest.raises(RuleError) as info:
        pod_rules(obj)
    assert info.value.field == field


def test_malformed_node_names_the_field() -> None:
    with pytest.raises(RuleError) as info:
        node_facts(node(taints=[{"key": "k", "effect": ["NoSchedule"]}]))
    assert info.value.field == "node.spec.taints[0].effect"
    with pytest.raises(RuleError):
        node_facts(node(unschedulable="yes"))
