"""Object names checked before they go anywhere near an API path.

kube-apiserver stores pods and nodes only under DNS-1123 subdomain names and namespaces only under
DNS-1123 labels (apimachinery's ``IsDNS1123Subdomain`` / ``IsDNS1123Label``), so a name that fails
these rules cannot name an object: it is refused here, before a URL is built, instead of being sent
(``../../../nodes/X`` in a bind's PodName once made the extender GET a Node). The paths are
URL-quoted as well (:mod:`rlsched.extender.kubeapi`) — two independent fences.

The checks are bounded: the length is tested before the (linear, anchored) pattern runs, and the
message never repeats more than a short prefix of what it got.
"""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253

_LABEL = "[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


class InvalidName(ValueError):
    """A name that no Kubernetes object can have; ``field`` names where it came from."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


def _dns_problem(name: object, max_len: int, pattern: re.Pattern[str], what: str) -> str | None:
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > max_len:
        return f"must be at most {max_len} characters (got {len(name)})"
    if not name.isascii() or pattern.fullmatch(name) is None:
        return f"{_shown(name)} is not a DNS-1123 {what}, starting and ending with a letter or digit)"
    return None


def subdomain_problem(name: object) -> str | None:
    """Why ``name`` is not a DNS-1123 subdomain (pod and node names), or None."""
    return _dns_problem(name, DNS1123_SUBDOMAIN_MAX, _SUBDOMAIN_RE, "subdomain (lowercase letters, digits, '-' and '.'")


def label_problem(name: object) -> str | None:
    """Why ``name`` is not a DNS-1123 label (namespaces), or None."""
    return _dns_problem(name, DNS1123_LABEL_MAX, _LABEL_RE, "label (lowercase letters, digits and '-'")


def check_pod_ref(
    namespace: object, name: object, namespace_field: str = "PodNamespace", name_field: str = "PodName"
) -> None:
    """Raise :class:`InvalidName` unless ``namespace``/``name`` can name a pod."""
    problem = label_problem(namespace)
    if problem:
        raise InvalidName(namespace_field, problem)
    problem = subdomain_problem(name)
    if problem:
        raise InvalidName(name_field, problem)


def check_node_name(name: object, field: str = "Node") -> None:
    """Raise :class:`InvalidName` unless ``name`` can name a node."""
    problem = subdomain_problem(name)
    if problem:
        raise InvalidName(field, problem)


UID_MAX = 128
"""Kubernetes UIDs are 36-character UUIDs; anything much longer is not one (the cap bounds the keys
bind's bookkeeping holds)."""


def check_uid(uid: object, field: str = "PodUID") -> None:
    """Raise :class:`InvalidName` unless ``uid`` could be an object's UID (printable ASCII, no spaces)."""
    if not isinstance(uid, str) or not uid:
        raise InvalidName(field, "must be a non-empty string")
    if len(uid) > UID_MAX:
        raise InvalidName(field, f"must be at most {UID_MAX} characters (got {len(uid)})")
    if not (uid.isascii() and uid.isprintable()) or " " in uid:
        raise InvalidName(field, f"{_shown(uid)} is not a UID (printable ASCII without spaces)")
