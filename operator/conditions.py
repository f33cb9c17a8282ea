"""Status conditions (``Ready``, ``Degraded``) in the Kubernetes convention.

``lastTransitionTime`` changes only when a condition's status flips, so ``kubectl wait
--for=condition=Ready`` and dashboards see real transitions, not every refresh.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any


def now_iso(clock_s: float | None = None) -> str:
    t = dt.datetime.now(dt.UTC) if clock_s is None else dt.datetime.fromtimestamp(clock_s, dt.UTC)
    return t.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def condition(
    type_: str, status: bool | None, reason: str, message: str, generation: int | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": type_,
        "status": "Unknown" if status is None else ("True" if status else "False"),
        "reason": reason,
        "message": message[:32000],
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge_conditions(
    current: Iterable[Mapping[str, Any]] | None, updates: Iterable[dict[str, Any]], now: str | None = None
) -> list[dict[str, Any]]:
    """``current`` with ``updates`` applied by type; transition times kept unless the status flips."""
    now = now or now_iso()
    by_type = {c.get("type"): dict(c) for c in current or [] if c.get("type")}
    for u in updates:
        old = by_type.get(u["type"])
        new = dict(u)
        new["lastTransitionTime"] = (
            old["lastTransitionTime"]
            if old and old.get("status") == u["status"] and old.get("lastTransitionTime")
            else now
        )
        by_type[u["type"]] = new
    order = {"Ready": 0, "Degraded": 1}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], 9), c["type"]))


def get_condition(status: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None
