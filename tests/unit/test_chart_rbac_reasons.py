"""Every RBAC grant says why, in the YAML a cluster admin reads: each rule of a Role or ClusterRole
has its own ``#`` comment right above it, and each RoleBinding or ClusterRoleBinding a ``# Why:``
comment before its ``apiVersion``. Checked on ``helm template`` output (template ``{{/* */}}``
comments do not survive rendering, ``#`` comments do) and on manifests/02-rbac.yaml, which
hack/sync-chart.py generates from it. docs/security.md has the same reasons as a table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart_sync import ALL_ON, HELM, REPO, needs_helm, sync

RULE = re.compile(r"^(\s*)- (apiGroups|nonResourceURLs):")

EVERY_GRANT: dict[str, Any] = {
    **ALL_ON,
    "operator": {**ALL_ON["operator"], "rebalancer": {"enabled": True}},
    "metrics": {**ALL_ON["metrics"], "reader": {"serviceAccounts": [{"name": "prometheus", "namespace": "mon"}]}},
}
"""ALL_ON plus the switches that add grants: the rebalancer's rules, the metrics reader's binding."""


def unexplained(text: str) -> list[str]:
    """The RBAC grants of a YAML stream (comments kept) that carry no reason, as 'kind name: what'."""
    missing: list[str] = []
    for doc in sync.split_documents(text):
        obj = yaml.safe_load(doc) or {}
        kind, name = obj.get("kind", ""), (obj.get("metadata") or {}).get("name", "")
        lines = doc.splitlines()
        if kind in ("Role", "ClusterRole"):
            start = next(i for i, ln in enumerate(lines) if ln.startswith("rules:"))
            previous = lines[start]
            for ln in lines[start + 1 :]:
                match = RULE.match(ln)
                if match and not previous.lstrip().startswith("#"):
                    missing.append(f"{kind} {name}: the rule at {ln.strip()!r} has no comment above it")
                if ln.strip():
                    previous = ln
        elif kind in ("RoleBinding", "ClusterRoleBinding"):
            head = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("apiVersion:"))]
            if not any(ln.startswith("# Why:") for ln in head):
                missing.append(f"{kind} {name} (to {obj['roleRef']['name']}): no '# Why:' comment")
    return missing


def test_the_check_finds_a_rule_and_a_binding_without_a_reason() -> None:
    text = (REPO / "manifests" / "02-rbac.yaml").read_text()
    bare = re.sub(r"(?m)^\s*# (nodes|Why: what any kube-scheduler).*\n(#.*\n)*", "", text)
    assert sorted(m.split(":")[0] for m in unexplained(bare)) == [
        "ClusterRole rlsched-system-rl-scheduler-scheduler-extender",
        "ClusterRole rlsched-system-rl-scheduler-scheduler-kube-scheduler",
        "ClusterRoleBinding rlsched-system-rl-scheduler-scheduler-kube-scheduler-rules "
        "(to rlsched-system-rl-scheduler-scheduler-kube-scheduler)",
    ]


def test_every_grant_in_the_manifests_has_a_reason() -> None:
    assert unexplained((REPO / "manifests" / "02-rbac.yaml").read_text()) == []


@needs_helm
@pytest.mark.parametrize("values", [None, ALL_ON, EVERY_GRANT], ids=["defaults", "all-on", "every-grant"])
def test_every_grant_the_chart_renders_has_a_reason(tmp_path: Path, values: dict | None) -> None:
    assert HELM is not None
    extra: list[str] = []
    if values:
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
        extra = ["--values", str(tmp_path / "values.yaml")]
    text = sync.helm_template(HELM, *extra)
    kinds = {(yaml.safe_load(d) or {}).get("kind") for d in sync.split_documents(text)}
    assert {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} <= kinds
    assert unexplained(text) == []
    if values is EVERY_GRANT:  # the grants only these switches render are among those checked
        assert "resources: [pods/eviction]" in text and "name: prometheus" in text
