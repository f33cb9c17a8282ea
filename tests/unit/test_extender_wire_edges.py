"""wire.preemption_args at its edges: the per-node cap is inclusive, a JSON boolean is not a PDB
count, and a client's map key is cut in the field path of an error."""

from __future__ import annotations

import pytest

from rlsched.extender.wire import MAX_KEY_CHARS, BadRequest, preemption_args

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "p"}}


def test_exactly_5000_victims_on_one_node_are_read() -> None:
    victims = {"g0": {"Pods": [{"UID": f"v{i}"} for i in range(5_000)], "NumPDBViolations": 0}}
    args = preemption_args({"Pod": POD, "NodeNameToMetaVictims": victims})
    assert len(args.victims["g0"][0]) == 5_000


@pytest.mark.parametrize("key", ["NodeNameToMetaVictims", "NodeNameToVictims"])
def test_a_boolean_pdb_count_is_a_400(key: str) -> None:
    pods = [{"UID": "a"}] if key == "NodeNameToMetaVictims" else [{"metadata": {"uid": "a"}}]
    with pytest.raises(BadRequest) as err:
        preemption_args({"Pod": POD, key: {"g0": {"Pods": pods, "NumPDBViolations": True}}})
    assert err.value.status == 400 and err.value.field == f"{key}.g0.NumPDBViolations"


def test_a_long_node_name_is_cut_in_the_field_path() -> None:
    node = "n" * 10_000
    with pytest.raises(BadRequest) as err:
        preemption_args({"Pod": POD, "NodeNameToMetaVictims": {node: 5}})
    assert err.value.field == "NodeNameToMetaVictims." + "n" * MAX_KEY_CHARS + "…"
    assert len(str(err.value)) < 300


def test_an_empty_node_name_is_a_400_naming_its_index() -> None:
    from rlsched.extender.wire import extender_args

    with pytest.raises(BadRequest) as err:
        extender_args({"Pod": POD, "NodeNames": ["g0", ""]})
    assert err.value.status == 400 and err.value.field == "NodeNames[1]"


@pytest.mark.parametrize("field", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_an_empty_binding_field_is_required(field: str) -> None:
    from rlsched.extender.wire import binding_args

    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "g0", field: ""}
    with pytest.raises(BadRequest) as err:
        binding_args(body)
    assert err.value.field == field and "is required" in err.value.message
