"""Which running pods the rebalancer may move: the safety rules, as one pure function per pod.

:func:`why_not` answers ``None`` for a pod that may be moved, else the rule that keeps it (a short
fixed word, counted in the cycle's report). The rules, in order:

- ``unreadable``: the object is not the shape of a pod (hostile input is normal input);
- ``other-scheduler``: ``spec.schedulerName`` is not ours — another scheduler would place the
  replacement, and it is not ours to move;
- ``not-watched``: its namespace is outside the operator's ``scope.namespaces`` (when set): the chart
  grants ``pods/eviction`` only in the watched namespaces, so an eviction elsewhere would be refused
  (403) every cycle — and the operator was told to stay out of them;
- ``not-running``: not bound, not ``Running``, or already terminating (``deletionTimestamp``);
- ``mirror``: a static pod's mirror (annotation ``kubernetes.io/config.mirror``): the API cannot move it;
- ``no-controller``: no owner reference with ``controller: true`` — nothing would bring it back;
- ``daemonset``: owned by a DaemonSet — its replacement lands on the same node;
- ``opted-out``: label ``rlsched.io/rebalance: "false"`` — always wins;
- ``not-opted-in``: neither label ``rlsched.io/rebalance: "true"`` nor a namespace matching the
  policy's ``namespaceSelector``;
- ``too-young``: started less than ``minPodAgeSeconds`` ago — the later of ``status.startTime`` (the
  node's clock) and ``metadata.creationTimestamp`` (the API server's): :func:`started_at`.

The owner budget (``maxMovesPerOwner``) is applied by the caller with :func:`owner_key`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .decisionlog import parse_time
from .rebalance_spec import LabelSelector

OPT_IN_LABEL = "rlsched.io/rebalance"
"""Pod label: ``"true"`` opts the pod in, ``"false"`` opts it out (whatever the namespace selector says)."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

REASONS = (
    "unreadable",
    "other-scheduler",
    "not-watched",
    "not-running",
    "mirror",
    "no-controller",
    "daemonset",
    "opted-out",
    "not-opted-in",
    "too-young",
    "owner-budget",
    "recently-refused",
)
"""Every answer of :func:`why_not` (and the caller's two: the owner budget, and an eviction of the pod
refused in a recent cycle): a small fixed set for counting."""


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str_map(value: Any) -> dict[str, str]:
    return {k: v for k, v in _map(value).items() if isinstance(k, str) and isinstance(v, str)}


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with ``controller: true`` (at most one by the API's rules), or None."""
    refs = _map(pod.get("metadata")).get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs[:64]:
        if isinstance(ref, Mapping) and ref.get("controller") is True and isinstance(ref.get("uid"), str):
            return ref
    return None


def owner_key(pod: Mapping[str, Any]) -> str:
    """``namespace/Kind/name`` of the pod's controller ("" without one): what the owner budget counts."""
    ref = controller_of(pod)
    if ref is None:
        return ""
    ns = _map(pod.get("metadata")).get("namespace") or "default"
    return f"{ns}/{str(ref.get('kind'))[:63]}/{str(ref.get('name'))[:253]}"


def started_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod started (epoch seconds): the later of ``status.startTime`` and
    ``metadata.creationTimestamp``, whichever it has; None with neither.

    The kubelet stamps ``startTime`` with its node's clock, the API server ``creationTimestamp`` with
    its own. A pod starts after it is created, so on a node whose clock runs behind, the creation is
    the better date: taking ``startTime`` alone, a node 15 minutes behind made a pod created a minute
    ago look 16 minutes old, past ``minPodAgeSeconds``. A node ahead makes a pod look younger: it
    waits longer, the safe side."""
    times = [
        t
        for t in (
            parse_time(_map(pod.get("status")).get("startTime")),
            parse_time(_map(pod.get("metadata")).get("creationTimestamp")),
        )
        if t is not None
    ]
    return max(times) if times else None


def why_not(
    pod: Any,
    scheduler_name: str,
    namespace_opted_in: Callable[[str], bool],
    min_age_s: float,
    now: float,
    watched: Callable[[str], bool],
) -> str | None:
    """None when the pod may be moved, else the rule that keeps it (module docstring). ``watched``:
    whether a namespace is in the operator's scope (:func:`namespace_watched`)."""
    if not isinstance(pod, Mapping):
        return "unreadable"
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not (isinstance(name, str) and name and isinstance(namespace, str) and namespace and isinstance(uid, str)):
        return "unreadable"
    if spec.get("schedulerName") != scheduler_name:
        return "other-scheduler"
    if not watched(namespace):
        return "not-watched"
    if not spec.get("nodeName") or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
        return "not-running"
    annotations = _str_map(meta.get("annotations"))
    if MIRROR_ANNOTATION in annotations:
        return "mirror"
    controller = controller_of(pod)
    if controller is None:
        return "no-controller"
    if controller.get("kind") == "DaemonSet":
        return "daemonset"
    label = _str_map(meta.get("labels")).get(OPT_IN_LABEL)
    if label == "false":
        return "opted-out"
    if label != "true" and not namespace_opted_in(namespace):
        return "not-opted-in"
    start = started_at(pod)
    if start is None or now - start < min_age_s:
        return "too-young"
    return None


def namespace_watched(patterns: Iterable[str]) -> Callable[[str], bool]:
    """Whether a namespace is in the operator's scope: ``scope.namespaces``, the namespaces (or kopf
    patterns) the operator watches; empty: every namespace. Read as kopf reads them
    (:func:`_kopf_match`), so the rebalancer works where the operator does and nowhere else."""
    patterns = tuple(patterns)
    if not patterns:
        return lambda _ns: True
    cache: dict[str, bool] = {}

    def watched(ns: str) -> bool:
        if ns not in cache:
            cache[ns] = any(_kopf_match(ns, p) for p in patterns)
        return cache[ns]

    return watched


def _kopf_match(name: str, pattern: str) -> bool:
    """kopf's namespace pattern (``kopf._cogs.structs.references.match_namespace``, private there, so
    restated): comma-separated globs, ``!`` excludes, a leading exclusion implies ``*`` first; the
    first inclusive glob matches, later inclusive globs only re-include what the first one matched."""
    globs = [g.strip() for g in pattern.split(",")]
    if not globs or globs[0].startswith("!"):
        globs.insert(0, "*")
    matches = first = fnmatch.fnmatch(name, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            matches = matches and not fnmatch.fnmatch(name, glob.lstrip("!"))
        else:
            matches = matches or (first and fnmatch.fnmatch(name, glob))
    return matches


def namespace_filter(
    selector: LabelSelector | None, namespace_labels: Mapping[str, Mapping[str, str]]
) -> Callable[[str], bool]:
    """Whether a namespace opts in through the policy's ``namespaceSelector`` (None: none does)."""
    if selector is None:
        return lambda _ns: False
    cache: dict[str, bool] = {}

    def opted_in(ns: str) -> bool:
        if ns not in cache:
            labels = namespace_labels.get(ns)
            cache[ns] = labels is not None and selector.matches(labels)
        return cache[ns]

    return opted_in


def namespace_labels(namespaces: list[Any]) -> dict[str, dict[str, str]]:
    """Name → labels of listed namespaces (unreadable entries skipped)."""
    out: dict[str, dict[str, str]] = {}
    for ns in namespaces:
        meta = _map(ns.get("metadata") if isinstance(ns, Mapping) else None)
        name = meta.get("name")
        if isinstance(name, str) and name:
            out[name] = _str_map(meta.get("labels"))
    return out
