"""The wire types of ``k8s.io/kube-scheduler/extender/v1`` (v0.37.2): parsing with errors that name
the field, and nothing else.

The Go structs carry no json tags, so keys are the Go field names (``Pod``, ``NodeNames``,
``FailedAndUnresolvableNodes`` …). Go's decoder matches keys case-insensitively, so requests are read
the same way (hand-written clients following old docs send ``pod``/``nodenames``); responses are
always PascalCase. Unknown fields are ignored — newer kube-schedulers add some.

Parsing is linear in the body (whose size the app caps with ``server.maxBodyBytes``), and error messages
never echo more than a short prefix of what the client sent (a map key, a value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

MAX_KEY_CHARS = 64
MAX_VICTIMS_PER_NODE = 5_000
"""Victims one node may list in a preemption request (a kubelet runs 110 pods by default): more is
a client error, answered before the list is read, so no request can hold the event loop."""
MAX_VICTIMS = 50_000
"""Victims all nodes of one preemption request may list together."""
"""A client's map key (a node name in NodeNameToVictims) is cut to this in error field paths."""


class BadRequest(Exception):
    """A request the extender cannot use: HTTP 400 (or ``status``) with a message naming ``field``."""

    def __init__(self, field: str, message: str, status: int = 400):
        self.field, self.message, self.status = field, message, status
        super().__init__(f"{field}: {message}" if field else message)


def loads(body: bytes) -> Any:
    """Parse a request body; BadRequest for anything but JSON."""
    if not body:
        raise BadRequest("body", "is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest("body", f"not valid JSON: {exc}") from None


def _fields(obj: Any, what: str) -> dict[str, Any]:
    """Lower-cased keys → values of a JSON object (Go's case-insensitive matching)."""
    if not isinstance(obj, dict):
        raise BadRequest(
            "body" if what == "body" else what,
            f"expected a JSON object ({what if what != 'body' else 'the arguments'}), got {_type(obj)}",
        )
    if len(obj) <= 8:
        return {k.lower(): v for k, v in obj.items()}
    return {k.lower(): v for k, v in obj.items() if k.lower() in _KNOWN}


_KNOWN = {
    "pod",
    "nodes",
    "nodenames",
    "podname",
    "podnamespace",
    "poduid",
    "node",
    "nodenametovictims",
    "nodenametometavictims",
}


def _key(key: str) -> str:
    """A client-chosen map key for a field path: cut to :data:`MAX_KEY_CHARS`."""
    return key if len(key) <= MAX_KEY_CHARS else f"{key[:MAX_KEY_CHARS]}…"


def _type(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


@dataclass
class ExtenderArgs:
    """``ExtenderArgs``: the pod and the candidate nodes, by name (cache-capable) or as objects."""

    pod: dict[str, Any]
    node_names: list[str]
    node_items: list[dict[str, Any]] | None
    """The v1.Node objects in full-node mode (echoed back for the kept nodes); None when cache-capable."""

    @property
    def cache_capable(self) -> bool:
        return self.node_items is None


def extender_args(body: Any) -> ExtenderArgs:
    """Filter/prioritize arguments."""
    f = _fields(body, "body")
    pod = f.get("pod")
    if pod is None:
        raise BadRequest("Pod", "is required: the v1.Pod being scheduled")
    if not isinstance(pod, dict):
        raise BadRequest("Pod", f"expected a v1.Pod object, got {_type(pod)}")
    nodes = f.get("nodes")
    if nodes is not None:
        if not isinstance(nodes, dict):
            raise BadRequest("Nodes", f"expected a v1.NodeList object, got {_type(nodes)}")
        items = nodes.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items", f"expected a list of v1.Node, got {_type(items)}")
        names: list[str] = []
        for i, item in enumerate(items):
            meta = item.get("metadata") if isinstance(item, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"Nodes.items[{i}].metadata.name", "expected a node name")
            names.append(name)
        return ExtenderArgs(pod, names, items)
    node_names = f.get("nodenames")
    if node_names is None:
        raise BadRequest(
            "NodeNames", "either NodeNames (nodeCacheCapable: true) or Nodes (nodeCacheCapable: false) is required"
        )
    if not isinstance(node_names, list):
        raise BadRequest("NodeNames", f"expected a list of node names, got {_type(node_names)}")
    if set(map(type, node_names)) - {str} or "" in node_names:  # C-speed check; find the culprit only when needed
        for i, name in enumerate(node_names):
            if not isinstance(name, str) or not name:
                raise BadRequest(f"NodeNames[{i}]", f"expected a node name, got {_type(name)}")
    return ExtenderArgs(pod, node_names, None)


@dataclass
class BindingArgs:
    """``ExtenderBindingArgs``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def binding_args(body: Any) -> BindingArgs:
    f = _fields(body, "body")
    out = {}
    for key, name in (("podname", "PodName"), ("podnamespace", "PodNamespace"), ("poduid", "PodUID"), ("node", "Node")):
        value = f.get(key)
        if not isinstance(value, str) or not value:
            raise BadRequest(
                name,
                "is required (a non-empty string)" if value in (None, "") else f"expected a string, got {_type(value)}",
            )
        out[key] = value
    return BindingArgs(out["podname"], out["podnamespace"], out["poduid"], out["node"])


@dataclass
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: per candidate node, the victims' UIDs and PDB violations."""

    pod: dict[str, Any]
    victims: dict[str, tuple[list[str], int]]
    """node → (victim UIDs, NumPDBViolations), from MetaVictims or (full mode) the victim pods."""


def preemption_args(body: Any) -> PreemptionArgs:
    f = _fields(body, "body")
    pod = f.get("pod")
    if pod is None:
        raise BadRequest("Pod", "is required: the v1.Pod that wants to preempt")
    if not isinstance(pod, dict):
        raise BadRequest("Pod", f"expected a v1.Pod object, got {_type(pod)}")
    victims: dict[str, tuple[list[str], int]] = {}
    total = 0
    for key, field, full in (
        ("nodenametometavictims", "NodeNameToMetaVictims", False),
        ("nodenametovictims", "NodeNameToVictims", True),
    ):
        mapping = f.get(key)
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise BadRequest(field, f"expected an object keyed by node name, got {_type(mapping)}")
        for node, v in mapping.items():
            where = f"{field}.{_key(node)}"
            if v is None:
                victims[node] = ([], 0)
                continue
            if not isinstance(v, dict):
                raise BadRequest(where, f"expected an object with Pods and NumPDBViolations, got {_type(v)}")
            vf = {k.lower(): val for k, val in v.items()}
            pods = vf.get("pods") or []
            if not isinstance(pods, list):
                raise BadRequest(f"{where}.Pods", f"expected a list, got {_type(pods)}")
            total += len(pods)
            if len(pods) > MAX_VICTIMS_PER_NODE or total > MAX_VICTIMS:
                raise BadRequest(
                    f"{where}.Pods",
                    f"{len(pods)} victims on this node ({total} so far); at most {MAX_VICTIMS_PER_NODE} per node "
                    f"and {MAX_VICTIMS} in all",
                )
            uids = []
            for i, p in enumerate(pods):
                if not isinstance(p, dict):
                    raise BadRequest(f"{where}.Pods[{i}]", f"expected an object, got {_type(p)}")
                if full:
                    meta = p.get("metadata")
                    uid = meta.get("uid") if isinstance(meta, dict) else None
                else:
                    uid = {k.lower(): val for k, val in p.items()}.get("uid")
                if not isinstance(uid, str) or not uid:
                    raise BadRequest(
                        f"{where}.Pods[{i}]" + (".metadata.uid" if full else ".UID"), "expected the victim's UID"
                    )
                uids.append(uid)
            pdb = vf.get("numpdbviolations", 0) or 0
            if not isinstance(pdb, int) or isinstance(pdb, bool):
                raise BadRequest(f"{where}.NumPDBViolations", f"expected an integer, got {_type(pdb)}")
            if not 0 <= pdb < 2**63:  # echoed back: kube-scheduler reads it as an int64 count
                raise BadRequest(f"{where}.NumPDBViolations", f"expected a count from 0 to 2^63-1, got {pdb}")
            victims[node] = (uids, pdb)
    return PreemptionArgs(pod, victims)


def dumps(obj: Any) -> bytes:
    """Responses: orjson (numpy ints/floats serialized natively)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def error_body(message: str) -> bytes:
    return dumps({"Error": message})
