"""The operator's ClusterRole grants what kopf and the operator use with the chart's settings, no more:

- CRDs: list and watch (kopf's resource observer). No get: only the operator's installCrds reads one
  CRD by name, and the chart never sets it (nor grants the create/update it would also need);
- namespaces: list/watch only with operator.watchNamespaces (kopf's namespace observer scans them only
  when it does not watch the whole cluster), list only with operator.rebalancer.enabled (the
  rebalancer's namespaceSelector reads their labels). A cluster-wide operator without the rebalancer
  reads no namespace.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_chart_sync import find, grants, needs_helm, render

pytestmark = needs_helm


@pytest.mark.parametrize(
    ("values", "namespace_verbs"),
    [
        (None, set()),
        ({"operator": {"watchNamespaces": ["ml", "rlsched-system"]}}, {"list", "watch"}),
        ({"operator": {"rebalancer": {"enabled": True}}}, {"list"}),
        (
            {"operator": {"watchNamespaces": ["rlsched-system"], "rebalancer": {"enabled": True}}},
            {"list", "watch"},
        ),
    ],
    ids=["cluster-wide", "watch-namespaces", "rebalancer", "both"],
)
def test_namespaces_are_read_only_where_kopf_or_the_rebalancer_does(
    tmp_path: Path, values: dict | None, namespace_verbs: set[str]
) -> None:
    role = find(render(tmp_path, values), "ClusterRole", "-operator")
    assert {verb for what, verb in grants(role) if what == "namespaces"} == namespace_verbs


@pytest.mark.parametrize(
    "values",
    [None, {"operator": {"watchNamespaces": ["rlsched-system"], "rebalancer": {"enabled": True}}}],
    ids=["defaults", "watch-namespaces-and-rebalancer"],
)
def test_crds_are_listed_and_watched_never_read_by_name(tmp_path: Path, values: dict | None) -> None:
    objs = render(tmp_path, values)
    role = find(objs, "ClusterRole", "-operator")
    assert {verb for what, verb in grants(role) if what == "customresourcedefinitions"} == {"list", "watch"}
    # ... because the operator never installs CRDs itself in the chart (installCrds would need get).
    config = yaml.safe_load(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert not config.get("installCrds")
