"""The chart's side of the rebalancer: rights only when operator.rebalancer.enabled, the admission
policy lets exactly evictions through, the operator's config carries the switch."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_chart_sync import find, needs_helm, render

pytestmark = needs_helm


def rules(objs: list[dict], kind: str) -> list[dict]:
    out: list[dict] = []
    for o in objs:
        if o["kind"] == kind and "operator" in o["metadata"]["name"]:
            out.extend(o.get("rules") or [])
    return out


def grants(rule_list: list[dict], resource: str, verb: str) -> bool:
    return any(resource in r.get("resources", []) and verb in r.get("verbs", []) for r in rule_list)


def operator_config(objs: list[dict]) -> dict:
    cm = find(objs, "ConfigMap", "-operator")
    return yaml.safe_load(cm["data"]["operator.yaml"])


def eviction_variable(objs: list[dict]) -> str:
    policy = find(objs, "ValidatingAdmissionPolicy")
    (var,) = [v for v in policy["spec"]["variables"] if v["name"] == "eviction"]
    return str(var["expression"]).strip()


def test_off_by_default_no_eviction_rights(tmp_path: Path) -> None:
    objs = render(tmp_path)
    assert not grants(rules(objs, "ClusterRole"), "pods/eviction", "create")
    assert not grants(rules(objs, "ClusterRole"), "nodes", "list")
    assert operator_config(objs)["rebalancer"] == {"enabled": False, "tickS": 5}
    assert eviction_variable(objs) == "false"


@pytest.mark.parametrize("watch", [[], ["team-a", "rlsched-system"]])
def test_on_grants_eviction_where_pods_are_watched_and_lists_cluster_wide(tmp_path: Path, watch: list[str]) -> None:
    objs = render(tmp_path, {"operator": {"rebalancer": {"enabled": True}, "watchNamespaces": watch}})
    cluster = rules(objs, "ClusterRole")
    assert grants(cluster, "nodes", "list") and grants(cluster, "pods", "list")
    if watch:
        assert not grants(cluster, "pods/eviction", "create")
        roles = [o for o in objs if o["kind"] == "Role" and grants(o["rules"], "pods", "watch")]
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(watch)
        assert all(grants(r["rules"], "pods/eviction", "create") for r in roles)
    else:
        assert grants(cluster, "pods/eviction", "create")
    assert not grants(cluster, "pods", "delete") and not grants(cluster, "poddisruptionbudgets", "get")
    assert operator_config(objs)["rebalancer"]["enabled"] is True
    assert 'request.subResource == "eviction"' in eviction_variable(objs)


def test_metrics_port(tmp_path: Path) -> None:
    assert "metricsEndpoint" not in operator_config(render(tmp_path))
    objs = render(tmp_path, {"operator": {"metricsPort": 9102}})
    assert operator_config(objs)["metricsEndpoint"] == "0.0.0.0:9102"
    deployment = find(objs, "Deployment", "-operator")
    ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "http-metrics", "containerPort": 9102, "protocol": "TCP"} in ports
