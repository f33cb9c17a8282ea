"""SchedulingPolicy: the operator's validation, and its agreement with the shipped CRD schema."""

from __future__ import annotations

import pytest

from rlsched.operator.spec import REWARD_DEFAULTS, SpecError, crd_manifest, crd_manifests, parse_spec
from rlsched.policy.dynamic.objective_spec import FIELDS
from rlsched.policy.scorers import scorer_names

SHA = "a" * 64


def schema() -> dict:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_defaults() -> None:
    ps = parse_spec({})
    assert (ps.mode, ps.fallback, ps.deadline_ms, ps.top_k, ps.model) == ("active", "fgd", 100.0, 1, None)
    assert ps.reward_weights == REWARD_DEFAULTS
    assert ps.extender_settings("/m.npz") == {
        "mode": "active",
        "modelPath": "/m.npz",
        "modelSha256": None,
        "fallback": "fgd",
        "deadlineMs": 100.0,
        "topK": 1,
    }


@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "shadow", "model": {"configMapKeyRef": {"name": "models", "key": "v3.npz"}, "sha256": SHA}},
        {"mode": "off", "fallback": "bestfit"},
        {"model": {"path": "/models/policy.npz"}, "deadlineMs": 50.5, "topK": 0, "extenderWeight": 12},
        {"model": {"url": "https://models.example.com/v4.npz"}, "rewardWeights": {"placed": -2, "evicted": 0}},
    ],
)
def test_valid(spec: dict) -> None:
    ps = parse_spec(spec)
    # what was given is what the parsed spec says; the rest keeps its default
    assert ps.mode == spec.get("mode", "active") and ps.fallback == spec.get("fallback", "fgd")
    assert ps.top_k == spec.get("topK", 1) and ps.deadline_ms == spec.get("deadlineMs", 100.0)
    assert (ps.model is None) == ("model" not in spec)
    assert ps.reward_weights == {**REWARD_DEFAULTS, **spec.get("rewardWeights", {})}


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ({"mode": "fast"}, "spec.mode: 'fast' is not one of active, shadow, off"),
        ({"mode": False}, 'write "off" in quotes'),
        ({"fallback": "FGD"}, "spec.fallback: 'FGD' is not a known heuristic"),
        ({"model": {}}, "set exactly one of spec.model.configMapKeyRef"),
        ({"model": {"path": "/a", "url": "http://b/c"}}, "(got path, url)"),
        ({"model": {"path": "relative/model.npz"}}, "must be an absolute path"),
        ({"model": {"url": "ftp://x/y"}}, "must be an http:// or https:// URL"),
        ({"model": {"configMapKeyRef": {"name": "m"}}}, "needs name and key"),
        ({"model": {"configMapKeyRef": {"name": "m", "key": "a/b"}}}, "expected a ConfigMap key"),
        ({"model": {"path": "/m", "sha256": "XYZ"}}, "spec.model.sha256: expected 64 lowercase hex digits"),
        ({"model": {"path": "/m", "sha256": "a" * 64 + "\n"}}, "spec.model.sha256: expected 64 lowercase hex digits"),
        ({"model": {"configMapKeyRef": {"name": "m", "key": "v3.npz\n"}}}, "expected a ConfigMap key"),
        ({"model": {"configMapKeyRef": {"name": "Models_V2", "key": "m"}}}, "'Models_V2' is not a ConfigMap name"),
        ({"model": {"configMapKeyRef": {"name": "models-", "key": "m"}}}, "is not a ConfigMap name"),
        ({"model": {"configMapKeyRef": {"name": "a/b", "key": "m"}}}, "is not a ConfigMap name"),
        ({"model": {"configMapKeyRef": {"name": "models\n", "key": "m"}}}, "is not a ConfigMap name"),
        ({"model": {"url": "https://models.example/v3.npz\n"}}, "must be an http:// or https:// URL"),
        ({"deadlineMs": 0}, "spec.deadlineMs: 0 must be a number from 1 to 5000"),
        ({"topK": -1}, "spec.topK: -1 must be an integer"),
        ({"extenderWeight": 0}, "spec.extenderWeight: 0 must be an integer"),
        ({"rewardWeights": {"pendingSeconds": -1}}, "it is a penalty"),
        ({"rewardWeights": {"speed": 1}}, "spec.rewardWeights.speed: unknown weight"),
        ({"modelPath": "/x"}, "spec.modelPath: unknown field"),
    ],
)
def test_invalid_names_the_field(spec: dict, fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert fragment in str(err.value)


def test_every_problem_is_reported() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"mode": "x", "topK": "many", "fallback": "nope"})
    assert len(err.value.problems) == 3


# -- the CRD agrees -------------------------------------------------------------------------------


def test_crd_fallback_enum_is_the_installed_scorers() -> None:
    enum = schema()["properties"]["spec"]["properties"]["fallback"]["enum"]
    assert enum == scorer_names(), (
        "operator/crds/schedulingpolicy.yaml lists other fallbacks than rlsched.policy.scorers.scorer_names(): "
        "update spec.fallback.enum in the CRD"
    )


def test_crd_defaults_match_the_operator() -> None:
    props = schema()["properties"]["spec"]["properties"]
    ps = parse_spec({})
    assert props["mode"]["default"] == ps.mode and props["mode"]["enum"] == ["active", "shadow", "off"]
    assert props["fallback"]["default"] == ps.fallback
    assert props["deadlineMs"]["default"] == ps.deadline_ms and props["topK"]["default"] == ps.top_k
    rewards = props["rewardWeights"]["properties"]
    assert {k: v["default"] for k, v in rewards.items()} == REWARD_DEFAULTS
    assert set(props) == {
        "mode",
        "model",
        "fallback",
        "deadlineMs",
        "topK",
        "extenderWeight",
        "rewardWeights",
        "rebalance",
        "objective",
    }
    assert set(props["model"]["properties"]) == {"configMapKeyRef", "path", "url", "sha256"}


def test_crd_objective_bounds_and_defaults_match_the_parser() -> None:
    objective = schema()["properties"]["spec"]["properties"]["objective"]["properties"]
    assert set(objective) == set(FIELDS)
    assert {k: v["default"] for k, v in objective.items()} == parse_spec({}).objective.to_spec()
    for key, (low, high, low_included) in FIELDS.items():
        prop = objective[key]
        assert (prop["minimum"], prop["maximum"], not prop.get("exclusiveMinimum", False)) == (low, high, low_included)


def test_objective_is_parsed_and_its_problems_named() -> None:
    ps = parse_spec({"objective": {"beta": 0.2, "slaCpuThreshold": 0.8}})
    assert (ps.objective.weights.beta, ps.objective.sla.cpu_threshold, ps.objective.sla.gpu_threshold) == (
        0.2,
        0.8,
        0.9,
    )
    with pytest.raises(SpecError) as err:
        parse_spec({"objective": {"beta": 2, "slaGpuThreshold": 0}, "topK": -1})
    assert len(err.value.problems) == 3
    assert any(p.startswith("spec.objective.beta: 2 must be a number from 0 to 1") for p in err.value.problems)
    assert any(p.startswith("spec.objective.slaGpuThreshold: 0 must be a number above 0") for p in err.value.problems)


def _structural(node: dict, where: str) -> list[str]:
    """Every schema node has a type (or preserves unknown fields): the API server's structural rule."""
    problems = []
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(where)
    for key, sub in (node.get("properties") or {}).items():
        problems += _structural(sub, f"{where}.{key}")
    if "items" in node:
        problems += _structural(node["items"], f"{where}[]")
    return problems


def test_crd_configmap_name_pattern_is_the_parsers() -> None:
    """A name the API server would accept but no ConfigMap can have was retried forever (NotFound)."""
    from rlsched.operator.spec import DNS1123_SUBDOMAIN

    model = schema()["properties"]["spec"]["properties"]["model"]["properties"]
    assert model["configMapKeyRef"]["properties"]["name"]["pattern"] == DNS1123_SUBDOMAIN.pattern
    ps = parse_spec({"model": {"configMapKeyRef": {"name": "models.v2-a", "key": "m"}}})
    assert ps.model is not None and ps.model.configmap == "models.v2-a"


def test_crd_is_structural_with_status_and_printer_columns() -> None:
    crd = crd_manifest()
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["group"] == "rlsched.io" and version["name"] == "v1alpha1"
    assert _structural(schema(), "") == []
    assert version["subresources"] == {"status": {}}
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Mode", "Model", "Ready", "Degraded", "Decisions"} <= columns
    assert [m["metadata"]["name"] for m in crd_manifests()] == [
        "schedulingpolicies.rlsched.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ]
    assert all(m["apiVersion"] == "apiextensions.k8s.io/v1" for m in crd_manifests())


def test_a_spec_full_of_junk_gives_a_bounded_message() -> None:
    """The problems become a condition, an event and kopf's progress annotation: values are cut, and
    only the first unknown keys are listed."""
    junk = {f"junk{i}": i for i in range(5000)}
    spec = {
        "mode": "x" * 300_000,
        "fallback": ["y"] * 10_000,
        "model": {"url": "z" * 4000, **junk},
        "rewardWeights": {**junk, "placed": "q" * 100_000},
        "objective": {**junk, "beta": "b" * 100_000},
        **junk,
    }
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    problems = err.value.problems
    assert len(problems) <= 60 and max(map(len, problems)) <= 300, max(map(len, problems))
    assert len(str(err.value)) <= 4000
    assert any(p.startswith("spec.mode: 'xxx") for p in problems)
    assert sum("unknown" in p for p in problems) <= 40


@pytest.mark.parametrize(
    "model",
    [
        None,
        {"configMapKeyRef": {"name": "m", "key": "model.npz"}},
        {"url": "https://models.example/m.npz"},
        {"path": "/models/m.npz"},
    ],
)
def test_the_policy_file_clears_the_extenders_own_model_digest(tmp_path, model) -> None:
    """modelSha256 was left out unless the model was a path with sha256; the extender merges the policy
    file over its own config, so a digest pinned there for its own model refused every model rolled out."""
    from rlsched.extender.settings import PolicySettings, load_policy_file
    from rlsched.operator.sink import policy_yaml

    ps = parse_spec({"fallback": "least-allocated", **({"model": model} if model else {})})
    f = tmp_path / "policy.yaml"
    f.write_bytes(policy_yaml(ps.extender_settings("/models/m.npz" if model else None)))
    base = PolicySettings(mode="active", fallback="least-allocated", model_sha256=SHA)
    assert load_policy_file(f, base).model_sha256 is None


def test_the_policy_file_carries_the_specs_digest(tmp_path) -> None:
    from rlsched.extender.settings import PolicySettings, load_policy_file
    from rlsched.operator.sink import policy_yaml

    digest = "b" * 64
    for model in ({"path": "/models/m.npz"}, {"configMapKeyRef": {"name": "m", "key": "model.npz"}}):
        ps = parse_spec({"fallback": "least-allocated", "model": {**model, "sha256": digest}})
        f = tmp_path / "policy.yaml"
        f.write_bytes(policy_yaml(ps.extender_settings("/models/m.npz")))
        assert load_policy_file(f, PolicySettings(model_sha256=SHA)).model_sha256 == digest
