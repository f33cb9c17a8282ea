"""Objects the watch could not use: logged once, counted, and never allowed to stop the watch.

Any exception while reading one object (a malformed field, a quantity no parser should take, a bug
the next odd object finds) lands here instead of killing the informer. Each object *version* (UID and
resourceVersion) is logged once — a relist or a resent event does not repeat it — and counted in
``rlsched_extender_objects_rejected_total{kind,reason}`` (objects without a name or UID cannot be
told apart: they are counted every time, logged once). A new resourceVersion that changes nothing the
cache reads (a heartbeat of an unreadable node) does not reach here at all: the cache keeps the digest
of each rejected node's and pod's version and skips it (:mod:`.cache`), so the count is one per change
of what is read, not one per event. The ``reason`` is one of :data:`REASONS`
(a label value must be a small fixed set, not free text; the log line carries the detail).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .node_rules import RuleError
from .objects import ObjectError, PodRequestError

log = logging.getLogger("rlsched.extender.cache")

REASONS = ("quantity", "field", "placement-rules", "gpu-request", "event", "unexpected")
"""quantity: a resource amount that cannot be read; field: another malformed field (wrong type, missing
name); placement-rules: taints/tolerations/selector/affinity; gpu-request: a bound pod whose GPU request
makes no sense (whole cards and a share, …; counted as the whole cards it may hold); event: a watch
event that is not an object; unexpected: any other exception (a bug: the log line has the type)."""

_QUANTITY_PARTS = (".resources", ".overhead", ".allocatable", ".capacity")


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason, field) for an exception raised while reading an object."""
    if isinstance(exc, RuleError):
        return "placement-rules", exc.field
    if isinstance(exc, PodRequestError):
        return "gpu-request", ""
    if isinstance(exc, ObjectError):
        return ("quantity" if any(p in exc.field for p in _QUANTITY_PARTS) else "field"), exc.field
    return "unexpected", ""


def describe(exc: BaseException, limit: int = 300) -> str:
    """A bounded one-line text of ``exc`` (never a 5,000-digit number in a log line)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - str() itself can fail (int → str over 4,300 digits)
        text = ""
    text = text.replace("\n", " ")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def short_reason(exc: BaseException, limit: int = 200) -> str:
    """Why an object could not be read, for an answer to a client: the message of a malformed field
    (it names the field), else :func:`describe`; bounded."""
    if isinstance(exc, (ObjectError, RuleError)):
        text = describe(exc, limit)
        return text.split(": ", 1)[1] if ": " in text else text
    return describe(exc, limit)


def identity(obj: Any) -> tuple[str, str, str, str]:
    """(namespace, name, uid, resourceVersion) of an object, "" where unreadable; each cut to 253
    characters. The watch's DELETED events and relists key objects with this, so the readers in
    :mod:`.objects` refuse what would be read otherwise here: a pod without a UID (no stand-in key),
    a node name or pod UID longer than the cut."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "", "", "", ""

    def s(key: str) -> str:
        v = meta.get(key)
        return v[:253] if isinstance(v, str) else ""

    return s("namespace"), s("name"), s("uid"), s("resourceVersion")


class Rejections:
    """Log-once-per-object-version and count (bounded memory: the last ``size`` versions)."""

    def __init__(self, count: Callable[[str, str], None] | None = None, size: int = 4096):
        self.count = count or (lambda kind, reason: None)
        """(kind, reason) → None: the Prometheus counter's ``labels(kind, reason).inc``."""
        self.size = size
        self._seen: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        self.totals: dict[str, int] = {}
        """``kind/reason`` → count, for /status."""

    def reject(self, kind: str, obj: Any, exc: BaseException, action: str = "ignored") -> bool:
        """Record that ``obj`` (a ``kind``) could not be used; True when this version is new (logged)."""
        reason, field = classify(exc)
        ns, name, uid, rv = identity(obj)
        key = (kind, uid or f"{ns}/{name}", rv, reason)
        seen = key in self._seen
        anonymous = not (uid or name)
        if seen and not anonymous:
            self._seen.move_to_end(key)
            return False
        self.totals[f"{kind}/{reason}"] = self.totals.get(f"{kind}/{reason}", 0) + 1
        try:
            self.count(kind, reason)  # every time for objects without a name: nothing to tell them apart
        except Exception:  # noqa: BLE001 - a metrics problem must not become the watch's problem
            log.exception("counting a rejected %s failed", kind)
        if seen:
            return False
        self._seen[key] = None
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        ref = f"{ns}/{name}" if ns else name or "<unnamed>"
        log.warning(
            "%s %s (uid %s, resourceVersion %s) %s: %s%s",
            kind,
            ref,
            uid or "?",
            rv or "?",
            action,
            f"{field}: " if field and field not in str(exc) else "",
            describe(exc),
            extra={
                "event": "object_rejected",
                "kind": kind,
                "object": ref,
                "uid": uid,
                "resourceVersion": rv,
                "field": field,
                "reason": reason,
            },
        )
        return True
