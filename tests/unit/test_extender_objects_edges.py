"""objects at its edges: 256 cards on a node are read (257 refused), spec.priority is an int32
(2^31 reads as 0), and a nominatedNodeName no node can have reads as none."""

from __future__ import annotations

import pytest

from rlsched.extender.objects import ObjectError, node_spec, pod_info
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_node, make_pod

GPU = GpuConventions()


def test_a_node_of_exactly_256_cards_is_read() -> None:
    assert node_spec(make_node("g", gpus=256), GPU).gpu_count == 256
    with pytest.raises(ObjectError, match="at most 256"):
        node_spec(make_node("g", gpus=257), GPU)


@pytest.mark.parametrize(
    "priority, read", [(2**31 - 1, 2**31 - 1), (-(2**31), -(2**31)), (2**31, 0), (-(2**31) - 1, 0), (True, 0)]
)
def test_priority_is_an_int32(priority: object, read: int) -> None:
    pod = make_pod("p", uid="p")
    pod["spec"]["priority"] = priority
    assert pod_info(pod, GPU).priority == read


@pytest.mark.parametrize("name, read", [("g" * 253, "g" * 253), ("g" * 254, ""), (7, "")])
def test_a_nominated_node_name_longer_than_any_node_reads_as_none(name: object, read: str) -> None:
    pod = make_pod("p", uid="p")
    pod.setdefault("status", {})["nominatedNodeName"] = name
    assert pod_info(pod, GPU).nominated_node == read


def test_a_cpu_prediction_of_saturated_limits_stays_saturated() -> None:
    """Trimaran's prediction sums limits: two saturated ones and an overhead stay at MAX_QUANTITY
    (the int64 arrays downstream), as the request totals do."""
    from rlsched.extender.objects import MAX_QUANTITY

    pod = make_pod("p", uid="p")
    first = pod["spec"]["containers"][0]
    first["resources"]["limits"] = {"cpu": "1e30"}
    pod["spec"]["containers"].append({"name": "second", "resources": {"limits": {"cpu": "1e999999"}}})
    pod["spec"]["overhead"] = {"cpu": "1e30"}
    spec = pod_info(pod, GPU).spec
    assert spec is not None and spec.cpu_prediction.limits_milli == MAX_QUANTITY


@pytest.mark.parametrize("text", ["0" * 32 + "1", "1." + "0" * 31])
def test_a_price_longer_than_32_characters_is_refused(text: str) -> None:
    from rlsched.extender.objects import parse_price

    with pytest.raises(ObjectError, match="non-negative decimal"):
        parse_price(text, "node.metadata.annotations.price")
    assert parse_price("0" * 31 + "1", "x") == 1.0
