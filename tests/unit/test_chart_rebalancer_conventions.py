"""The operator's rebalancer reads GPUs, typical pods and node load as the extender does.

docs/operator.md: the rebalancer's ``gpu`` settings must match the extender's, its ``typicalPodsPath``
should be the extender's file, and its ``prometheus`` section takes the extender's URL and queries.
The chart copies them from the extender's values into the operator's settings, before
operator.config is merged, so that an override there still wins.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from test_chart_sync import find, needs_helm, render

pytestmark = needs_helm

GPU = {"gpuMilliResource": "example.com/gpu-milli", "cardsAnnotation": "example.com/cards"}


def settings(objs: list[dict], tmp_path: Path) -> tuple:
    """(extender settings, operator settings), loaded by the components' own loaders."""
    from rlsched.extender.settings import load_settings as load_extender
    from rlsched.operator.settings import load_settings as load_operator

    ext, op = tmp_path / "extender.yaml", tmp_path / "operator.yaml"
    ext.write_text(find(objs, "ConfigMap", "-config")["data"]["extender.yaml"])
    op.write_text(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    return load_extender(ext), load_operator(op, {})


def test_rebalancer_gets_the_extenders_gpu_conventions_typical_pods_and_prometheus(tmp_path: Path) -> None:
    values = {
        "extender": {
            "prometheusUrl": "http://prometheus:9090",
            "config": {
                "gpu": GPU,
                "policy": {"typicalPodsPath": "/opt/rlsched/typical.json"},
                "prometheus": {"queries": {"cpu": "up"}, "timeoutS": 3},
            },
        },
        "operator": {"rebalancer": {"enabled": True}},
    }
    ext, op = settings(render(tmp_path, values), tmp_path)
    assert op.rebalancer.gpu == ext.gpu
    assert op.rebalancer.gpu.cards_annotation == "example.com/cards"
    assert op.rebalancer.typical_pods_path == ext.policy.typical_pods_path == "/opt/rlsched/typical.json"
    assert op.rebalancer.prometheus == ext.prometheus
    assert op.rebalancer.prometheus.url == "http://prometheus:9090"


def test_defaults_leave_both_at_their_defaults(tmp_path: Path) -> None:
    ext, op = settings(render(tmp_path), tmp_path)
    assert op.rebalancer.gpu == ext.gpu and op.rebalancer.prometheus.url is None is ext.prometheus.url


def test_operator_config_still_wins(tmp_path: Path) -> None:
    values = {
        "extender": {"config": {"gpu": GPU}},
        "operator": {"config": {"rebalancer": {"gpu": {"cardsAnnotation": "other.example/cards"}}}},
    }
    _, op = settings(render(tmp_path, values), tmp_path)
    assert op.rebalancer.gpu.cards_annotation == "other.example/cards"
    assert op.rebalancer.gpu.gpu_milli_resource == "example.com/gpu-milli"  # the rest still mirrored


def test_a_typical_pods_file_under_the_policy_mount_is_not_copied(tmp_path: Path) -> None:
    """The policy ConfigMap is mounted in the scheduler pod only: the operator could not open it."""
    values = {"extender": {"config": {"policy": {"typicalPodsPath": "/etc/rlsched/policy/typical.json"}}}}
    objs = render(tmp_path, values)
    config = yaml.safe_load(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert "typicalPodsPath" not in config["rebalancer"]
