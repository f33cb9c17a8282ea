"""How a spec's problems echo what they were given: bounded, whatever the spec holds.

The problems of a SchedulingPolicy (or objective) spec become a condition, an event and kopf's progress
annotation, so a spec full of junk must not make them as large as itself."""

from __future__ import annotations

from typing import Any

MAX_SHOWN_CHARS = 64
"""A value or key echoed in a problem is cut to this length."""
MAX_UNKNOWN = 10
"""At most this many unknown keys are listed per object."""


def shown(value: Any) -> str:
    """``value`` as a problem echoes it: its repr, cut to MAX_SHOWN_CHARS."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 1] + "…"


def unknown_keys(keys: Any) -> list[str]:
    """The first MAX_UNKNOWN of ``keys`` (any type), sorted, each cut to MAX_SHOWN_CHARS."""
    return [str(key)[:MAX_SHOWN_CHARS] for key in sorted(keys, key=str)[:MAX_UNKNOWN]]
