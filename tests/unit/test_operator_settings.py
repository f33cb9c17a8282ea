"""OperatorSettings: defaults, YAML, flags, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.operator.cli import _overrides, add_arguments
from rlsched.operator.settings import SettingsError, load_settings


def test_defaults_fill_the_mount_path() -> None:
    s = load_settings()
    assert s.sink.kind == "configmap" and s.sink.mount_path == "/etc/rlsched/policy"
    assert s.scope.peering is None and s.scope.namespaces == ()


def test_yaml_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "op.yaml"
    f.write_text(
        "requeue:\n  maxAttempts: 3\nsink:\n  kind: directory\n  directory: /tmp/x\nscope:\n  namespaces: [a, b]\n"
    )
    s = load_settings(f, {"requeue.initialS": "2", "scope.peering": "rlsched"})
    assert s.requeue.max_attempts == 3 and s.requeue.initial_s == 2.0
    assert s.sink.mount_path == "/tmp/x" and s.scope.namespaces == ("a", "b") and s.scope.peering == "rlsched"


@pytest.mark.parametrize(
    "data, fragment",
    [
        ("requeue:\n  maxAtempts: 3\n", "unknown setting 'requeue.maxAtempts'; valid keys under requeue:"),
        ("requeue:\n  maxAttempts: lots\n", "requeue.maxAttempts: expected an integer"),
        ("sink:\n  kind: directory\n", "sink.directory: required"),
        ("sink:\n  kind: s3\n", "sink.kind: 's3' is not configmap or directory"),
        ("decisionLog:\n  segmentBytes: 10\n", "segmentBytes must be at least 4096"),
        ("- a\n", "expected a mapping at the top"),
        (
            "requeue:\n  annotation: example.com/requeue\n",
            "requeue.annotation: 'example.com/requeue' must start with rlsched.io/",
        ),
        ("decisionLog:\n  drainLimit: 20000\n", "decisionLog.drainLimit: must be 1..10000"),
        ("decisionLog:\n  drainLimit: 0\n", "decisionLog.drainLimit: must be 1..10000"),
        ("decisionLog:\n  drainIntervalS: 0\n", "decisionLog.drainIntervalS: must be a positive"),
        ("decisionLog:\n  drainIntervalS: -1\n", "decisionLog.drainIntervalS: must be a positive"),
        ("decisionLog:\n  loadDelayS: -5\n", "decisionLog.loadDelayS: must be a number of seconds"),
        ("requeue:\n  sweepIntervalS: .nan\n", "requeue.sweepIntervalS: must be a positive"),
        ("requeue:\n  sweepIntervalS: 0\n", "requeue.sweepIntervalS: must be a positive"),
        ("kubernetes:\n  requestTimeoutS: .nan\n", "requestTimeoutS and outageToleranceS must be positive"),
        ("kubernetes:\n  outageToleranceS: -1\n", "requestTimeoutS and outageToleranceS must be positive"),
        ("policy:\n  name: ''\n", "policy: name and namespace must not be empty"),
        ("sink:\n  maxModelBytes: -1\n", "sink.maxModelBytes: must be positive"),
        ("logLevel: VERBOSE\n", "logLevel: 'VERBOSE' is not one of"),
        # a NUL in a file path: open() and os.stat() would raise ValueError on it, no handler's OSError
        *(
            (f'{section}:\n  {key}: "/etc/rlsched/a\\0b"\n', f"{section}.{key}: contains a NUL character")
            for section, key in (
                ("extender", "caFile"),
                ("extender", "tokenFile"),
                ("decisionLog", "path"),
                ("sink", "directory"),
                ("rebalancer", "typicalPodsPath"),
                ("kubernetes", "kubeconfig"),
            )
        ),
    ],
)
def test_errors_name_the_key(tmp_path: Path, data: str, fragment: str) -> None:
    f = tmp_path / "op.yaml"
    f.write_text(data)
    with pytest.raises(SettingsError) as err:
        load_settings(f)
    assert fragment in str(err.value)


def test_cli_flags_map_to_settings() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        [
            "--policy",
            "sched/main",
            "-n",
            "a",
            "-n",
            "b",
            "--sink",
            "directory",
            "--directory",
            "/d",
            "--decision-log",
            "/log",
            "--requeue-attempts",
            "4",
            "--no-requeue",
        ]
    )
    s = load_settings(None, _overrides(args))
    assert (s.policy.namespace, s.policy.name) == ("sched", "main")
    assert s.scope.namespaces == ("a", "b") and s.decision_log.path == "/log"
    assert s.requeue.max_attempts == 4 and s.requeue.enabled is False
    assert load_settings(None, _overrides(p.parse_args(["--policy", "only-name"]))).policy.name == "only-name"


@pytest.mark.parametrize(
    "annotation",
    [
        "rlsched.io/requeue attempt",
        "rlsched.io/-requeue",
        "rlsched.io/requeue-",
        "rlsched.io/" + "a" * 64,
        "rlsched.io/a/b",
        "rlsched.io/requeue\n",
        "rlsched.io/rück",
    ],
)
def test_a_requeue_annotation_that_is_not_an_annotation_key_is_refused(annotation: str) -> None:
    """Any key under rlsched.io/ was accepted; the API server then refused every requeue patch (422)."""
    with pytest.raises(SettingsError, match="requeue.annotation: .* is not a valid annotation key"):
        load_settings(None, {"requeue.annotation": annotation})


@pytest.mark.parametrize("annotation", ["rlsched.io/requeue-attempt", "rlsched.io/Requeue_2.v1", "rlsched.io/x"])
def test_valid_requeue_annotations_are_accepted(annotation: str) -> None:
    assert load_settings(None, {"requeue.annotation": annotation}).requeue.annotation == annotation


def test_the_outage_tolerance_is_bounded() -> None:
    """kopf's retry delays hold one entry per 30 s of it: a year meant a list built for half an hour."""
    assert load_settings(None, {"kubernetes.outageToleranceS": 7 * 86400}).kubernetes.outage_tolerance_s == 604800
    with pytest.raises(SettingsError, match=r"kubernetes.outageToleranceS: at most 604800 seconds \(7 days\)"):
        load_settings(None, {"kubernetes.outageToleranceS": 30 * 86400})
