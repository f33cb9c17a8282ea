"""The one adapter from Kubernetes objects (v1.Node, v1.Pod as JSON dicts) to the domain model.

Quantities go through :mod:`rlsched.policy.resources` (bounded: a length cap, exponents checked before
any arithmetic); a pod's request beyond what any node holds saturates at
:data:`~rlsched.policy.resources.QUANTITY_LIMIT` so the pod is unschedulable with a reason rather than an
error, while a node's is refused. Every other number read from an object (annotations) has an ASCII
grammar and a length cap too: Python's ``int()``/``float()`` accept ``"５００"``, ``"1_000"`` and
``" 500 "``, which Kubernetes does not. The GPU conventions (which resource, label and
annotation means what) come from :class:`~rlsched.extender.settings.GpuConventions` and are described
in docs/gpu-sharing.md. Every malformed field raises :class:`ObjectError` naming the field path
(``spec.containers[1].resources.requests.cpu``) so a 400 can tell the caller what to fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlsched.policy.cluster import CpuPrediction, NodeSpec, PodSpec, pod_request_problem
from rlsched.policy.resources import (
    MILLI_PER_CARD,
    QUANTITY_LIMIT,
    QuantityError,
    amount_text,
    clip,
    count,
    cpu_milli,
    memory_bytes,
)

from .names import DNS1123_SUBDOMAIN_MAX, InvalidName, check_uid
from .settings import GpuConventions

MAX_QUANTITY = QUANTITY_LIMIT
"""A node's cpu (milli), memory (bytes) or count at or above this is refused; a pod's request at or
above it reads as exactly this (more than any node holds): the arrays and kernels downstream are int64."""
MAX_CARDS_PER_NODE = 256
"""More GPU cards than this on one node is refused (the state holds a card column per slot)."""
MAX_PRICE = 1e9
"""A node price annotation above this is refused. Prices are relative (default 1, per hour in any unit):
no real node costs a billion times another, and a million nodes at this price still sum far below
float64's largest value (the encoder's mean price would otherwise overflow to inf)."""
MAX_KEY_CHARS = 64
"""Map keys longer than this are cut in error field paths (a client picks them; messages stay short)."""
_PRICE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?", re.ASCII)
_CARDS = re.compile(r"[0-9]{1,3}(?:,[0-9]{1,3})*", re.ASCII)


class ObjectError(ValueError):
    """A Kubernetes object that cannot be read; ``field`` is the JSON path of the culprit."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class PodRequestError(ValueError):
    """A well-formed pod whose GPU request makes no sense (asks whole cards and a share, …): its
    ``PodInfo.problem``. Not a protocol error: filter answers such a pending pod by marking every node
    unresolvable with the message; one bound already (by another scheduler) is counted as the whole
    cards it may hold and reported through :class:`~.rejections.Rejections` (reason ``gpu-request``).
    """


# -- small typed accessors -------------------------------------------------------------------------


def _mapping(value: Any, where: str, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise ObjectError(where, "is required")
        return {}
    if type(value) is dict:  # JSON from orjson: skip the ABC check (~120,000 calls per 5,000 pods)
        return value
    if not isinstance(value, Mapping):
        raise ObjectError(where, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(where, f"expected a list, got {type(value).__name__}")
    return value


def _str(value: Any, where: str, required: bool = False) -> str:
    if value is None:
        if required:
            raise ObjectError(where, "is required")
        return ""
    if not isinstance(value, str):
        raise ObjectError(where, f"expected a string, got {type(value).__name__}")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    m = _mapping(value, where)
    for k, v in m.items():
        if not isinstance(v, str):
            raise ObjectError(f"{where}.{_key(k)}", f"expected a string, got {type(v).__name__}")
    return dict(m)


def _key(key: Any) -> str:
    """A map key for a field path, cut to :data:`MAX_KEY_CHARS`."""
    text = key if isinstance(key, str) else clip(key)
    return text if len(text) <= MAX_KEY_CHARS else f"{text[:MAX_KEY_CHARS]}…"


def name_of(obj: Any, where: str) -> str:
    """``metadata.name`` of an object (required; at most 253 characters, as any Kubernetes name: the
    watch's DELETED events and relists read names with :func:`~.rejections.identity`, which cuts
    longer ones — a node kept under its full name would be a key no other path uses)."""
    meta = _mapping(_mapping(obj, where, True).get("metadata"), f"{where}.metadata", True)
    name = _str(meta.get("name"), f"{where}.metadata.name", True)
    if not name:
        raise ObjectError(f"{where}.metadata.name", "must not be empty")
    if len(name) > DNS1123_SUBDOMAIN_MAX:
        raise ObjectError(
            f"{where}.metadata.name", f"must be at most {DNS1123_SUBDOMAIN_MAX} characters (got {len(name)})"
        )
    return name


@dataclass(frozen=True)
class PodInfo:
    """What the extender keeps about a pod."""

    uid: str
    namespace: str
    name: str
    resource_version: str
    node_name: str
    """``spec.nodeName`` ("" while pending)."""
    phase: str
    spec: PodSpec | None
    """The request in domain terms; None when the GPU request is inconsistent (see ``problem``)."""
    problem: str
    """Why ``spec`` is None ("" otherwise)."""
    cards: tuple[int, ...] | None
    """Cards recorded by a bind (annotation), trusted only when recorded for ``node_name``."""
    scheduler_name: str
    held: PodSpec | None = None
    """When ``spec`` is None: what the pod holds at the most, once bound — its cpu and memory and a
    whole card for each card or share it asks for (None when even that cannot be read). A pod that
    another scheduler bound is running whatever its GPU request says: the cache counts this, so
    that its node's capacity is not offered twice."""
    priority: int = 0
    """``spec.priority`` (0 when absent, as kube-scheduler reads it; also when it is not a 32-bit
    integer, which the API server never stores): preempt compares it with the preemptor's."""
    nominated_node: str = ""
    """``status.nominatedNodeName`` of a pending pod ("" when absent or not a string): where
    kube-scheduler's preemption made room for it; preempt's trial counts it there."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


# -- nodes -----------------------------------------------------------------------------------------


def node_spec(node: Any, gpu: GpuConventions, where: str = "node") -> NodeSpec:
    """A :class:`NodeSpec` from a v1.Node: allocatable cpu/memory/cards, card model from labels."""
    name = name_of(node, where)
    meta = _mapping(node.get("metadata"), f"{where}.metadata")
    labels = _str_map(meta.get("labels"), f"{where}.metadata.labels")
    annotations = _str_map(meta.get("annotations"), f"{where}.metadata.annotations")
    status = _mapping(node.get("status"), f"{where}.status")
    alloc = _mapping(status.get("allocatable"), f"{where}.status.allocatable")
    if not alloc:
        alloc = _mapping(status.get("capacity"), f"{where}.status.capacity")
        base = f"{where}.status.capacity"
    else:
        base = f"{where}.status.allocatable"
    cpu = _quantity(alloc, "cpu", base, cpu_milli)
    mem = _quantity(alloc, "memory", base, memory_bytes) >> 20  # MiB, rounded down
    cards = _quantity(alloc, gpu.gpu_resource, base, count)
    if cards > MAX_CARDS_PER_NODE:
        raise ObjectError(
            f"{base}.{gpu.gpu_resource}", f"{cards} cards on one node; at most {MAX_CARDS_PER_NODE} are supported"
        )
    model = ""
    if cards > 0:
        model = next((labels[k] for k in gpu.node_model_labels if labels.get(k)), "") or "unknown"
    price = 1.0
    raw_price = annotations.get(gpu.node_price_annotation)
    if raw_price:
        price = parse_price(raw_price, f"{where}.metadata.annotations.{gpu.node_price_annotation}")
    return NodeSpec(
        name=name, cpu_milli=cpu, memory_mib=mem, gpu_count=cards, gpu_model=model, labels=labels, price=price
    )


def parse_price(text: str, where: str) -> float:
    """A node price annotation: a non-negative decimal in ASCII (``"2.5"``, ``"1e-3"``), at most
    :data:`MAX_PRICE`."""
    if len(text) > 32 or not _PRICE.fullmatch(text):
        raise ObjectError(where, f"expected a non-negative decimal number such as '2.5', got {clip(text)}")
    price = float(text)
    if not price <= MAX_PRICE:  # inf too
        raise ObjectError(where, f"{clip(text)} is too large: prices are relative, at most {MAX_PRICE:g}")
    return price


def node_addresses(node: Mapping[str, Any]) -> list[str]:
    """``status.addresses[*].address`` (for matching Prometheus ``instance`` labels)."""
    try:
        return [
            a["address"]
            for a in node.get("status", {}).get("addresses", []) or []
            if isinstance(a, Mapping) and isinstance(a.get("address"), str)
        ]
    except (AttributeError, TypeError):
        return []


# -- pods ------------------------------------------------------------------------------------------


def _container_requests(container: Any, where: str) -> Mapping[str, Any]:
    c = _mapping(container, where)
    res = _mapping(c.get("resources"), f"{where}.resources")
    requests = dict(_mapping(res.get("limits"), f"{where}.resources.limits"))
    # Requests win over limits; limits stand in for missing requests (the API server's defaulting
    # does this for stored pods; payloads built by hand may lack it).
    requests.update(_mapping(res.get("requests"), f"{where}.resources.requests"))
    return requests


def _quantity(req: Mapping[str, Any], key: str, where: str, fn: Callable[..., int], saturate: bool = False) -> int:
    """``fn(req[key])`` (0 when absent); a bad quantity is an ObjectError naming ``where.key``.

    Negative or malformed quantities are errors; one at or above :data:`MAX_QUANTITY` is an error too,
    unless ``saturate`` (a pod's request), where it reads as :data:`MAX_QUANTITY`.
    """
    if key not in req:
        return 0
    try:
        return fn(req[key], saturate=saturate)
    except QuantityError as exc:
        raise ObjectError(f"{where}.{key}", str(exc)) from None


def _pod_totals(spec: Mapping[str, Any], keys: tuple[str, ...], where: str) -> dict[str, int]:
    """Effective pod request per resource, as kube-scheduler computes it.

    ``max(Σ containers + Σ sidecars, max over init containers of (init + sidecars started before))``
    plus ``spec.overhead``; ``spec.resources`` (pod-level resources) replaces cpu/memory when set.
    Quantities here are integers: millicores for cpu, bytes for memory, counts/milli for the rest.
    """
    convert: dict[str, Callable[..., int]] = {"cpu": cpu_milli, "memory": memory_bytes}

    def req_of(container: Any, w: str) -> dict[str, int]:
        r = _container_requests(container, w)
        return {k: _quantity(r, k, f"{w}.resources.requests", convert.get(k, count), saturate=True) for k in keys}

    total = dict.fromkeys(keys, 0)
    for i, c in enumerate(_list(spec.get("containers"), f"{where}.containers")):
        for k, v in req_of(c, f"{where}.containers[{i}]").items():
            total[k] += v
    sidecars = dict.fromkeys(keys, 0)
    init_peak = dict.fromkeys(keys, 0)
    for i, c in enumerate(_list(spec.get("initContainers"), f"{where}.initContainers")):
        w = f"{where}.initContainers[{i}]"
        r = req_of(c, w)
        if _mapping(c, w).get("restartPolicy") == "Always":
            for k, v in r.items():
                sidecars[k] += v
                init_peak[k] = max(init_peak[k], sidecars[k])
        else:
            for k, v in r.items():
                init_peak[k] = max(init_peak[k], v + sidecars[k])
    out = {k: max(total[k] + sidecars[k], init_peak[k]) for k in keys}
    pod_level = _mapping(
        _mapping(spec.get("resources"), f"{where}.resources").get("requests"), f"{where}.resources.requests"
    )
    for k in ("cpu", "memory"):
        if k in keys and k in pod_level:
            out[k] = _quantity(pod_level, k, f"{where}.resources.requests", convert[k], saturate=True)
    overhead = _mapping(spec.get("overhead"), f"{where}.overhead")
    for k in ("cpu", "memory"):
        if k in keys and k in overhead:
            out[k] += _quantity(overhead, k, f"{where}.overhead", convert[k], saturate=True)
    # Sums of saturated requests stay saturated (and within int64 downstream).
    return {k: min(v, MAX_QUANTITY) for k, v in out.items()}


def _cpu_prediction(spec: Mapping[str, Any], where: str) -> CpuPrediction:
    """What Trimaran's TargetLoadPacking predicts the pod's cpu from (``PredictUtilisation``): per
    container of ``spec.containers`` (init containers are not counted) its cpu limit if it sets one,
    else its cpu request if it sets one, else nothing (the default); plus ``spec.overhead``'s cpu.
    Read from each container's own limits and requests, not :func:`_container_requests`' merge; the
    objects around them were checked by :func:`_pod_totals` already (called first)."""
    limits = 0
    requests: list[int] = []
    unset = 0
    for i, c in enumerate(spec.get("containers") or ()):
        res = c.get("resources") or {}
        for kind in ("limits", "requests"):
            values = res.get(kind)
            if values and "cpu" in values:
                w = f"{where}.containers[{i}].resources.{kind}"
                amount = _quantity(values, "cpu", w, cpu_milli, saturate=True)
                if kind == "limits":
                    limits += amount
                else:
                    requests.append(amount)
                break
        else:
            unset += 1
    overhead = spec.get("overhead")
    if overhead and "cpu" in overhead:
        limits += _quantity(overhead, "cpu", f"{where}.overhead", cpu_milli, saturate=True)
    return CpuPrediction(min(limits, MAX_QUANTITY), tuple(requests), unset)


def _pod_uid(meta: Mapping[str, Any], where: str) -> str:
    """``metadata.uid`` of a pod: required, and a UID bind would take (:func:`~.names.check_uid`).

    A pod is known by its UID everywhere: the cache's entries, the watch's DELETED events and a
    relist's list of pods still there read it with :func:`~.rejections.identity`, which has no
    fallback. A stand-in key ("namespace/name") for a pod without one would be a key no other path
    uses: its DELETED event would leave it holding its cards until the next relist, and a relist that
    still has it would drop it while it runs. A real API server always sets one, so such a pod is
    refused as unreadable (logged once, counted) like any other malformed object; the length cap
    keeps identity()'s cut of long strings from ever giving another key than this one."""
    uid = _str(meta.get("uid"), f"{where}.metadata.uid", True)
    try:
        check_uid(uid, f"{where}.metadata.uid")
    except InvalidName as exc:
        raise ObjectError(exc.field, exc.message) from None
    return uid


def pod_info(pod: Any, gpu: GpuConventions, where: str = "Pod") -> PodInfo:
    """Read a v1.Pod. Raises ObjectError for malformed fields; GPU-request conflicts land in ``problem``."""
    pod = _mapping(pod, where, True)
    meta = _mapping(pod.get("metadata"), f"{where}.metadata", True)
    name = _str(meta.get("name"), f"{where}.metadata.name", True)
    namespace = _str(meta.get("namespace"), f"{where}.metadata.namespace") or "default"
    rv = _str(meta.get("resourceVersion"), f"{where}.metadata.resourceVersion")
    annotations = _str_map(meta.get("annotations"), f"{where}.metadata.annotations")
    spec = _mapping(pod.get("spec"), f"{where}.spec")
    status = _mapping(pod.get("status"), f"{where}.status")
    node_name = _str(spec.get("nodeName"), f"{where}.spec.nodeName")
    phase = _str(status.get("phase"), f"{where}.status.phase")
    scheduler = _str(spec.get("schedulerName"), f"{where}.spec.schedulerName") or "default-scheduler"
    totals = _pod_totals(spec, ("cpu", "memory", gpu.gpu_resource, gpu.gpu_milli_resource), f"{where}.spec")
    num_gpu = totals[gpu.gpu_resource]
    milli_res = totals[gpu.gpu_milli_resource]
    raw = annotations.get(gpu.gpu_milli_annotation, "")
    milli_ann = 0
    problem = ""
    if raw:
        # One grammar with the resource form: a whole-number Kubernetes quantity, ASCII, no spaces.
        try:
            milli_ann = count(raw, saturate=True)
        except QuantityError:
            problem = (
                f"annotation {gpu.gpu_milli_annotation}={clip(raw)} is not an integer number of milli "
                f"(1..{MILLI_PER_CARD}; read like the {gpu.gpu_milli_resource} resource, e.g. '500')"
            )
    models_raw = annotations.get(gpu.gpu_models_annotation, "")
    models = tuple(sorted({m.strip() for m in models_raw.replace(",", "|").split("|") if m.strip()}))
    share = milli_res or milli_ann
    if not problem and milli_res and milli_ann and milli_res != milli_ann:
        problem = (
            f"{gpu.gpu_milli_resource} is {milli_res} in resources but {milli_ann} in the annotation; set one of them"
        )
    if not problem and share and num_gpu:
        problem = (
            f"pod asks for {num_gpu} whole card(s) ({gpu.gpu_resource}) and a share of {share} milli "
            f"({gpu.gpu_milli_resource}); ask whole cards with {gpu.gpu_resource} or a share of one card "
            f"with {gpu.gpu_milli_resource}, not both"
        )
    if not problem and share and not 0 < share <= MILLI_PER_CARD:
        problem = f"{gpu.gpu_milli_resource} must be 1..{MILLI_PER_CARD} milli of one card, got {amount_text(share)}"
    cpu = totals["cpu"]
    mem = -(-totals["memory"] // (1 << 20))
    if share and not problem:
        n, m = 1, share
    else:
        n, m = num_gpu, (MILLI_PER_CARD if num_gpu else 0)
    pod_spec = None
    if not problem:
        why = pod_request_problem(cpu, mem, n, m)
        if why:
            problem = why
        else:
            pod_spec = PodSpec(
                name=f"{namespace}/{name}",
                cpu_milli=cpu,
                memory_mib=mem,
                num_gpu=n,
                gpu_milli=m,
                gpu_models=models if n else (),
                qos=qos_class(meta.get("labels"), status.get("qosClass"), gpu),
                cpu_prediction=_cpu_prediction(spec, f"{where}.spec"),
            )
    held = None
    whole = num_gpu + (1 if share else 0)
    if problem and not pod_request_problem(cpu, mem, whole, MILLI_PER_CARD if whole else 0):
        held = PodSpec(
            name=f"{namespace}/{name}",
            cpu_milli=cpu,
            memory_mib=mem,
            num_gpu=whole,
            gpu_milli=MILLI_PER_CARD if whole else 0,
            gpu_models=(),
        )
    cards = None
    if node_name and annotations.get(gpu.assigned_node_annotation) == node_name:
        cards = parse_cards(annotations.get(gpu.cards_annotation, ""))
    return PodInfo(
        uid=_pod_uid(meta, where),  # last: a malformed spec is the error to report first
        namespace=namespace,
        name=name,
        resource_version=rv,
        node_name=node_name,
        phase=phase,
        spec=pod_spec,
        problem=problem,
        cards=cards,
        scheduler_name=scheduler,
        held=held,
        priority=_priority(spec.get("priority")),
        nominated_node=_nominated_node(status.get("nominatedNodeName")) if not node_name else "",
    )


def _priority(value: Any) -> int:
    """``spec.priority`` leniently: these two fields only refine preempt's trial, and a pod must not
    become unreadable for them (kube-apiserver stores an int32 or nothing)."""
    return value if type(value) is int and -(2**31) <= value < 2**31 else 0


def _nominated_node(value: Any) -> str:
    """``status.nominatedNodeName`` leniently (see :func:`_priority`); a name longer than any node's
    reads as none."""
    return value if type(value) is str and len(value) <= DNS1123_SUBDOMAIN_MAX else ""


KOORDINATOR_LATENCY_SENSITIVE = frozenset({"LSE", "LSR", "LS"})
"""Koordinator's latency-sensitive QoS classes (koordinator.sh/qosClass)."""


def qos_class(labels: Any, kubernetes_qos: Any, gpu: GpuConventions) -> str:
    """A pod's QoS class in the policy's terms (``PodSpec.qos``: ``LS`` latency-sensitive, ``BE``, or
    Kubernetes' ``Guaranteed`` / ``Burstable`` / ``BestEffort``; ``""`` unknown), first match wins:
    the latency-sensitive label (``"true"`` or not), the QoS label (Koordinator's classes), then
    ``status.qosClass``. Only those two labels are read, and a value that is not a string counts as
    absent: the class never makes a pod unreadable (most models do not read it)."""
    if isinstance(labels, Mapping):
        explicit = labels.get(gpu.latency_sensitive_label)
        if isinstance(explicit, str):
            return "LS" if explicit == "true" else "BE"
        label = labels.get(gpu.qos_label)
        if isinstance(label, str) and label.strip():
            return "LS" if label.strip() in KOORDINATOR_LATENCY_SENSITIVE else "BE"
    return kubernetes_qos if kubernetes_qos in ("Guaranteed", "Burstable", "BestEffort") else ""


def parse_cards(text: str) -> tuple[int, ...] | None:
    """``"0,3"`` → (0, 3); None when absent or malformed (ASCII digits, at most
    :data:`MAX_CARDS_PER_NODE` distinct card indices below it)."""
    text = text.strip(" ")
    if not text or len(text) > 4 * MAX_CARDS_PER_NODE or not _CARDS.fullmatch(text):
        return None
    cards = tuple(int(c) for c in text.split(","))
    if any(c >= MAX_CARDS_PER_NODE for c in cards) or len(set(cards)) != len(cards):
        return None
    return cards


def format_cards(cards: tuple[int, ...]) -> str:
    """(0, 3) → ``"0,3"``."""
    return ",".join(str(c) for c in cards)


def assignment_annotations(gpu: GpuConventions, node: str, cards: tuple[int, ...], milli: int) -> dict[str, str]:
    """The annotations bind writes on the pod before creating the binding."""
    return {
        gpu.cards_annotation: format_cards(cards),
        gpu.card_milli_annotation: str(milli),
        gpu.assigned_node_annotation: node,
    }


def uid_of(obj: Mapping[str, Any]) -> str:
    """``metadata.uid`` or ""."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""
