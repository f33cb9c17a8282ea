"""spec.objective: one parser for the operator and the CLIs, and a SchedulingPolicy file as the source."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlsched.policy.dynamic.objective import ObjectiveWeights, SlaSettings
from rlsched.policy.dynamic.objective_spec import FIELDS, MAX_FILE_BYTES, Objective, parse_objective, read_objective

POLICY = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated}
---
apiVersion: rlsched.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: default, namespace: ml}
spec:
  mode: active
  objective:
    beta: 0.25
    slaWeight: 3
    strandedWeight: 0.5
    latencyScaleSeconds: 60
    slaCpuThreshold: 0.8
    slaGpuThreshold: 0.95
"""


def test_absent_or_empty_is_the_documented_defaults() -> None:
    assert parse_objective(None) == (Objective(ObjectiveWeights(), SlaSettings()), [])
    assert parse_objective({}) == (Objective(), [])
    assert Objective().to_spec() == {
        "beta": 0.5,
        "slaWeight": 1.0,
        "strandedWeight": 1.0,
        "latencyScaleSeconds": 300.0,
        "slaCpuThreshold": 0.9,
        "slaGpuThreshold": 0.9,
    }


def test_every_field_round_trips() -> None:
    spec = {"beta": 0.0, "slaWeight": 1000, "strandedWeight": 2.5, "latencyScaleSeconds": 1, "slaCpuThreshold": 1,
            "slaGpuThreshold": 0.5}  # fmt: skip
    objective, problems = parse_objective(spec)
    assert problems == []
    assert objective.weights == ObjectiveWeights(beta=0.0, sla=1000.0, stranded=2.5, latency_scale_s=1.0)
    assert objective.sla == SlaSettings(cpu_threshold=1.0, gpu_threshold=0.5)
    assert objective.to_spec() == {k: float(v) for k, v in spec.items()}


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ([0.5], "spec.objective: expected an object"),
        ({"beta": 1.5}, "spec.objective.beta: 1.5 must be a number from 0 to 1"),
        ({"beta": True}, "spec.objective.beta: True must be a number"),
        ({"beta": "0.5"}, "spec.objective.beta: '0.5' must be a number"),
        ({"slaWeight": -1}, "spec.objective.slaWeight: -1 must be a number from 0 to 1000"),
        ({"latencyScaleSeconds": 0}, "spec.objective.latencyScaleSeconds: 0 must be a number above 0"),
        ({"slaCpuThreshold": 1.01}, "spec.objective.slaCpuThreshold: 1.01 must be a number above 0 to 1"),
        ({"strandedWeight": math.nan}, "spec.objective.strandedWeight: nan must be a number"),
        ({"gamma": 1}, "spec.objective.gamma: unknown field; valid fields: beta, slaWeight"),
    ],
)
def test_a_bad_field_is_named_and_nothing_half_parsed_is_returned(raw: object, fragment: str) -> None:
    objective, problems = parse_objective(raw)
    assert len(problems) == 1 and problems[0].startswith(fragment), problems
    assert objective == Objective()


def test_every_problem_is_listed() -> None:
    _, problems = parse_objective({"beta": -1, "slaGpuThreshold": 2, 7: 1}, where="objective")
    assert [p.split(":")[0] for p in problems] == ["objective.7", "objective.beta", "objective.slaGpuThreshold"]
    assert set(FIELDS) == set(Objective().to_spec())


def test_read_from_a_scheduling_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    objective = read_objective(path)
    assert objective.weights == ObjectiveWeights(beta=0.25, sla=3.0, stranded=0.5, latency_scale_s=60.0)
    assert objective.sla == SlaSettings(cpu_threshold=0.8, gpu_threshold=0.95)
    as_json = tmp_path / "policy.json"
    as_json.write_text(json.dumps({"kind": "SchedulingPolicy", "spec": {"mode": "shadow"}}))
    assert read_objective(as_json) == Objective()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("kind: ConfigMap\n", "no SchedulingPolicy in it"),
        ("kind: SchedulingPolicy\nspec: [1]\n", "spec is not an object"),
        ("kind: SchedulingPolicy\nspec: {objective: {beta: 9}}\n", "spec.objective.beta: 9 must be"),
        ("kind: [unclosed\n", "not YAML or JSON"),
    ],
)
def test_a_bad_file_is_refused_with_its_name(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="p.yaml") as err:
        read_objective(path)
    assert fragment in str(err.value)


def test_a_missing_or_huge_file_is_refused_unread(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        read_objective(tmp_path / "absent.yaml")
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_objective(huge)
