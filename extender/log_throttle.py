"""Log lines a client can cause, at most once per few seconds per kind.

A bad request, a refused token or a dropped connection is one line each; a client that repeats it
thousands of times a second must not fill the log (or the disk under it). Each kind of line is
written at most once per period, with the number left out since the last one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_KINDS = 1024
"""Kinds remembered; the table is emptied when full (kinds are fixed strings, a handful in use)."""


class EveryFewSeconds:
    """``throttle(kind)``: None (stay quiet), or the number of lines skipped since the last one (log now)."""

    def __init__(self, period_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.period_s, self.clock = period_s, clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, kind: str) -> int | None:
        now = self.clock()
        if now - self._last.get(kind, -1e18) < self.period_s:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return None
        if len(self._last) >= MAX_KINDS:
            self._last.clear()
        self._last[kind] = now
        return self._skipped.pop(kind, 0)


def skipped_note(skipped: int) -> str:
    """``"; N more since the last line"`` (empty for 0)."""
    return f"; {skipped} more since the last line" if skipped else ""
