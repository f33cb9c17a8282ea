"""Kubernetes objects → domain model: nodes, pods, the GPU conventions (docs/gpu-sharing.md)."""

from __future__ import annotations

import copy

import pytest

from rlsched.extender.objects import (
    MAX_PRICE,
    MAX_QUANTITY,
    ObjectError,
    assignment_annotations,
    node_spec,
    parse_cards,
    parse_price,
    pod_info,
)
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_node, make_pod
from rlsched.policy.cluster import CpuPrediction

GPU = GpuConventions()


def test_node_spec_reads_allocatable_cards_model_and_price() -> None:
    node = make_node("g1", cpu="95500m", memory="384Gi", gpus=8, model="V100M32")
    node["metadata"]["annotations"][GPU.node_price_annotation] = "2.5"
    spec = node_spec(node, GPU)
    assert (spec.name, spec.cpu_milli, spec.memory_mib, spec.gpu_count, spec.gpu_model, spec.price) == (
        "g1",
        95500,
        384 * 1024,
        8,
        "V100M32",
        2.5,
    )


def test_node_memory_rounds_down_and_cpu_only_node_has_no_model() -> None:
    node = make_node("c1", memory=str(3 * 2**20 + 5))
    spec = node_spec(node, GPU)
    assert spec.memory_mib == 3 and spec.gpu_count == 0 and spec.gpu_model == ""


def test_node_model_from_gpu_feature_discovery_label_or_unknown() -> None:
    node = make_node("g1", gpus=2)
    del node["metadata"]["labels"][GPU.node_model_labels[0]]
    assert node_spec(node, GPU).gpu_model == "Tesla-V100M16"  # nvidia.com/gpu.product
    del node["metadata"]["labels"]["nvidia.com/gpu.product"]
    assert node_spec(node, GPU).gpu_model == "unknown"


def test_node_without_allocatable_uses_capacity() -> None:
    node = make_node("g1", gpus=4)
    del node["status"]["allocatable"]
    assert node_spec(node, GPU).gpu_count == 4


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("status", "allocatable", "cpu"), "lots", "node.status.allocatable.cpu"),
        (("status", "allocatable", "nvidia.com/gpu"), "1.5", "node.status.allocatable.nvidia.com/gpu"),
        (("metadata", "labels"), ["x"], "node.metadata.labels"),
        (
            ("metadata", "annotations", "rlsched.io/node-price"),
            "cheap",
            "node.metadata.annotations.rlsched.io/node-price",
        ),
    ],
)
def test_node_errors_name_the_field(path, value, field) -> None:
    node = make_node("g1", gpus=2)
    target = node
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ObjectError) as info:
        node_spec(node, GPU)
    assert info.value.field == field


def test_whole_card_pod() -> None:
    info = pod_info(make_pod("p", cpu="8", memory="32Gi", gpus=2, gpu_models="V100M16|V100M32", uid="u1"), GPU)
    s = info.spec
    assert (info.uid, info.key, s.cpu_milli, s.memory_mib, s.num_gpu, s.gpu_milli, s.gpu_models) == (
        "u1",
        "default/p",
        8000,
        32768,
        2,
        1000,
        ("V100M16", "V100M32"),
    )
    assert info.node_name == "" and info.cards is None and info.problem == ""


@pytest.mark.parametrize("as_resource", [True, False])
def test_share_pod_by_resource_or_annotation(as_resource) -> None:
    info = pod_info(make_pod("p", gpu_milli=250, share_as_resource=as_resource), GPU)
    assert (info.spec.num_gpu, info.spec.gpu_milli) == (1, 250)


def test_share_of_1000_is_one_whole_card() -> None:
    spec = pod_info(make_pod("p", gpu_milli=1000), GPU).spec
    assert (spec.num_gpu, spec.gpu_milli) == (1, 1000)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"gpus": 2, "gpu_milli": 500}, "not both"),
        ({"gpu_milli": 1500}, "1..1000"),
        ({"gpu_milli": 300, "annotations": {"rlsched.io/gpu-milli": "400"}}, "set one of them"),
        ({"annotations": {"rlsched.io/gpu-milli": "half"}}, "not an integer"),
    ],
)
def test_inconsistent_gpu_requests_are_problems_not_errors(kwargs, words) -> None:
    info = pod_info(make_pod("p", **kwargs), GPU)
    assert info.spec is None and words in info.problem


def test_effective_request_with_init_containers_sidecars_and_overhead() -> None:
    pod = make_pod("p", cpu="2", memory="1Gi")
    pod["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}},
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
    ]
    pod["spec"]["overhead"] = {"cpu": "100m", "memory": "64Mi"}
    spec = pod_info(pod, GPU).spec
    # cpu: max(2 + 0.5, 3) + 0.1 = 3.1 ; memory: max(1024 + 256, 512) + 64 = 1344 MiB
    assert (spec.cpu_milli, spec.memory_mib) == (3100, 1344)


def test_limits_stand_in_for_missing_requests() -> None:
    pod = make_pod("p", gpus=1)
    del pod["spec"]["containers"][0]["resources"]["requests"]
    spec = pod_info(pod, GPU).spec
    assert (spec.cpu_milli, spec.num_gpu) == (4000, 1)


def test_cpu_prediction_reads_each_containers_limit_or_request_as_trimaran_does() -> None:
    """TargetLoadPacking's ``PredictUtilisation`` per container of ``spec.containers``: the limit when
    set (whatever the request), else the request, else nothing (the default); init containers are not
    counted, the overhead's cpu is added."""
    pod = make_pod("p", cpu="8", memory="1Gi")  # requests = limits = 8
    pod["spec"]["containers"] += [
        {"name": "burstable", "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}},
        {"name": "request-only", "resources": {"requests": {"cpu": "300m"}}},
        {"name": "request-only-too", "resources": {"requests": {"cpu": "1"}}},
        {"name": "limit-only", "resources": {"limits": {"cpu": "250m"}}},
        {"name": "nothing", "resources": {"requests": {"memory": "1Gi"}}},
        {"name": "no-resources"},
    ]
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "30"}}}]
    pod["spec"]["overhead"] = {"cpu": "100m"}
    spec = pod_info(pod, GPU).spec
    assert spec.cpu_prediction == CpuPrediction(8000 + 2000 + 250 + 100, (300, 1000), 2)
    # the effective request stays kube-scheduler's: max(8 + 0.5 + 0.3 + 1 + 0.25, 30) + 0.1
    assert spec.cpu_milli == 30100


def test_cpu_prediction_of_a_pod_without_limits_is_its_request() -> None:
    """Guard: one container with a request and no limit (a trace pod's shape) reads as that request,
    which TargetLoadPacking predicts exactly as the simulator predicts the trace pod."""
    pod = make_pod("p", cpu="1500m")
    del pod["spec"]["containers"][0]["resources"]["limits"]
    assert pod_info(pod, GPU).spec.cpu_prediction == CpuPrediction(0, (1500,), 0)


def test_a_bad_cpu_limit_names_the_field() -> None:
    pod = make_pod("p")
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "8 cores"
    with pytest.raises(ObjectError) as info:
        pod_info(pod, GPU, "Pod")
    assert info.value.field == "Pod.spec.containers[0].resources.limits.cpu"


def test_bad_quantity_names_the_field() -> None:
    pod = make_pod("p")
    pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "16 GB"
    with pytest.raises(ObjectError) as info:
        pod_info(pod, GPU, "Pod")
    assert info.value.field == "Pod.spec.containers[0].resources.requests.memory"


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda p: p.update(metadata="x"), "Pod.metadata"),
        (lambda p: p["metadata"].pop("name"), "Pod.metadata.name"),
        (lambda p: p["spec"].update(containers={"a": 1}), "Pod.spec.containers"),
        (lambda p: p["metadata"].update(annotations={"a": 1}), "Pod.metadata.annotations.a"),
        (lambda p: p["spec"]["containers"][0].update(resources=[]), "Pod.spec.containers[0].resources"),
    ],
)
def test_malformed_pods_name_the_field(mutate, field) -> None:
    pod = make_pod("p")
    mutate(pod)
    with pytest.raises(ObjectError) as info:
        pod_info(pod, GPU, "Pod")
    assert info.value.field == field


def test_cards_trusted_only_on_the_recorded_node() -> None:
    ann = assignment_annotations(GPU, "g1", (0, 3), 1000)
    assert ann == {"rlsched.io/gpu-cards": "0,3", "rlsched.io/gpu-card-milli": "1000", "rlsched.io/gpu-node": "g1"}
    bound = make_pod("p", gpus=2, node="g1", annotations=ann)
    assert pod_info(bound, GPU).cards == (0, 3)
    elsewhere = copy.deepcopy(bound)
    elsewhere["spec"]["nodeName"] = "g2"
    assert pod_info(elsewhere, GPU).cards is None


@pytest.mark.parametrize(
    "text, cards",
    [
        ("0,3", (0, 3)),
        ("", None),
        ("1,1", None),
        ("a", None),
        ("-1", None),
        (" 2 ", (2,)),
        ("255", (255,)),
        ("256", None),
        ("1_0", None),
        ("５", None),
        ("1,,2", None),
        ("0," * 300 + "0", None),
        ("1" * 5000, None),
    ],
)
def test_parse_cards(text, cards) -> None:
    assert parse_cards(text) == cards


@pytest.mark.parametrize("key, value", [("cpu", "-1"), ("memory", "-1e5000"), ("nvidia.com/gpu", "-1e999999999")])
def test_negative_pod_quantities_name_the_field(key, value) -> None:
    pod = make_pod("p")
    pod["spec"]["containers"][0]["resources"]["requests"][key] = value
    with pytest.raises(ObjectError, match="must not be negative") as info:
        pod_info(pod, GPU, "Pod")
    assert info.value.field == f"Pod.spec.containers[0].resources.requests.{key}"
    assert len(str(info.value)) < 200


def test_overlong_pod_quantity_names_the_field_without_echoing_it() -> None:
    pod = make_pod("p")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1" * 5000
    with pytest.raises(ObjectError, match="longer than 64 characters") as info:
        pod_info(pod, GPU, "Pod")
    assert info.value.field == "Pod.spec.containers[0].resources.requests.cpu" and len(str(info.value)) < 200


@pytest.mark.parametrize("value", ["1e30", "1e999999", "1e400000", "1e999999999", "16384Ei"])
def test_pod_requests_beyond_any_node_saturate(value) -> None:
    """kube-apiserver stores cpu: "1e999999"; the pod is unschedulable, not an error."""
    pod = make_pod("p", gpus=1)
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    requests.update(cpu=value, memory=value)
    pod["spec"]["initContainers"] = [
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": value}}}
    ]
    pod["spec"]["overhead"] = {"cpu": value, "memory": value}
    spec = pod_info(pod, GPU, "Pod").spec
    assert (spec.cpu_milli, spec.memory_mib) == (MAX_QUANTITY, MAX_QUANTITY >> 20)
    requests.update({GPU.gpu_resource: value, "cpu": "1"})
    spec = pod_info(pod, GPU, "Pod").spec
    assert spec.num_gpu == MAX_QUANTITY and spec.gpu_milli == 1000


def test_out_of_range_nodes() -> None:
    with pytest.raises(ObjectError, match="at most 256"):
        node_spec(make_node("n", gpus=100000), GPU)
    for value in ("1e30", "1e999999", "1e999999999"):
        with pytest.raises(ObjectError, match="unreasonably large") as info:
            node_spec(make_node("n", cpu=value), GPU)
        assert info.value.field == "node.status.allocatable.cpu" and len(str(info.value)) < 200
    with pytest.raises(ObjectError, match="unreasonably large"):
        node_spec(make_node("n", memory="1e400000"), GPU)


@pytest.mark.parametrize("raw", ["５００", "1_000", " 500 ", "500 ", "0x1f4", "5e2.0", "half", "1" * 5000])
def test_gpu_milli_annotation_has_the_resource_grammar(raw) -> None:
    """What the resource form refuses, the annotation refuses (Python's int() would take most of these)."""
    info = pod_info(make_pod("p", annotations={GPU.gpu_milli_annotation: raw}), GPU)
    assert info.spec is None and "not an integer" in info.problem and len(info.problem) < 250
    pod = make_pod("p")
    pod["spec"]["containers"][0]["resources"]["requests"][GPU.gpu_milli_resource] = raw
    with pytest.raises(ObjectError):
        pod_info(pod, GPU)


@pytest.mark.parametrize("raw, milli", [("500", 500), ("5e2", 500), ("0.5k", 500), ("+250", 250)])
def test_gpu_milli_annotation_reads_like_the_resource(raw, milli) -> None:
    by_annotation = pod_info(make_pod("p", annotations={GPU.gpu_milli_annotation: raw}), GPU).spec
    pod = make_pod("p")
    pod["spec"]["containers"][0]["resources"]["requests"][GPU.gpu_milli_resource] = raw
    by_resource = pod_info(pod, GPU).spec
    assert (
        (by_annotation.num_gpu, by_annotation.gpu_milli) == (by_resource.num_gpu, by_resource.gpu_milli) == (1, milli)
    )


def test_huge_gpu_milli_is_a_problem_with_a_short_message() -> None:
    info = pod_info(make_pod("p", annotations={GPU.gpu_milli_annotation: "1e999999"}), GPU)
    assert info.spec is None and "1..1000" in info.problem and "9007199254740992" not in info.problem


@pytest.mark.parametrize("raw, price", [("2.5", 2.5), ("0", 0.0), ("1e-3", 0.001), (".5", 0.5)])
def test_node_price(raw, price) -> None:
    assert parse_price(raw, "p") == price


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "1e999", "２", "1_0", " 2 ", "0x10", "9" * 5000])
def test_node_price_rejects(raw) -> None:
    with pytest.raises(ObjectError) as info:
        parse_price(raw, "node.metadata.annotations.rlsched.io/node-price")
    assert info.value.field == "node.metadata.annotations.rlsched.io/node-price" and len(str(info.value)) < 200


@pytest.mark.parametrize("raw", ["1e9", "1000000000.0"])
def test_node_price_up_to_max_price_is_read(raw) -> None:
    assert parse_price(raw, "p") == MAX_PRICE == 1e9


@pytest.mark.parametrize("raw", ["1000000000.1", "1e10", "1e308"])
def test_node_price_above_max_price_refuses_the_node(raw) -> None:
    """Two nodes at 1e308 would sum to inf in the encoder's mean price: such a price is refused."""
    node = make_node("g1", gpus=8)
    node["metadata"]["annotations"][GPU.node_price_annotation] = raw
    with pytest.raises(ObjectError) as info:
        node_spec(node, GPU)
    assert info.value.field == "node.metadata.annotations.rlsched.io/node-price"
    assert raw in str(info.value) and "1e+09" in str(info.value)


def test_long_map_keys_are_cut_in_field_paths() -> None:
    pod = make_pod("p")
    pod["metadata"]["annotations"]["k" * 5000] = 1
    with pytest.raises(ObjectError) as info:
        pod_info(pod, GPU, "Pod")
    assert info.value.field.startswith("Pod.metadata.annotations.kkk") and len(str(info.value)) < 200


@pytest.mark.parametrize(
    "explicit, label, kubernetes_qos, expected",
    [
        ("true", "BE", "BestEffort", "LS"),  # the rlsched label wins
        ("false", "LS", "Guaranteed", "BE"),
        ("yes", "", "", "BE"),  # only "true" says latency-sensitive
        (None, "LS", "", "LS"),
        (None, "LSR", "Burstable", "LS"),  # the label wins
        (None, "LSE", "", "LS"),
        (None, "BE", "Guaranteed", "BE"),
        (None, "SYSTEM", "", "BE"),  # a class that is not latency-sensitive
        (None, "", "Guaranteed", "Guaranteed"),
        (None, "", "Burstable", "Burstable"),
        (None, "", "BestEffort", "BestEffort"),
        (None, "", "", ""),
        (None, "", "Gold", ""),  # not a Kubernetes class: unknown
    ],
)
def test_qos_class_from_the_labels_or_kubernetes(
    explicit: str | None, label: str, kubernetes_qos: str, expected: str
) -> None:
    from rlsched.extender.objects import qos_class
    from rlsched.policy.cluster import LATENCY_SENSITIVE

    labels = {GPU.qos_label: label} if label else {}
    if explicit is not None:
        labels[GPU.latency_sensitive_label] = explicit
    assert qos_class(labels, kubernetes_qos, GPU) == expected
    pod = make_pod("p", cpu="1", memory="1Gi")
    pod["metadata"]["labels"] = labels
    pod.setdefault("status", {}).pop("qosClass", None)
    if kubernetes_qos:
        pod["status"]["qosClass"] = kubernetes_qos
    spec = pod_info(pod, GPU).spec
    assert spec is not None and spec.qos == expected
    assert (spec.qos in LATENCY_SENSITIVE) is (expected in ("LS", "Guaranteed"))


@pytest.mark.parametrize(
    "labels, kubernetes_qos",
    [
        ({GPU.latency_sensitive_label: True, GPU.qos_label: ["LS"], "other": 3}, {"class": "Guaranteed"}),
        ("not a map", 7),
        (None, None),
    ],
)
def test_malformed_qos_labels_or_class_count_as_unknown(labels, kubernetes_qos) -> None:
    """The class is read from two labels and status.qosClass only; anything malformed there is unknown,
    and the pod stays readable (most models never read the class)."""
    pod = make_pod("p")
    pod["metadata"]["labels"] = labels
    pod["status"]["qosClass"] = kubernetes_qos
    spec = pod_info(pod, GPU).spec
    assert spec is not None and spec.qos == "" and spec.cpu_milli == 4000
