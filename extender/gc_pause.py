"""Pause Python's cyclic garbage collector while a list is read and applied, or a verb decided.

Reading a list allocates millions of small objects (every page's JSON is parsed into dicts and
lists). Each allocation counts towards the collector's thresholds, so a relist sets off full
collections that walk every object the process holds: at 5,000 nodes and 20,000 pods one of them
held the event loop for 0.3–0.4 s, longer than applying the list itself
(``benchmarks/relist_hold.py``). A list creates no reference cycles (the parsed objects are freed by
reference counting once applied), so nothing is lost by not collecting while it runs; the young
objects that survive are collected once, after.

The verbs pause it too, while a request is parsed and decided (``app.make_app``): a full collection
in the middle of a filter was a latency spike the request did not cause.

The pause is the process's (``gc`` has one switch), so it is counted: two informers may relist while
verbs are served, and the collector comes back on when the last holder leaves. One instance is shared
by the whole process (``Service.gc_pause``); a collector that was already off stays off. A pause never lasts longer than
``max_s``: a list waits on the network between pages, and an API server that answers slowly must not
keep the collector off while requests go on making (cyclic) garbage.
"""

from __future__ import annotations

import asyncio
import gc
from types import TracebackType

MAX_GC_PAUSE_S = 30.0
"""The longest the collector stays off for one pause (a list of 20,000 pods takes a few seconds)."""


class GcPause:
    """A re-entrant ``with`` block that turns the cyclic collector off while any holder is inside, for
    at most ``max_s`` seconds (then it is back on until the last holder has left and a new pause
    begins)."""

    def __init__(self, max_s: float = MAX_GC_PAUSE_S) -> None:
        self.max_s = max_s
        self.holders = 0
        self.expired = 0
        """Pauses that reached ``max_s`` (the collector was turned back on early)."""
        self._was_enabled = False
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> GcPause:
        if self.holders == 0:
            self._was_enabled = gc.isenabled()
            gc.disable()
            try:
                self._timer = asyncio.get_running_loop().call_later(self.max_s, self._expire)
            except RuntimeError:  # no event loop: the holder's own block bounds it
                self._timer = None
        self.holders += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.holders -= 1
        if self.holders == 0:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._was_enabled:
                gc.enable()

    def _expire(self) -> None:
        """``max_s`` passed with holders inside: the collector goes back on now."""
        self._timer = None
        if self.holders and self._was_enabled and not gc.isenabled():
            self.expired += 1
            gc.enable()
