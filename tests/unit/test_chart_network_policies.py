"""The chart's NetworkPolicies (networkPolicy.enabled, on by default), one per pod:

- the scheduler pod admits the operator to the extender's status port and networkPolicy.metricsFrom to
  both that port and kube-scheduler's metrics port. A ServiceMonitor with metricsFrom empty would be a
  scrape the policy silently drops on a CNI that enforces it, so the chart refuses that combination;
- the operator pod serves nothing a peer needs (kopf's /healthz is the kubelet's probe, which
  NetworkPolicies do not govern with the usual CNIs; no admission webhook; peering goes through the API
  server): no ingress, but its optional unauthenticated /metrics (operator.metricsPort) from
  metricsFrom.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_chart_sync import find, needs_helm, render
from test_chart_value_guards import refusal

pytestmark = needs_helm

PROMETHEUS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def policies(objs: list[dict]) -> dict[str, dict]:
    """NetworkPolicies by the component they select."""
    return {
        o["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: o
        for o in objs
        if o["kind"] == "NetworkPolicy"
    }


def selects(policy: dict, objs: list[dict], component: str) -> bool:
    """Whether the policy's podSelector matches the pods of that component's Deployment."""
    labels = find(objs, "Deployment", f"-{component}")["spec"]["template"]["metadata"]["labels"]
    return policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


# -- ServiceMonitor and metricsFrom ----------------------------------------------------------------


def test_a_service_monitor_the_network_policy_would_fence_off_is_refused(tmp_path: Path) -> None:
    err = refusal(tmp_path, {"metrics": {"serviceMonitor": {"enabled": True}}})
    assert "metrics.serviceMonitor.enabled with networkPolicy.enabled and an empty networkPolicy.metricsFrom" in err
    assert "Set networkPolicy.metricsFrom" in err


@pytest.mark.parametrize(
    "network_policy",
    [{"metricsFrom": PROMETHEUS}, {"enabled": False}],
    ids=["prometheus-admitted", "no-network-policy"],
)
def test_a_service_monitor_renders_when_prometheus_can_reach_the_pod(tmp_path: Path, network_policy: dict) -> None:
    objs = render(tmp_path, {"metrics": {"serviceMonitor": {"enabled": True}}, "networkPolicy": network_policy})
    assert find(objs, "ServiceMonitor")
    scheduler = policies(objs).get("scheduler")
    if network_policy.get("enabled", True):
        assert scheduler is not None
        assert any(rule["from"] == PROMETHEUS for rule in scheduler["spec"]["ingress"])
    else:
        assert scheduler is None


# -- the operator pod ------------------------------------------------------------------------------


def test_the_operator_pod_admits_no_one_by_default(tmp_path: Path) -> None:
    objs = render(tmp_path)
    assert set(policies(objs)) == {"scheduler", "operator"}
    operator = policies(objs)["operator"]
    assert selects(operator, objs, "operator") and not selects(operator, objs, "scheduler")
    assert operator["spec"]["policyTypes"] == ["Ingress"]
    assert operator["spec"]["ingress"] == []  # kopf's /healthz (and its counters) closed to peers


def test_the_operator_metrics_port_admits_only_metrics_from(tmp_path: Path) -> None:
    values = {"operator": {"metricsPort": 9102}, "networkPolicy": {"metricsFrom": PROMETHEUS}}
    operator = policies(render(tmp_path, values))["operator"]
    assert operator["spec"]["ingress"] == [{"from": PROMETHEUS, "ports": [{"port": 9102, "protocol": "TCP"}]}]

    # A metrics port with no peers to admit: still closed (nothing is opened to everyone).
    closed = policies(render(tmp_path, {"operator": {"metricsPort": 9102}}))["operator"]
    assert closed["spec"]["ingress"] == []
    # metricsFrom without a metrics port opens nothing on the operator pod.
    no_port = policies(render(tmp_path, {"networkPolicy": {"metricsFrom": PROMETHEUS}}))["operator"]
    assert no_port["spec"]["ingress"] == []


@pytest.mark.parametrize(
    ("values", "components"),
    [
        ({"networkPolicy": {"enabled": False}}, set()),
        ({"operator": {"enabled": False}}, {"scheduler"}),
    ],
    ids=["network-policy-off", "operator-off"],
)
def test_the_operator_policy_follows_the_switches(tmp_path: Path, values: dict, components: set[str]) -> None:
    assert set(policies(render(tmp_path, values))) == components
