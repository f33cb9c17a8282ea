"""Values the chart refuses, or turns into a safe rendering, because they would install a release
that cannot work or that double-allocates GPUs:

- operator.watchNamespaces without the release namespace: the operator could not see its own
  SchedulingPolicy (it lives in the release namespace);
- extender.config keys that other objects follow from first-class values (server.port,
  server.statusPort, server.statusHost, kubernetes.schedulerName, policyFile): the scheduler's
  urlPrefix, the container port, the Service, the probes and the operator would disagree with them;
- extender.config.server.tls: the chart's KubeSchedulerConfiguration calls the loopback verbs over
  plain HTTP (enableHTTPS false), so a TLS verb listener would fail every pod of the profile;
- scheduler.config.leaderElect=false with more than one replica (or a rolling update): two schedulers
  with two extenders and two in-memory card accountings would give the same card share twice.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from test_chart_sync import CHART, HELM, find, needs_helm, render

pytestmark = needs_helm


def refusal(tmp_path: Path, values: dict, namespace: str = "sched") -> str:
    """stderr of a `helm template` that must fail."""
    f = tmp_path / f"refused-{len(list(tmp_path.iterdir()))}.yaml"
    f.write_text(yaml.safe_dump(values))
    assert HELM is not None
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--namespace", namespace, "--values", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, f"rendered although it should be refused: {values}"
    return done.stderr


# -- operator.watchNamespaces ---------------------------------------------------------------------


def test_watch_namespaces_must_hold_the_release_namespace(tmp_path: Path) -> None:
    err = refusal(tmp_path, {"operator": {"watchNamespaces": ["ml", "batch"]}})
    assert "operator.watchNamespaces" in err and 'release namespace "sched"' in err and 'add "sched"' in err


@pytest.mark.parametrize("watch", [[], ["ml", "sched"]], ids=["everywhere", "with-release-namespace"])
def test_watch_namespaces_with_the_release_namespace_render(tmp_path: Path, watch: list[str]) -> None:
    objs = render(tmp_path, {"operator": {"watchNamespaces": watch}}, namespace="sched")
    config = yaml.safe_load(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert config["scope"]["namespaces"] == watch


def test_watch_namespaces_are_not_checked_without_the_operator(tmp_path: Path) -> None:
    objs = render(tmp_path, {"operator": {"enabled": False, "watchNamespaces": ["ml"]}}, namespace="sched")
    assert not [o for o in objs if o["metadata"]["name"].endswith("-operator")]


# -- extender.config keys with a first-class value ------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"server": {"port": 9000}}, "extender.config.server.port: set extender.port instead"),
        ({"server": {"statusPort": 9001}}, "extender.config.server.statusPort: set extender.statusPort instead"),
        ({"server": {"statusHost": "127.0.0.1"}}, "extender.config.server.statusHost: set listenAddress instead"),
        (
            {"server": {"tls": {"certFile": "/t/c.pem", "keyFile": "/t/k.pem", "clientCaFile": "/t/ca.pem"}}},
            "extender.config.server.tls: the chart's kube-scheduler calls the verbs over plain HTTP",
        ),
        ({"kubernetes": {"schedulerName": "other"}}, "extender.config.kubernetes.schedulerName: set schedulerName"),
        ({"policyFile": "/etc/p.yaml"}, "extender.config.policyFile: set extender.policyMountPath instead"),
    ],
    ids=["port", "statusPort", "statusHost", "tls", "schedulerName", "policyFile"],
)
def test_extender_config_keys_with_a_first_class_value_are_refused(tmp_path: Path, config: dict, message: str) -> None:
    assert message in refusal(tmp_path, {"extender": {"config": config}})


def test_other_extender_config_keys_still_merge(tmp_path: Path) -> None:
    config = {"server": {"pathPrefix": "/rl"}, "kubernetes": {"listTimeoutS": 30}, "decisionRingSize": 8192}
    objs = render(tmp_path, {"extender": {"config": config}})
    rendered = yaml.safe_load(find(objs, "ConfigMap", "-config")["data"]["extender.yaml"])
    assert rendered["server"]["pathPrefix"] == "/rl" and rendered["decisionRingSize"] == 8192
    assert rendered["kubernetes"] == {"schedulerName": "rl-scheduler", "listTimeoutS": 30}


# -- leader election off ---------------------------------------------------------------------------


def test_no_leader_election_with_several_replicas_is_refused(tmp_path: Path) -> None:
    err = refusal(tmp_path, {"scheduler": {"replicas": 2, "config": {"leaderElect": False}}})
    assert "scheduler.replicas=2 with scheduler.config.leaderElect=false" in err


def test_no_leader_election_recreates_instead_of_rolling(tmp_path: Path) -> None:
    off = find(render(tmp_path, {"scheduler": {"config": {"leaderElect": False}}}), "Deployment", "-scheduler")
    assert off["spec"]["replicas"] == 1 and off["spec"]["strategy"] == {"type": "Recreate"}
    on = find(render(tmp_path), "Deployment", "-scheduler")  # with the Lease a surge pod only waits
    assert on["spec"]["strategy"]["type"] == "RollingUpdate"
