"""The scheduler pod's kube-scheduler rights: Kubernetes' system:kube-scheduler without its Leases.

The built-in ClusterRole ``system:kube-scheduler`` (v1.37 bootstrap policy) grants get/update on every
Lease named ``kube-scheduler`` (the default scheduler's, in kube-system too), create on any Lease and
read-write on every LeaseCandidate. The scheduler pod shares its ServiceAccount with the extender,
which parses network input, so the chart ships its own ClusterRole with the other rules and keeps
leader election to the one Lease it creates (the leader-election Role).

EXPECTED is system:kube-scheduler of kubernetes v1.37.2 (plugin/pkg/auth/authorizer/rbac/
bootstrappolicy/policy.go, ``kubeSchedulerRules``, with the feature gates on by default in 1.37)
minus the three lease rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_chart_sync import ALL_ON, find, needs_helm, pod_spec, render

pytestmark = needs_helm

READ = ("get", "list", "watch")
READ_UPDATE = (*READ, "update", "patch")
EXPECTED: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    # (apiGroups, resources, verbs)
    (("", "events.k8s.io"), ("events",), ("create", "update", "patch")),
    (("",), ("nodes",), READ),
    (("",), ("pods",), (*READ, "delete")),
    (("",), ("pods/binding", "bindings"), ("create",)),
    (("",), ("pods/status",), ("patch", "update")),
    (("",), ("services", "replicationcontrollers"), READ),
    (("apps", "extensions"), ("replicasets",), READ),
    (("apps",), ("statefulsets",), READ),
    (("policy",), ("poddisruptionbudgets",), READ),
    (("",), ("persistentvolumeclaims", "persistentvolumes"), READ),
    (("authentication.k8s.io",), ("tokenreviews",), ("create",)),
    (("authorization.k8s.io",), ("subjectaccessreviews",), ("create",)),
    (("storage.k8s.io",), ("csinodes",), READ),
    (("storage.k8s.io",), ("volumeattachments",), READ),
    (("",), ("namespaces",), READ),
    (("storage.k8s.io",), ("csidrivers",), READ),
    (("storage.k8s.io",), ("csistoragecapacities",), READ),
    # DynamicResourceAllocation (GA, on)
    (("resource.k8s.io",), ("deviceclasses",), READ),
    (("resource.k8s.io",), ("resourceclaims",), READ_UPDATE),
    (("resource.k8s.io",), ("resourceclaims/status",), READ_UPDATE),
    (("",), ("pods/finalizers",), ("update",)),
    (("resource.k8s.io",), ("resourceslices",), READ),
    # DRAExtendedResource (GA in 1.37), DRADeviceTaintRules (GA in 1.37),
    # DRAResourceClaimGranularStatusAuthorization (beta, on since 1.36)
    (("resource.k8s.io",), ("resourceclaims",), ("create", "delete")),
    (("resource.k8s.io",), ("devicetaintrules",), READ),
    (("resource.k8s.io",), ("resourceclaims/binding",), ("update", "patch")),
]


def grants(rules: list[dict]) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, resourceName or '*') of each grant."""
    return {
        (g, res, v, name)
        for r in rules
        for g in r.get("apiGroups", [])
        for res in r.get("resources", [])
        for v in r["verbs"]
        for name in (r.get("resourceNames") or ["*"])
    }


def scheduler_grants(objs: list[dict]) -> dict[str, set[tuple[str, str, str, str]]]:
    """What the scheduler pod's ServiceAccount may do, per bound role ('Kind name' or 'Kind namespace/name')."""
    sa = pod_spec(objs, "scheduler")["serviceAccountName"]
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objs
        if o["kind"] in ("Role", "ClusterRole")
    }
    out: dict[str, set[tuple[str, str, str, str]]] = {}
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding") or b["subjects"][0]["name"] != sa:
            continue
        namespace = b["metadata"].get("namespace") if b["roleRef"]["kind"] == "Role" else None
        role = roles.get((b["roleRef"]["kind"], namespace, b["roleRef"]["name"]))
        key = f"{b['roleRef']['kind']} {(namespace + '/') if namespace else ''}{b['roleRef']['name']}"
        out[key] = grants(role["rules"]) if role else set()  # built-in roles: not rendered
    return out


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_the_built_in_kube_scheduler_role_is_not_bound(tmp_path: Path, values: dict | None) -> None:
    bound = scheduler_grants(render(tmp_path, values))
    assert "ClusterRole system:kube-scheduler" not in bound, sorted(bound)
    assert "ClusterRole system:volume-scheduler" in bound  # PV/PVC binding: no lease rules in it


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_the_charts_kube_scheduler_role_is_upstreams_without_leases(tmp_path: Path, values: dict | None) -> None:
    objs = render(tmp_path, values)
    role = find(objs, "ClusterRole", "-scheduler-kube-scheduler")
    expected = grants([{"apiGroups": list(g), "resources": list(r), "verbs": list(v)} for g, r, v in EXPECTED])
    assert grants(role["rules"]) == expected
    # Earlier releases bound system:kube-scheduler under "<...>-scheduler-kube-scheduler", and a
    # binding's roleRef is immutable: the same name with the new role would fail every upgrade.
    assert not [
        o
        for o in objs
        if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].endswith("-scheduler-kube-scheduler")
    ]
    binding = find(objs, "ClusterRoleBinding", "-scheduler-kube-scheduler-rules")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"][0]["name"] == pod_spec(objs, "scheduler")["serviceAccountName"]


@pytest.mark.parametrize(
    "values",
    [None, ALL_ON, {"scheduler": {"config": {"leaderElect": False}}}],
    ids=["defaults", "all-on", "no-leader-election"],
)
def test_the_scheduler_pod_can_touch_no_lease_but_its_own(tmp_path: Path, values: dict | None) -> None:
    objs = render(tmp_path, values)
    lease_grants = {key: {g for g in gs if g[0] == "coordination.k8s.io"} for key, gs in scheduler_grants(objs).items()}
    lease_grants = {k: v for k, v in lease_grants.items() if v}
    leases = [o for o in objs if o["kind"] == "Lease"]
    if not leases:  # no leader election: no lease rights at all
        assert lease_grants == {}
        return
    (lease,) = leases
    name, namespace = lease["metadata"]["name"], lease["metadata"]["namespace"]
    assert name != "kube-scheduler"
    role = find(objs, "Role", "-leader-election")
    assert role["metadata"]["namespace"] == namespace
    key = f"Role {namespace}/{role['metadata']['name']}"
    assert lease_grants == {
        key: {
            ("coordination.k8s.io", "leases", "get", name),
            ("coordination.k8s.io", "leases", "update", name),
            ("coordination.k8s.io", "leases", "create", "*"),  # create cannot be limited by name
        }
    }
