"""Settings (YAML, environment, flags), the policy file, the scheduler configuration, the CLI."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from rlsched.cli import main as rlsched_main
from rlsched.extender.scheduler_config import render, scheduler_config
from rlsched.extender.settings import (
    AuthSettings,
    ConfigError,
    ExtenderSettings,
    PolicySettings,
    ServerSettings,
    TlsSettings,
    check_complete,
    env_overrides,
    load_policy_file,
    load_settings,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def keep_root_logger(monkeypatch):
    """The CLI configures the root logger and the BLAS thread pools; leave both alone for the tests
    that follow."""
    import rlsched.extender.server

    monkeypatch.setattr(rlsched.extender.server, "limit_native_threads", lambda: None)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_defaults_are_safe() -> None:
    s = ExtenderSettings()
    assert s.server.host == "127.0.0.1"  # no caller authentication: loopback
    assert s.policy.mode == "active" and s.policy.fallback == "fgd" and s.policy.top_k == 1


def test_yaml_env_and_overrides_in_order(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "server:\n  port: 9000\n  statusPort: 9001\npolicy:\n  mode: shadow\n  fallback: BestFit\n"
        "prometheus:\n  url: http://prom:9090\n  queries:\n    cpu: up\n"
    )
    s = load_settings(
        cfg,
        {"RLSCHED_SERVER_PORT": "9100", "RLSCHED_POLICY_TOP_K": "3", "RLSCHED_OTHER": "x"},
        {"server.statusPort": 9200, "policy.mode": None},
    )
    assert (s.server.port, s.server.status_port, s.policy.mode, s.policy.top_k) == (9100, 9200, "shadow", 3)
    assert s.prometheus.queries == {"cpu": "up"} and s.prometheus.url == "http://prom:9090"


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "server:\n  prot: 1\n",
            "unknown setting 'server.prot'; valid keys under server: bodyTimeoutS, headerTimeoutS, host",
        ),
        ("sever: {}\n", "unknown setting 'sever'"),
        ("server:\n  port: eighty\n", "server.port: expected an integer"),
        ("server:\n  port: 70000\n", "is not a TCP port"),
        ("policy:\n  mode: sometimes\n", "mode: 'sometimes' is not one of active, shadow, off"),
        ("policy:\n  fallback: magic\n", "fallback: unknown policy 'magic'"),
        ("prometheus:\n  queries:\n    gpu: up\n", "unknown load column"),
        ("- a\n", "expected a mapping at the top"),
        ("server: [\n", "not valid YAML"),
        ("server:\n  headerTimeoutS: .inf\n", "server.headerTimeoutS: must be above 0 and at most 60 s"),
        ("server:\n  shutdownTimeoutS: 1e308\n", "server.shutdownTimeoutS: must be above 0 and at most 300 s"),
        ("server:\n  bodyTimeoutS: .nan\n", "server.bodyTimeoutS: must be above 0"),
        ("server:\n  maxConnections: 100000000\n", "server.maxConnections: must be 1..65536"),
        ("auth:\n  cacheTtlS: .inf\n", "auth.cacheTtlS: must be 0 or more and at most 3600 s"),
        ("auth:\n  reviewTimeoutS: .inf\n", "auth.reviewTimeoutS: must be above 0 and at most 60 s"),
        ("decisionRingSize: 1000000000\n", "decisionRingSize: must be 1..1000000"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, words) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert words in str(info.value) and str(cfg) in str(info.value)


@pytest.mark.parametrize(
    "key",
    [
        "server.statusTls.certFile",
        "server.statusTls.keyFile",
        "server.tls.certFile",
        "server.tls.keyFile",
        "server.tls.clientCaFile",
        "kubernetes.kubeconfig",
        "policy.modelPath",
        "policy.typicalPodsPath",
        "policyFile",
    ],
)
def test_a_nul_character_in_a_file_path_is_refused_naming_the_setting(tmp_path, key) -> None:
    """open() and os.stat() raise ValueError on a NUL, which no "cannot read" handler catches: refused
    while the settings load, never a traceback at start-up (or later, at a reload)."""
    data: dict = {}
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = "/etc/tls/a\0b.crt"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))  # a YAML "\0" escape
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: contains a NUL character"):
        load_settings(cfg)


def test_env_names_cover_every_setting() -> None:
    env = env_overrides(
        {
            "RLSCHED_SERVER_STATUS_PORT": "1",
            "RLSCHED_POLICY_FILE": "/p",
            "RLSCHED_KUBERNETES_KUBECONFIG": "/k",
            "RLSCHED_PROMETHEUS_NODE_LABELS": "a,b",
            "RLSCHED_STRICT_MODEL": "false",
        }
    )
    assert env == {
        "server.statusPort": "1",
        "policyFile": "/p",
        "kubernetes.kubeconfig": "/k",
        "prometheus.nodeLabels": "a,b",
        "strictModel": "false",
    }
    s = load_settings(None, {"RLSCHED_PROMETHEUS_NODE_LABELS": "a,b", "RLSCHED_STRICT_MODEL": "false"})
    assert s.prometheus.node_labels == ("a", "b") and s.strict_model is False


def test_policy_file(tmp_path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("mode: shadow\nmodelPath: /models/m.npz\nfallback: gpupacking\ndeadlineMs: 20\ntopK: 0\n")
    s = load_policy_file(p, PolicySettings())
    assert (s.mode, s.model_path, s.fallback, s.deadline_ms, s.top_k) == (
        "shadow",
        "/models/m.npz",
        "gpupacking",
        20.0,
        0,
    )
    p.write_text("mode: shadow\nmodel: x\n")
    with pytest.raises(ConfigError, match="unknown setting 'model'"):
        load_policy_file(p, PolicySettings())


def billion_laughs(levels: int) -> str:
    lines = ["x0: &a0 [ha, ha, ha, ha, ha, ha, ha, ha, ha]"]
    for i in range(1, levels):
        lines.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"deadlineMs: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_a_policy_file_with_aliases_is_refused_at_once_and_briefly(tmp_path) -> None:
    """Nine nested anchors in a few hundred bytes expanded into a 2.3 GB error message (40 s on the
    event loop). Aliases are refused while reading, and error messages show values cut short."""
    p = tmp_path / "policy.yaml"
    p.write_text(billion_laughs(9))
    assert p.stat().st_size < 1024
    with pytest.raises(ConfigError, match="aliases") as err:
        load_policy_file(p, PolicySettings())
    assert len(str(err.value)) < 1000
    p.write_text("deadlineMs: [" + ", ".join(["1"] * 5000) + "]\n")
    with pytest.raises(ConfigError, match="deadlineMs: expected a number") as err:
        load_policy_file(p, PolicySettings())
    assert len(str(err.value)) < 200


def test_a_policy_file_too_large_is_not_read(tmp_path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("mode: active\n" + "# padding\n" * 30_000)
    with pytest.raises(ConfigError, match="larger than 256 KiB"):
        load_policy_file(p, PolicySettings())


@pytest.mark.parametrize("value", [".inf", ".nan", "1e300", "0", "-1"])
def test_a_deadline_beyond_ten_seconds_or_not_a_number_is_refused(tmp_path, value: str) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text(f"deadlineMs: {value}\n")
    with pytest.raises(ConfigError, match="deadlineMs: must be more than 0 and at most 10000"):
        load_policy_file(p, PolicySettings())


def test_committed_scheduler_config_is_the_rendered_one() -> None:
    assert (REPO / "extender" / "scheduler-config.yaml").read_text() == render()


def test_scheduler_config_shape() -> None:
    c = scheduler_config(url="http://127.0.0.1:9999/x", scheduler_name="gpu")
    ext = c["extenders"][0]
    assert (
        ext["urlPrefix"] == "http://127.0.0.1:9999/x" and ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    )
    assert {ext[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} == {
        "filter",
        "prioritize",
        "preempt",
        "bind",
    }
    assert "managedResources" not in ext  # it would keep CPU-only pods of the profile away from the policy
    assert ext["weight"] * 10 > 100 * 12  # one extender step beats every default score plugin together
    profile = c["profiles"][0]
    # kube-scheduler's adaptive window, measured against 100 in docs/benchmarks.md
    assert profile["schedulerName"] == "gpu" and profile["percentageOfNodesToScore"] == 0
    assert profile["plugins"]["score"]["disabled"] == [{"name": "*"}]
    assert profile["pluginConfig"][0]["args"]["ignoredResources"] == ["rlsched.io/gpu-milli"]
    assert c["leaderElection"]["resourceName"] == "gpu"  # not the default scheduler's lease
    assert yaml.safe_load(render())["kind"] == "KubeSchedulerConfiguration"


def test_percentage_of_nodes_to_score_is_set_in_both_places_and_bounded() -> None:
    c = scheduler_config(percentage_of_nodes_to_score=30)
    assert c["percentageOfNodesToScore"] == c["profiles"][0]["percentageOfNodesToScore"] == 30
    assert scheduler_config(percentage_of_nodes_to_score=0)["percentageOfNodesToScore"] == 0  # adaptive
    for bad in (-1, 101):
        with pytest.raises(ValueError, match="0 \\(adaptive\\) to 100"):
            scheduler_config(percentage_of_nodes_to_score=bad)


def test_cli_prints_scheduler_config_and_settings(capsys) -> None:
    assert rlsched_main(["extender", "--port", "9999", "--print-scheduler-config"]) == 0
    assert "urlPrefix: http://127.0.0.1:9999" in capsys.readouterr().out
    assert rlsched_main(["extender", "--mode", "shadow", "--print-settings"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["policy"]["mode"] == "shadow"


def test_cli_bad_config_exits_2(tmp_path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server:\n  prot: 1\n")
    assert rlsched_main(["extender", "--config", str(cfg)]) == 2
    assert "unknown setting 'server.prot'" in capsys.readouterr().err


def test_cli_bad_model_exits_2(tmp_path, capsys) -> None:
    kc = tmp_path / "kc.yaml"
    kc.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    assert (
        rlsched_main(
            ["extender", "--kubeconfig", str(kc), "--model", str(tmp_path / "missing.npz"), "--log-level", "ERROR"]
        )
        == 2
    )
    assert "missing.npz" in capsys.readouterr().err


def test_cli_unreachable_api_server_exits_1(tmp_path, capsys) -> None:
    kc = tmp_path / "kc.yaml"
    kc.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    assert (
        rlsched_main(["extender", "--kubeconfig", str(kc), "--port", "0", "--status-port", "0", "--log-level", "ERROR"])
        == 1
    )
    assert "cannot reach the API server at https://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_the_verbs_may_listen_on_loopback_without_tls(host) -> None:
    s = ExtenderSettings(server=ServerSettings(host=host))
    assert check_complete(s) is s


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.7", "scheduler.example.com"])
def test_the_verbs_leave_loopback_only_with_mutual_tls(host) -> None:
    """bind changes the cluster: off loopback, only callers with a client certificate may reach it."""
    with pytest.raises(ConfigError, match=r"server\.host: .* is not a loopback address"):
        check_complete(ExtenderSettings(server=ServerSettings(host=host)))
    tls = TlsSettings(cert_file="tls.crt", key_file="tls.key", client_ca_file="ca.crt")
    s = ExtenderSettings(server=ServerSettings(host=host, tls=tls))
    assert check_complete(s) is s


def test_the_cli_refuses_open_verbs_before_starting(capsys) -> None:
    assert rlsched_main(["extender", "--host", "0.0.0.0", "--auth", "none"]) == 2
    assert "is not a loopback address" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.7", "status.example.com"])
def test_an_open_status_listener_off_loopback_is_refused(host) -> None:
    """/status and /decisions show pod names and decision features: off loopback they need a token."""
    with pytest.raises(ConfigError, match=r"server\.statusHost: .* with auth.mode none"):
        check_complete(ExtenderSettings(server=ServerSettings(status_host=host), auth=AuthSettings(mode="none")))
    s = ExtenderSettings(server=ServerSettings(status_host=host), auth=AuthSettings(mode="kubernetes"))
    assert check_complete(s) is s
    s = ExtenderSettings(server=ServerSettings(status_host="127.0.0.1"), auth=AuthSettings(mode="none"))
    assert check_complete(s) is s
