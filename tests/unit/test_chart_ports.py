"""The Service and the NetworkPolicy reach the scheduler pod's ports by number, never by name.

With ``extender.nativeSidecar: true`` (the default) the extender's named port ``http-status`` is
declared on an init container. Before Kubernetes 1.32 the endpoints controller looked up a Service's
named targetPort in ``spec.containers`` only (kubernetes#127958, fixed by #127976), so on 1.29–1.31
the Service had no endpoint; some CNIs (Calico, projectcalico/calico#8885) did the same for named
ports in NetworkPolicies. Numbers from the values work everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_chart_sync import ALL_ON, containers, find, needs_helm, pod_spec, render

pytestmark = needs_helm

CUSTOM = {"extender": {"statusPort": 9101}, "scheduler": {"securePort": 10300}}
METRICS_FROM = {"networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {}}]}}


@pytest.mark.parametrize(
    "values",
    [None, ALL_ON, {**CUSTOM, **METRICS_FROM}],
    ids=["defaults", "all-on", "custom-ports"],
)
def test_service_and_network_policy_use_numeric_ports_of_the_pod(tmp_path: Path, values: dict | None) -> None:
    objs = render(tmp_path, values)
    spec = pod_spec(objs, "scheduler")
    declared = {
        p["name"]: p["containerPort"] for c in containers(spec).values() for p in c.get("ports", [])
    }  # init containers included
    assert set(declared) == {"http-status", "https-sched"}

    service = find(objs, "Service")
    targets = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert targets == declared  # the number each container declares, not its name

    policy = find(objs, "NetworkPolicy", "-scheduler")
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports and all(isinstance(p, int) for p in ports), ports
    assert set(ports) <= set(declared.values())
    if values is not None:  # metricsFrom set: both ports open to those peers
        assert set(ports) == set(declared.values())


def test_the_extender_port_lives_on_an_init_container_by_default(tmp_path: Path) -> None:
    """Why the numbers matter: in the default rendering no regular container declares http-status."""
    spec = pod_spec(render(tmp_path), "scheduler")
    regular = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
    init = {p["name"] for c in spec.get("initContainers", []) for p in c.get("ports", [])}
    assert "http-status" in init and "http-status" not in regular
