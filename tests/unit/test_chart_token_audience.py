"""The operator reads the extender's status port with a token the API server refuses.

Whoever receives a token can replay it: a compromised extender, or anyone on the pod network when the
status port speaks plain HTTP (``extender.statusTls.enabled: false``). The chart
mounts into the operator pod a projected ServiceAccount token made for ``extender.auth.audience``
(rotated by the kubelet), points the operator's ``extender.tokenFile`` at it and lists the audience in
the extender's ``auth.audiences``; the extender still accepts the API server's own audience
(Prometheus' default token). The settings files are loaded with the components' own loaders.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from test_chart_sync import ALL_ON, CHART, HELM, containers, find, needs_helm, pod_spec, render, watching

pytestmark = needs_helm


def settings(objs: list[dict], tmp_path: Path) -> tuple:
    """(extender settings, operator settings), loaded by the components' own loaders."""
    from rlsched.extender.settings import load_settings as load_extender
    from rlsched.operator.settings import load_settings as load_operator

    ext, op = tmp_path / "extender.yaml", tmp_path / "operator.yaml"
    ext.write_text(find(objs, "ConfigMap", "-config")["data"]["extender.yaml"])
    op.write_text(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    return load_extender(ext), load_operator(op, {})


def token_volume(spec: dict) -> tuple[dict | None, dict | None]:
    """(the projected serviceAccountToken source, the operator container's mount of its volume)."""
    volumes = [v for v in spec["volumes"] if "projected" in v]
    if not volumes:
        return None, None
    (volume,) = volumes
    (source,) = volume["projected"]["sources"]
    (mount,) = [m for m in containers(spec)["operator"]["volumeMounts"] if m["name"] == volume["name"]]
    return source["serviceAccountToken"], mount


@pytest.mark.parametrize(
    "values, audience",
    [
        (None, "rlsched-extender"),
        (ALL_ON, "rlsched-extender"),
        (
            {"extender": {"auth": {"audience": "https://rlsched.example.com/status"}}},
            "https://rlsched.example.com/status",
        ),
    ],
    ids=["defaults", "all-on", "custom"],
)
def test_the_operator_sends_a_token_for_the_extenders_audience(tmp_path: Path, values: dict | None, audience) -> None:
    objs = render(tmp_path, watching(values, "rlsched-system"))
    ext, op = settings(objs, tmp_path)
    assert ext.auth.audiences == (audience,) and ext.auth.api_server_audience  # Prometheus' token still works
    spec = pod_spec(objs, "operator")
    source, mount = token_volume(spec)
    assert source == {"audience": audience, "expirationSeconds": 3600, "path": "token"}
    assert mount is not None and mount["readOnly"]
    assert op.extender.token_file == f"{mount['mountPath']}/{source['path']}"
    # The ordinary token stays: the operator talks to the API server with it.
    assert spec["automountServiceAccountToken"] is True
    assert not mount["mountPath"].startswith("/var/run/secrets/kubernetes.io/serviceaccount")


def test_an_empty_audience_keeps_the_ordinary_token(tmp_path: Path) -> None:
    from rlsched.operator.settings import IN_CLUSTER_TOKEN

    objs = render(tmp_path, {"extender": {"auth": {"audience": ""}}})
    ext, op = settings(objs, tmp_path)
    assert ext.auth.audiences == () and ext.auth.api_server_audience
    assert token_volume(pod_spec(objs, "operator")) == (None, None)
    assert op.extender.token_file == IN_CLUSTER_TOKEN


def test_extender_config_audiences_keep_the_operators(tmp_path: Path) -> None:
    objs = render(tmp_path, {"extender": {"config": {"auth": {"audiences": ["other", "rlsched-extender"]}}}})
    assert settings(objs, tmp_path)[0].auth.audiences == ("other", "rlsched-extender")
    f = tmp_path / "drop.yaml"
    f.write_text(yaml.safe_dump({"extender": {"config": {"auth": {"audiences": ["other"]}}}}))
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--values", str(f)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and 'leaves out extender.auth.audience "rlsched-extender"' in done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"extender": {"auth": {"audience": "rlsched extender"}}}, "visible ASCII characters, no spaces"),
        ({"extender": {"auth": {"audience": "é"}}}, "visible ASCII characters, no spaces"),
        ({"extender": {"auth": {"audience": "a" * 257}}}, "visible ASCII characters, no spaces"),
        (
            {"extender": {"auth": {"audience": ""}, "config": {"auth": {"apiServerAudience": False}}}},
            "would refuse every token",
        ),
    ],
)
def test_settings_the_extender_would_refuse_are_refused_at_render(tmp_path: Path, values: dict, message: str) -> None:
    """What the extender refuses at start (a crash-looping scheduler pod) fails ``helm template`` instead."""
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--values", str(f)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and message in done.stderr, done.stderr[-500:]


def test_api_server_audience_off_with_the_operators_audience_renders(tmp_path: Path) -> None:
    """Guard: ``apiServerAudience: false`` is fine while the operator's audience is listed."""
    objs = render(tmp_path, {"extender": {"config": {"auth": {"apiServerAudience": False}}}})
    auth = settings(objs, tmp_path)[0].auth
    assert auth.audiences == ("rlsched-extender",) and auth.api_server_audience is False
