"""Kubernetes objects every caller shares: kwok nodes with cards of one model, pods in the GPU conventions of
docs/gpu-sharing.md, and the card assignment bind writes back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .common import SCHEDULER_NAME

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI_RESOURCE = "rlsched.io/gpu-milli"
GPU_MODEL_LABEL = "rlsched.io/gpu-model"
GPU_MODELS_ANNOTATION = "rlsched.io/gpu-models"
GPU_MILLI_ANNOTATION = "rlsched.io/gpu-milli"
CARDS_ANNOTATION = "rlsched.io/gpu-cards"
CARD_MILLI_ANNOTATION = "rlsched.io/gpu-card-milli"
GPU_NODE_ANNOTATION = "rlsched.io/gpu-node"
QOS_LABEL = "koordinator.sh/qosClass"


def kwok_node(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    gpus: int = 0,
    model: str = "",
    labels: Mapping[str, str] | None = None,
    max_pods: int = 1000,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A fake node kwok keeps Ready: cpu, memory, ``nvidia.com/gpu`` cards of one model (docs/gpu-sharing.md)."""
    res = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": str(max_pods)}
    node_labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    if gpus:
        res[GPU_RESOURCE] = str(gpus)
        node_labels[GPU_MODEL_LABEL] = model
    node_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
        },
        "status": {"capacity": dict(res), "allocatable": dict(res)},
    }


def pod_manifest(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    num_gpu: int = 0,
    gpu_milli: int = 0,
    gpu_models: Sequence[str] = (),
    scheduler_name: str = SCHEDULER_NAME,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    share_as_annotation: bool = False,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A pod in our GPU conventions: ``num_gpu`` whole cards (``gpu_milli`` 1000) as ``nvidia.com/gpu``,
    a share of one card (``num_gpu`` 1, ``gpu_milli`` < 1000) as ``rlsched.io/gpu-milli`` (or the
    annotation), a model restriction as ``rlsched.io/gpu-models``."""
    # A trace pod without cpu (0) is one that asks for none: no cpu request at all, which Trimaran's
    # TargetLoadPacking predicts at its default as the simulator does ("0m" would be predicted at 0).
    res: dict[str, str] = {**({"cpu": f"{cpu_milli}m"} if cpu_milli else {}), "memory": f"{memory_mib}Mi"}
    ann = dict(annotations or {})
    if num_gpu and gpu_milli >= 1000:
        res[GPU_RESOURCE] = str(num_gpu)
    elif num_gpu:
        if share_as_annotation:
            ann[GPU_MILLI_ANNOTATION] = str(gpu_milli)
        else:
            res[GPU_MILLI_RESOURCE] = str(gpu_milli)
    if gpu_models:
        ann[GPU_MODELS_ANNOTATION] = "|".join(gpu_models)
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if namespace:
        meta["namespace"] = namespace
    if ann:
        meta["annotations"] = ann
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/job:1",
                # No cpu or memory limit: a limit is what Trimaran's TargetLoadPacking predicts a
                # container's cpu by, and the simulator's trace pods have requests only. Extended
                # resources (the GPU ones) must have a limit equal to the request.
                "resources": {
                    "requests": dict(res),
                    **({"limits": extended} if (extended := {k: v for k, v in res.items() if "/" in k}) else {}),
                },
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pod_from_spec(spec: Any, name: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """:func:`pod_manifest` for a :class:`rlsched.policy.cluster.PodSpec` (trace pods). Every pod carries
    its trace QoS class as the QoS label (``LS`` for openb's ``LS`` and ``Guaranteed``, ``BE`` for the
    rest, an empty class included), so the extender reads the class the simulator used: Kubernetes
    alone would call every replay pod Burstable (requests without cpu or memory limits)."""
    from rlsched.policy.cluster import LATENCY_SENSITIVE

    kwargs["labels"] = {**(kwargs.get("labels") or {}), QOS_LABEL: "LS" if spec.qos in LATENCY_SENSITIVE else "BE"}
    return pod_manifest(
        name or k8s_name(spec.name),
        spec.cpu_milli,
        spec.memory_mib,
        spec.num_gpu,
        spec.gpu_milli,
        spec.gpu_models,
        **kwargs,
    )


def k8s_name(name: str) -> str:
    """A DNS-1123 name for a trace name (lowercase; ``_`` → ``-``)."""
    return name.lower().replace("_", "-").replace(".", "-")


def card_assignment(pod: Mapping[str, Any]) -> tuple[str, tuple[int, ...], int] | None:
    """(node, cards, milli per card) from bind's annotations; None when the pod has none."""
    ann = pod.get("metadata", {}).get("annotations") or {}
    if CARDS_ANNOTATION not in ann:
        return None
    cards = tuple(int(c) for c in ann[CARDS_ANNOTATION].split(",") if c.strip() != "")
    return ann.get(GPU_NODE_ANNOTATION, ""), cards, int(ann.get(CARD_MILLI_ANNOTATION, "0") or 0)
